"""A layer's tail after the output product, in one launch: Triton kernel and torch twin.

    z     = bx + attn_gate · zc(a, post)                   the attention residual   [d]
    mo    = HadamardMLP(zc(z, pre_hada))                   kernels/hadamard_mlp.py  [d]
    y     = z + mo − u                                     the block's contribution (spec b.6)
    X'    = P · X + hpost ⊗ y                              the mHC merge into the lanes [n, d]

a is the output product of the attention, bx the block input (u plus the Engram injection), u
the lane mix, P / hpost the layer's routing (kernels/mhc_route.py), X the lanes before the layer
(any strides). attn_gate is a 0-d device tensor. The kernel holds d in the Hadamard tile and
walks the n lanes; the twin is the model's op order. Both return (X', y): y is stored by the
same launch (the trace's block output). `out=` takes X' in place of a fresh [n, d] buffer; it
must not overlap X, which every lane of X' reads.

The activations (a, bx, u, X, P, hpost) may be bfloat16 or float16 (kernels/narrow.py): the
arithmetic stays float32, the merge reads y as computed, and y and X' are rounded once to X's
dtype on their stores.
"""
from __future__ import annotations

import math

import torch

from .hadamard_mlp import _check as _check_mlp, hadamard_mlp_torch
from .narrow import act_code, act_of, is_act, narrow_torch, wide

try:
    import triton
    import triton.language as tl
    from .hadamard_mlp import _walsh_tile
    from .narrow import narrow
except ImportError:                        # pragma: no cover
    triton = None


class LayerTailError(ValueError):
    """Inputs that do not describe one layer's tail (names the argument and the rule)."""


def _check(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3):
    if not is_act(bx):
        raise LayerTailError(f"bx must be float32 [d] (or bfloat16/float16), got {bx.dtype}")
    # the MLP's shape rules on bx's shape (a meta tensor: nothing launched)
    d, n_h = _check_mlp(torch.empty(bx.shape, device="meta"), pre_hada, d1, d2, d3)
    if X.dim() != 2 or X.shape[1] != d or not is_act(X):
        raise LayerTailError(f"X must be float32 [n, d={d}] (or bfloat16/float16), got "
                             f"{X.dtype} {list(X.shape)}")
    n = X.shape[0]
    for name, t, shape in (("a", a, (d,)), ("u", u, (d,)), ("post", post, (d,)),
                           ("P", P, (n, n)), ("hpost", hpost, (n,)), ("attn_gate", attn_gate, ())):
        act_ok = is_act(t) if name in ("a", "u", "P", "hpost") else t.dtype == torch.float32
        if tuple(t.shape) != shape or not act_ok:
            raise LayerTailError(f"{name} must be float32 {list(shape)}, got {t.dtype} "
                                 f"{list(t.shape)}")
    act_of(a, bx, u, X, P, hpost)                 # one 16-bit dtype at most
    return n, d, n_h


def _span(t):
    """[first, last) byte addresses t's elements can occupy (host metadata, no device read)."""
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _check_out(out, X):
    if out is None:
        return
    n, d = X.shape
    if (tuple(out.shape) != (n, d) or out.dtype not in (torch.float32, X.dtype)
            or not out.is_contiguous() or out.device != X.device):
        raise LayerTailError(f"out must be a contiguous float32 [{n}, {d}] (or X's dtype) on "
                             f"{X.device}, got "
                             f"{out.dtype} {list(out.shape)} stride {out.stride()} on "
                             f"{out.device}")
    (o0, o1), (x0, x1) = _span(out), _span(X)
    # (meta tensors have no addresses: every span reads as starting at 0)
    if X.device.type != "meta" and o0 < x1 and x0 < o1:
        raise LayerTailError("out must not overlap X (every lane of X' reads all of X)")


