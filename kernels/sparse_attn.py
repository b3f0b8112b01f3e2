"""Sparse attention over a `-1`-padded selection, as a Triton kernel and its torch twin.

    o[t, h] = Σ_j softmax_j(s)·v[idx[t, j], h // rep],  s_j = (q[t, h]·k[idx[t, j], h // rep])·scale

over the selected rows only (`-1` = absent), with an optional per-head sink logit that enters the
denominator and nothing else; a query with nothing selected gets zeros, never NaN.

Both implementations walk the selection in tiles of BLOCK entries with an online softmax, and
the selection is padded with `-1` to whole tiles first. A tile of absent entries then leaves the
running (max, sum, accumulator) unchanged bit for bit (rescale factor exp(0) = 1, added terms 0),
and padding the caller adds only appends such tiles or fills absent lanes the implementation
would have masked anyway: appending `-1` entries changes no bit of the result. That is what lets
a graph-captured decode step use one fixed selection width for every position.

q, k_rows and v_rows may be bfloat16 or float16 (kernels/narrow.py): the scores, softmax and
accumulator stay float32 and the output is rounded once to q's dtype (the twin likewise).
"""
from __future__ import annotations

import math

import torch

from .narrow import ACT_DTYPES, act_code, narrow_torch, wide

BLOCK = 16

try:                                       # the torch twin works without Triton
    import triton
    import triton.language as tl
    from .narrow import narrow
except ImportError:                        # pragma: no cover - platforms without wheels
    triton = None


class SparseAttnError(ValueError):
    """Inputs sparse_attn cannot take (names the argument, its shape and the rule)."""


def _check(q, k_rows, v_rows, idx, sink):
    if q.dim() != 3 or k_rows.dim() != 3 or k_rows.shape != v_rows.shape:
        raise SparseAttnError(f"q must be [T, H, D] and k_rows/v_rows equal [N, KV, D]; got "
                              f"{list(q.shape)}, {list(k_rows.shape)}, {list(v_rows.shape)}")
    T, H, D = q.shape
    N, KV, Dk = k_rows.shape
    if Dk != D or H % KV:
        raise SparseAttnError(f"head_dim {D} vs {Dk}, or H={H} not a multiple of KV={KV}")
    if idx.dim() != 2 or idx.shape[0] != T or idx.dtype not in (torch.int32, torch.int64):
        raise SparseAttnError(f"idx must be integer [T={T}, K], got {idx.dtype} "
                              f"{list(idx.shape)}")
    if sink is not None and tuple(sink.shape) != (H,):
        raise SparseAttnError(f"sink must be [H={H}], got {list(sink.shape)}")


