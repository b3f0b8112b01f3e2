"""After one token's q|k|v|gate product: the q/k norms, RoPE, the gate and the ring write, in one
launch. Triton kernel and torch twin.

    q     = rope(zc(q_h, qn))      per head h < H      (zc over hd, gain [hd])
    k     = rope(zc(k_h, kn))      per head h < KV
    gate  = sigmoid(gate)
    ring_k[:, slot] = k,  ring_v[:, slot] = v          (one layer's ring [KV, R, hd], in place)

RoPE is the rotate-half form: with a, b the two halves of a head, [a·cos − b·sin, b·cos + a·sin],
cos/sin the rows of the tables at the position. The position and the ring slot are read from
int64 device buffers [1] (the graph body's static buffers), never on the host: capturable.
Returns q [H, hd], k [KV, hd], v [KV, hd], gate [H·hd] as views of one buffer laid out as the
input (q | k | v | gate).

qkvg and the rings may be bfloat16 or float16 (kernels/narrow.py): the norms, RoPE and sigmoid
run in float32 and each result is rounded once to qkvg's dtype, the ring receiving the rounded k
and v that the outputs hold.
"""
from __future__ import annotations

import torch

from .narrow import act_code, is_act, narrow_torch, wide

try:
    import triton
    import triton.language as tl
    from .narrow import narrow
except ImportError:                        # pragma: no cover
    triton = None


class QkRopeRingError(ValueError):
    """Inputs that do not describe one token's attention prelude (names argument and rule)."""


def _check(qkvg, qn, kn, cos, sin, pos, slot, k_ring, v_ring, H, KV):
    if (k_ring.dim() != 3 or k_ring.shape != v_ring.shape or not is_act(k_ring)
            or v_ring.dtype != k_ring.dtype):
        raise QkRopeRingError(f"k_ring/v_ring must be equal float32 [KV, R, hd] (or both "
                              f"bfloat16/float16), got {list(k_ring.shape)}, "
                              f"{list(v_ring.shape)}")
    kv, _, hd = k_ring.shape
    if kv != KV or H < 1 or H % KV or hd % 2:
        raise QkRopeRingError(f"H={H}, KV={KV}, ring heads {kv}, hd={hd}: need KV = ring heads,"
                              f" H a multiple of KV, hd even")
    n = 2 * H * hd + 2 * KV * hd
    if qkvg.shape != (n,) or not is_act(qkvg):
        raise QkRopeRingError(f"qkvg must be float32 [2·H·hd + 2·KV·hd] = [{n}] (or "
                              f"bfloat16/float16), got {qkvg.dtype} {list(qkvg.shape)}")
    for name, t in (("qn", qn), ("kn", kn)):
        if t.shape != (hd,) or t.dtype != torch.float32:
            raise QkRopeRingError(f"{name} must be float32 [{hd}], got {list(t.shape)}")
    if cos.dim() != 2 or cos.shape[1] != hd // 2 or cos.shape != sin.shape:
        raise QkRopeRingError(f"cos/sin must be equal [positions, hd/2={hd // 2}], got "
                              f"{list(cos.shape)}, {list(sin.shape)}")
    for name, t in (("pos", pos), ("slot", slot)):
        if t.shape != (1,) or t.dtype != torch.int64:
            raise QkRopeRingError(f"{name} must be an int64 device buffer [1], got {t.dtype} "
                                  f"{list(t.shape)}")
    return hd


def _zc(x, g, eps):
    return (1.0 + g) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps)


def _rope(x, c, s):
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * c - b * s, b * c + a * s], -1)


def qk_rope_ring_torch(qkvg, qn, kn, cos, sin, pos, slot, k_ring, v_ring, H: int, KV: int,
                       eps: float = 1e-6):
    hd = _check(qkvg, qn, kn, cos, sin, pos, slot, k_ring, v_ring, H, KV)
    attn, kvd = H * hd, KV * hd
    act, qkvg = qkvg.dtype, wide(qkvg)
    c, s = cos.index_select(0, pos), sin.index_select(0, pos)          # [1, hd/2]
    q = _rope(_zc(qkvg[:attn].view(H, hd), qn, eps), c, s)
    k = _rope(_zc(qkvg[attn:attn + kvd].view(KV, hd), kn, eps), c, s)
    v = qkvg[attn + kvd:attn + 2 * kvd].view(KV, hd)
    gate = torch.sigmoid(qkvg[attn + 2 * kvd:])
    if act != torch.float32:
        q, k, v, gate = (narrow_torch(t, act) for t in (q, k, v, gate))
    k_ring.index_copy_(1, slot, k[:, None, :].to(k_ring.dtype))
    v_ring.index_copy_(1, slot, v[:, None, :].to(v_ring.dtype))
    out = torch.cat([q.reshape(-1), k.reshape(-1), v.reshape(-1), gate])
    return _views(out, H, KV, hd)