def layer_tail_torch(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3,
                     eps: float = 1e-6, *, out=None):
    """-> (the new lanes X' [n, d], the block output y [d])."""
    _check(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3)
    _check_out(out, X)
    act = act_of(a, bx, u, X, P, hpost)
    if act != torch.float32:
        new, y = layer_tail_torch(*(wide(t) for t in (a, bx, u, X, P, hpost)), post, attn_gate,
                                  pre_hada, d1, d2, d3, eps)
        new = narrow_torch(new, act)
        return (new if out is None else out.copy_(new)), narrow_torch(y, act)
    ap = (1.0 + post) * a / torch.sqrt((a * a).mean(-1, keepdim=True) + eps)
    z = bx + attn_gate * ap
    y = z + hadamard_mlp_torch(z, pre_hada, d1, d2, d3, eps) - u
    new = P @ X + hpost[:, None] * y[None, :]
    return (new if out is None else out.copy_(new)), y


if triton is not None:
    @triton.jit
    def _zc_tile(x, g, d, eps):
        ms = tl.sum(tl.sum(x * x, 1), 0) / d + eps
        return (1.0 + g) * x / tl.sqrt(ms)

    @triton.jit
    def _ld(p, idx, real):
        return tl.load(p + idx, mask=real, other=0.0).to(tl.float32)

    @triton.jit
    def _layer_tail_kernel(a_ptr, bx_ptr, u_ptr, x_ptr, p_ptr, hp_ptr, post_ptr, ag_ptr,
                           ph_ptr, d1_ptr, d2_ptr, d3_ptr, out_ptr, y_ptr, n, d, sx0, sx1, eps,
                           scale, A: tl.constexpr, B: tl.constexpr, ACT: tl.constexpr):
        idx = tl.arange(0, A)[:, None] * B + tl.arange(0, B)[None, :]
        real = idx < d
        z = _ld(bx_ptr, idx, real) + tl.load(ag_ptr) * _zc_tile(
            _ld(a_ptr, idx, real), _ld(post_ptr, idx, real), d, eps)
        t = _zc_tile(z, _ld(ph_ptr, idx, real), d, eps)
        t = _walsh_tile(tl.load(d1_ptr + idx) * t, A, B) * scale
        t = tl.load(d2_ptr + idx) * t
        t = t * tl.sigmoid(t)
        mo = tl.load(d3_ptr + idx) * (_walsh_tile(t, A, B) * scale)
        y = tl.where(real, z + mo - _ld(u_ptr, idx, real), 0.0)
        tl.store(y_ptr + idx, narrow(y, ACT), mask=real)
        for lane in range(0, n):
            acc = tl.zeros((A, B), tl.float32)
            for k in range(0, n):
                acc += tl.load(p_ptr + lane * n + k).to(tl.float32) * tl.load(
                    x_ptr + k * sx0 + idx * sx1, mask=real, other=0.0).to(tl.float32)
            tl.store(out_ptr + lane * d + idx,
                     narrow(acc + tl.load(hp_ptr + lane).to(tl.float32) * y, ACT), mask=real)


def layer_tail_triton(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3,
                      eps: float = 1e-6, *, out=None):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    n, d, n_h = _check(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3)
    _check_out(out, X)
    vecs = [t.contiguous() for t in (a, bx, u, P, hpost, post, pre_hada, d1, d2, d3)]  # no-ops
    a, bx, u, P, hpost, post, pre_hada, d1, d2, d3 = vecs
    act = act_of(a, bx, u, X, P, hpost)
    out = torch.empty(n, d, dtype=act, device=X.device) if out is None else out
    y = torch.empty(d, dtype=act, device=X.device)
    rows = 1 << (n_h.bit_length() - 1) // 2
    _layer_tail_kernel[(1,)](a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3, out,
                             y, n, d, X.stride(0), X.stride(1), eps, 1.0 / math.sqrt(n_h),
                             A=rows, B=n_h // rows, ACT=act_code(act))
    return out, y
