"""The model's finish before the head, in one launch: Triton kernel and torch twin.

    mean   = X.mean(0)                                               [d]  the lane mean
    hidden = (1 + gain) · mean / sqrt(mean(mean²) + 1e-6)            [d]  the final ZC norm

X is the lanes [n, d] (any strides); hidden is written into the caller's buffer (the state's
hidden row, which the head reads), mean is returned (the trace's lane_mean). X may be float32,
bfloat16 or float16 (kernels/narrow.py): both results are rounded to X's dtype, mean returned in
it, hidden held in its buffer's dtype. The kernel is one
program: a first pass over d stores the mean and sums its squares, a second recomputes the mean
by the same code (the same bits) and writes hidden, so no program reads back its own stores.
"""
from __future__ import annotations

import torch

from .narrow import act_code, is_act, narrow_torch, wide

EPS = 1e-6

try:
    import triton
    import triton.language as tl
    from .narrow import narrow
except ImportError:                        # pragma: no cover
    triton = None


class FinalNormError(ValueError):
    """Inputs that do not describe the final norm (names the argument and the rule)."""


def _check(X, gain, hidden_out):
    if X.dim() != 2 or not is_act(X) or X.numel() == 0:
        raise FinalNormError(f"X must be non-empty float32 [n, d] (or bfloat16/float16), got "
                             f"{X.dtype} {list(X.shape)}")
    d = X.shape[1]
    for name, t in (("gain", gain), ("hidden_out", hidden_out)):
        ok_dtype = t.dtype == torch.float32 or (name == "hidden_out" and t.dtype == X.dtype)
        if tuple(t.shape) != (d,) or not ok_dtype or t.device != X.device:
            raise FinalNormError(f"{name} must be float32 [d={d}] on {X.device}, got "
                                 f"{t.dtype} {list(t.shape)} on {t.device}")


def final_norm_torch(X, gain, hidden_out, eps: float = EPS):
    """-> mean [d]; hidden_out <- the final norm of it (port/model.py's op order)."""
    _check(X, gain, hidden_out)
    act = X.dtype
    X = wide(X)
    mean = X.mean(0)
    if act == torch.float32:
        torch.mul(1.0 + gain, mean / torch.sqrt((mean * mean).mean() + eps), out=hidden_out)
        return mean
    narrow_torch((1.0 + gain) * (mean / torch.sqrt((mean * mean).mean() + eps)), act,
                 into=hidden_out)
    return narrow_torch(mean, act)


if triton is not None:
    @triton.jit
    def _lane_mean(x_ptr, n, d, sx0, sx1, j, N: tl.constexpr):
        i = tl.arange(0, N)
        x = tl.load(x_ptr + i[:, None] * sx0 + j[None, :] * sx1,
                    mask=(i[:, None] < n) & (j[None, :] < d), other=0.0).to(tl.float32)
        return tl.sum(x, 0) / n

    @triton.jit
    def _final_norm_kernel(x_ptr, g_ptr, h_ptr, m_ptr, n, d, sx0, sx1, sh, eps,
                           N: tl.constexpr, BLOCK_D: tl.constexpr, ACT: tl.constexpr):
        ss = tl.zeros((BLOCK_D,), tl.float32)
        for d0 in range(0, d, BLOCK_D):
            j = d0 + tl.arange(0, BLOCK_D)
            m = _lane_mean(x_ptr, n, d, sx0, sx1, j, N)
            tl.store(m_ptr + j, narrow(m, ACT), mask=j < d)
            ss += m * m
        rms = tl.sqrt(tl.sum(ss, 0) / d + eps)
        for d0 in range(0, d, BLOCK_D):
            j = d0 + tl.arange(0, BLOCK_D)
            m = _lane_mean(x_ptr, n, d, sx0, sx1, j, N)              # the bits stored above
            g = tl.load(g_ptr + j, mask=j < d, other=0.0)
            tl.store(h_ptr + j * sh, narrow((1.0 + g) * (m / rms), ACT), mask=j < d)


def final_norm_triton(X, gain, hidden_out, eps: float = EPS, block_d: int = 128):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    _check(X, gain, hidden_out)
    n, d = X.shape
    gain = gain.contiguous()                                          # a no-op for a weight
    mean = torch.empty(d, dtype=X.dtype, device=X.device)
    _final_norm_kernel[(1,)](X, gain, hidden_out, mean, n, d, X.stride(0), X.stride(1),
                             hidden_out.stride(0), eps, N=triton.next_power_of_2(n),
                             BLOCK_D=block_d, ACT=act_code(X.dtype))
    return mean