def _views(out, H, KV, hd):
    attn, kvd = H * hd, KV * hd
    return (out[:attn].view(H, hd), out[attn:attn + kvd].view(KV, hd),
            out[attn + kvd:attn + 2 * kvd].view(KV, hd), out[attn + 2 * kvd:])


if triton is not None:
    @triton.jit
    def _norm_rope(x_ptr, g_ptr, heads, hd, half, c, s, eps, HP: tl.constexpr,
                   HALFP: tl.constexpr, ACT: tl.constexpr):
        """Rows 0..heads-1 of x [heads, hd]: zc over each row, then rotate-half RoPE, rounded
        to the activation dtype."""
        h = tl.arange(0, HP)[:, None]
        j = tl.arange(0, HALFP)[None, :]
        m = (h < heads) & (j < half)
        a = tl.load(x_ptr + h * hd + j, mask=m, other=0.0).to(tl.float32)
        b = tl.load(x_ptr + h * hd + half + j, mask=m, other=0.0).to(tl.float32)
        ms = (tl.sum(a * a, 1) + tl.sum(b * b, 1)) / hd + eps
        r = tl.sqrt(ms)[:, None]
        a = (1.0 + tl.load(g_ptr + j, mask=j < half, other=0.0)) * a / r
        b = (1.0 + tl.load(g_ptr + half + j, mask=j < half, other=0.0)) * b / r
        return narrow(a * c - b * s, ACT), narrow(b * c + a * s, ACT), h, j, m

    @triton.jit
    def _qk_rope_ring_kernel(x_ptr, qn_ptr, kn_ptr, cos_ptr, sin_ptr, pos_ptr, slot_ptr,
                             kr_ptr, vr_ptr, out_ptr, H, KV, hd, half, sr0, sr1, sr2, eps,
                             HP: tl.constexpr, HALFP: tl.constexpr, BLOCK_G: tl.constexpr,
                             ACT: tl.constexpr):
        pos = tl.load(pos_ptr)
        slot = tl.load(slot_ptr)
        jj = tl.arange(0, HALFP)[None, :]
        c = tl.load(cos_ptr + pos * half + jj, mask=jj < half, other=0.0)
        s = tl.load(sin_ptr + pos * half + jj, mask=jj < half, other=0.0)
        attn, kvd = H * hd, KV * hd

        a, b, h, j, m = _norm_rope(x_ptr, qn_ptr, H, hd, half, c, s, eps, HP, HALFP, ACT)
        tl.store(out_ptr + h * hd + j, a, mask=m)
        tl.store(out_ptr + h * hd + half + j, b, mask=m)

        a, b, h, j, m = _norm_rope(x_ptr + attn, kn_ptr, KV, hd, half, c, s, eps, HP, HALFP,
                                   ACT)
        tl.store(out_ptr + attn + h * hd + j, a, mask=m)
        tl.store(out_ptr + attn + h * hd + half + j, b, mask=m)
        ring = h * sr0 + slot * sr1
        tl.store(kr_ptr + ring + j * sr2, a, mask=m)
        tl.store(kr_ptr + ring + (half + j) * sr2, b, mask=m)

        va = tl.load(x_ptr + attn + kvd + h * hd + j, mask=m, other=0.0)
        vb = tl.load(x_ptr + attn + kvd + h * hd + half + j, mask=m, other=0.0)
        tl.store(out_ptr + attn + kvd + h * hd + j, va, mask=m)
        tl.store(out_ptr + attn + kvd + h * hd + half + j, vb, mask=m)
        tl.store(vr_ptr + ring + j * sr2, va, mask=m)
        tl.store(vr_ptr + ring + (half + j) * sr2, vb, mask=m)

        base = attn + 2 * kvd
        for g0 in range(0, attn, BLOCK_G):
            g = g0 + tl.arange(0, BLOCK_G)
            x = tl.load(x_ptr + base + g, mask=g < attn, other=0.0)
            tl.store(out_ptr + base + g, narrow(tl.sigmoid(x.to(tl.float32)), ACT),
                     mask=g < attn)


def qk_rope_ring_triton(qkvg, qn, kn, cos, sin, pos, slot, k_ring, v_ring, H: int, KV: int,
                        eps: float = 1e-6):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    hd = _check(qkvg, qn, kn, cos, sin, pos, slot, k_ring, v_ring, H, KV)
    if k_ring.stride() != v_ring.stride():
        raise QkRopeRingError(f"k_ring and v_ring strides differ: {k_ring.stride()} vs "
                              f"{v_ring.stride()}")
    out = torch.empty_like(qkvg)
    qkvg, qn, kn, cos, sin = (t.contiguous() for t in (qkvg, qn, kn, cos, sin))   # no-ops
    _qk_rope_ring_kernel[(1,)](
        qkvg, qn, kn, cos, sin, pos, slot, k_ring, v_ring, out, H, KV, hd, hd // 2,
        *k_ring.stride(), eps, HP=triton.next_power_of_2(H),
        HALFP=triton.next_power_of_2(hd // 2), BLOCK_G=256, ACT=act_code(qkvg.dtype))
    return _views(out, H, KV, hd)
