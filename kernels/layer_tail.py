"""A layer's tail after the output product, in one launch: Triton kernel and torch twin.

    z     = bx + attn_gate · zc(a, post)                   the attention residual   [d]
    mo    = HadamardMLP(zc(z, pre_hada))                   kernels/hadamard_mlp.py  [d]
    y     = z + mo − u                                     the block's contribution (spec b.6)
    X'    = P · X + hpost ⊗ y                              the mHC merge into the lanes [n, d]

a is the output product of the attention, bx the block input (u plus the Engram injection), u
the lane mix, P / hpost the layer's routing (kernels/mhc_route.py), X the lanes before the layer
(any strides). attn_gate is a 0-d device tensor. The kernel holds d in the Hadamard tile and
walks the n lanes; the twin is the model's op order.
"""
from __future__ import annotations

import math

import torch

from .hadamard_mlp import _check as _check_mlp, hadamard_mlp_torch

try:
    import triton
    import triton.language as tl
    from .hadamard_mlp import _walsh_tile
except ImportError:                        # pragma: no cover
    triton = None


class LayerTailError(ValueError):
    """Inputs that do not describe one layer's tail (names the argument and the rule)."""


def _check(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3):
    d, n_h = _check_mlp(bx, pre_hada, d1, d2, d3)
    if X.dim() != 2 or X.shape[1] != d or X.dtype != torch.float32:
        raise LayerTailError(f"X must be float32 [n, d={d}], got {X.dtype} {list(X.shape)}")
    n = X.shape[0]
    for name, t, shape in (("a", a, (d,)), ("u", u, (d,)), ("post", post, (d,)),
                           ("P", P, (n, n)), ("hpost", hpost, (n,)), ("attn_gate", attn_gate, ())):
        if tuple(t.shape) != shape or t.dtype != torch.float32:
            raise LayerTailError(f"{name} must be float32 {list(shape)}, got {t.dtype} "
                                 f"{list(t.shape)}")
    return n, d, n_h


def layer_tail_torch(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3,
                     eps: float = 1e-6):
    """-> the new lanes X' [n, d]."""
    _check(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3)
    ap = (1.0 + post) * a / torch.sqrt((a * a).mean(-1, keepdim=True) + eps)
    z = bx + attn_gate * ap
    y = z + hadamard_mlp_torch(z, pre_hada, d1, d2, d3, eps) - u
    return P @ X + hpost[:, None] * y[None, :]


if triton is not None:
    @triton.jit
    def _zc_tile(x, g, d, eps):
        ms = tl.sum(tl.sum(x * x, 1), 0) / d + eps
        return (1.0 + g) * x / tl.sqrt(ms)

    @triton.jit
    def _ld(p, idx, real):
        return tl.load(p + idx, mask=real, other=0.0)

    @triton.jit
    def _layer_tail_kernel(a_ptr, bx_ptr, u_ptr, x_ptr, p_ptr, hp_ptr, post_ptr, ag_ptr,
                           ph_ptr, d1_ptr, d2_ptr, d3_ptr, out_ptr, n, d, sx0, sx1, eps, scale,
                           A: tl.constexpr, B: tl.constexpr):
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
        for lane in range(0, n):
            acc = tl.zeros((A, B), tl.float32)
            for k in range(0, n):
                acc += tl.load(p_ptr + lane * n + k) * tl.load(x_ptr + k * sx0 + idx * sx1,
                                                               mask=real, other=0.0)
            tl.store(out_ptr + lane * d + idx, acc + tl.load(hp_ptr + lane) * y, mask=real)


def layer_tail_triton(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3,
                      eps: float = 1e-6):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    n, d, n_h = _check(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3)
    vecs = [t.contiguous() for t in (a, bx, u, P, hpost, post, pre_hada, d1, d2, d3)]  # no-ops
    a, bx, u, P, hpost, post, pre_hada, d1, d2, d3 = vecs
    out = torch.empty(n, d, dtype=torch.float32, device=X.device)
    rows = 1 << (n_h.bit_length() - 1) // 2
    _layer_tail_kernel[(1,)](a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3, out,
                             n, d, X.stride(0), X.stride(1), eps, 1.0 / math.sqrt(n_h),
                             A=rows, B=n_h // rows)
    return out