def _padded(idx, block: int):
    """idx as int64 in whole tiles of `block` (-1 appended); the same tensor, no op launched,
    when it already is (a graph-captured body passes a fixed, tile-aligned selection)."""
    K = idx.shape[1]
    width = max(1, -(-K // block)) * block
    idx = idx.to(torch.int64)
    return idx if width == K else torch.nn.functional.pad(idx, (0, width - K), value=-1)


def _unit_rows(x):
    """An activation dtype (float32 otherwise) with unit stride along the last dim; copied only
    when it is not (the kernel takes the other strides as arguments)."""
    x = x if x.dtype in ACT_DTYPES else x.to(torch.float32)
    return x if x.stride(-1) == 1 else x.contiguous()


def sparse_attn_torch(q, k_rows, v_rows, idx, scale: float, sink=None, block: int = BLOCK):
    """The torch twin. Rows of idx >= N are the caller's bug and raise IndexError."""
    _check(q, k_rows, v_rows, idx, sink)
    act = q.dtype if q.dtype in ACT_DTYPES[1:] else None
    q, k_rows, v_rows = (wide(t) if act else t for t in (q, k_rows, v_rows))
    T, H, D = q.shape
    KV = k_rows.shape[1]
    idx = _padded(idx, block)
    qg = q.reshape(T, KV, H // KV, D)
    m = torch.full((T, KV, H // KV), -torch.inf, dtype=q.dtype, device=q.device)
    l = torch.zeros_like(m)
    acc = torch.zeros_like(qg)
    for b0 in range(0, idx.shape[1], block):
        j = idx[:, b0:b0 + block]                                   # [T, B]
        valid = j >= 0
        jj = j.clamp_min(0)
        kb, vb = k_rows[jj], v_rows[jj]                             # [T, B, KV, D]
        s = torch.einsum("tgrd,tbgd->tgrb", qg, kb) * scale
        s = torch.where(valid[:, None, None, :], s, -torch.inf)
        m_new = torch.maximum(m, s.amax(-1))
        shift = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        alpha = torch.exp(m - shift)                                # 1 exactly if unchanged
        p = torch.exp(s - shift[..., None])                         # 0 for absent entries
        l = l * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.einsum("tgrb,tbgd->tgrd", p, vb)
        m = m_new
    if sink is not None:
        sk = sink.to(q.dtype).reshape(1, KV, H // KV)
        top = torch.maximum(m, sk)
        r = torch.exp(m - top)
        l = l * r + torch.exp(sk - top)
        acc = acc * r[..., None]
    o = torch.where(l[..., None] > 0, acc / torch.where(l > 0, l, 1.0)[..., None], 0.0)
    return o.reshape(T, H, D) if act is None else narrow_torch(o.reshape(T, H, D), act)


if triton is not None:
    @triton.jit
    def _sparse_attn_kernel(q_ptr, k_ptr, v_ptr, idx_ptr, sink_ptr, o_ptr, K, scale,
                            s_qt, s_qh, s_kn, s_kg, s_it, s_ot, s_oh,
                            REP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_K: tl.constexpr, HAS_SINK: tl.constexpr, ACT: tl.constexpr):
        t = tl.program_id(0)
        h = tl.program_id(1)
        g = h // REP
        d = tl.arange(0, BLOCK_D)
        dmask = d < D
        q = tl.load(q_ptr + t * s_qt + h * s_qh + d, mask=dmask, other=0.0).to(tl.float32)
        m = tl.full((), float("-inf"), tl.float32)
        l = tl.zeros((), tl.float32)
        acc = tl.zeros((BLOCK_D,), tl.float32)
        n_tiles = tl.maximum(tl.cdiv(K, BLOCK_K), 1)
        for b in range(0, n_tiles):
            offs = b * BLOCK_K + tl.arange(0, BLOCK_K)
            j = tl.load(idx_ptr + t * s_it + offs, mask=offs < K, other=-1).to(tl.int64)
            valid = j >= 0
            jj = tl.where(valid, j, 0)
            rows = jj[:, None] * s_kn + g * s_kg + d[None, :]
            lmask = valid[:, None] & dmask[None, :]
            kb = tl.load(k_ptr + rows, mask=lmask, other=0.0).to(tl.float32)
            vb = tl.load(v_ptr + rows, mask=lmask, other=0.0).to(tl.float32)
            s = tl.sum(kb * q[None, :], axis=1) * scale
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=0))
            shift = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp(m - shift)
            p = tl.exp(s - shift)
            l = l * alpha + tl.sum(p, axis=0)
            acc = acc * alpha + tl.sum(p[:, None] * vb, axis=0)
            m = m_new
        if HAS_SINK:
            sk = tl.load(sink_ptr + h).to(tl.float32)
            top = tl.maximum(m, sk)
            r = tl.exp(m - top)
            l = l * r + tl.exp(sk - top)
            acc = acc * r
        o = tl.where(l > 0, acc / tl.where(l > 0, l, 1.0), 0.0)
        tl.store(o_ptr + t * s_ot + h * s_oh + d, narrow(o, ACT), mask=dmask)


def sparse_attn_triton(q, k_rows, v_rows, idx, scale: float, sink=None, block: int = BLOCK):
    """The Triton kernel: one program per (query, head); the output in q's dtype (float32,
    bfloat16 or float16), float32 for any other. Inputs already in such a dtype with unit
    last-dim stride (k_rows and v_rows sharing strides, e.g. ring views
    [R, KV, hd] of [KV, R, hd]) and a tile-aligned int64 idx launch nothing but the kernel."""
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    _check(q, k_rows, v_rows, idx, sink)
    T, H, D = q.shape
    q, k_rows, v_rows = (_unit_rows(x) for x in (q, k_rows, v_rows))
    if k_rows.stride() != v_rows.stride():       # the kernel walks both with one set of strides
        k_rows, v_rows = k_rows.contiguous(), v_rows.contiguous()
    idx = _padded(idx, block)
    idx = idx if idx.stride(1) == 1 else idx.contiguous()
    out = torch.empty(T, H, D, dtype=q.dtype, device=q.device)
    has_sink = sink is not None
    sink_t = sink.to(torch.float32).contiguous() if has_sink else q   # unused when no sink
    _sparse_attn_kernel[(T, H)](q, k_rows, v_rows, idx, sink_t, out, idx.shape[1], float(scale),
                                q.stride(0), q.stride(1), k_rows.stride(0), k_rows.stride(1),
                                idx.stride(0), out.stride(0), out.stride(1),
                                REP=H // k_rows.shape[1], D=D,
                                BLOCK_D=triton.next_power_of_2(D), BLOCK_K=block,
                                HAS_SINK=has_sink, ACT=act_code(q.dtype))
    return out


def sparse_attn(q, k_rows, v_rows, idx, scale=None, sink=None, backend: str = "torch"):
    """Dispatch by backend ("torch" | "triton"); scale defaults to head_dim^-1/2."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if backend == "torch":
        return sparse_attn_torch(q, k_rows, v_rows, idx, scale, sink)
    if backend == "triton":
        return sparse_attn_triton(q, k_rows, v_rows, idx, scale, sink)
    raise SparseAttnError(f"backend={backend!r} is not 'torch' or 'triton'")
