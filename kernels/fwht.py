"""Orthonormal Walsh–Hadamard transform of every 128-wide group of the last axis (the rotation
Cactus-Quants applies once per activation): Triton kernel and torch twin.

    y_g = H x_g,   H[i, j] = (-1)^popcount(i & j) / sqrt(128)   (Sylvester order, symmetric)

The twin runs the log2(128) butterfly passes; the kernel forms each output as a signed sum over
the group (the sign from the parity of i & j), one program per (row, group). Same transform,
different rounding: compared within a tolerance, both against float64.
"""
from __future__ import annotations

import math

import torch

GROUP = 128

try:
    import triton
    import triton.language as tl
except ImportError:                        # pragma: no cover
    triton = None


class FwhtError(ValueError):
    """Input the transform cannot take (names the shape and the rule)."""


def _check(x):
    if x.shape[-1] % GROUP or x.dtype != torch.float32:
        raise FwhtError(f"fwht needs float32 with a last axis that is a multiple of {GROUP}, "
                        f"got {x.dtype} {list(x.shape)}")


def fwht_torch(x):
    _check(x)
    lead, n = x.shape[:-1], x.shape[-1]
    y = x.reshape(-1, n // GROUP, GROUP)
    span = GROUP // 2
    while span >= 1:
        b = y.reshape(y.shape[0], y.shape[1], GROUP // (2 * span), 2, span)
        y = torch.stack((b[:, :, :, 0] + b[:, :, :, 1], b[:, :, :, 0] - b[:, :, :, 1]), 3)
        y = y.reshape(-1, n // GROUP, GROUP)
        span //= 2
    return (y * (1.0 / math.sqrt(GROUP))).reshape(*lead, n)


if triton is not None:
    @triton.jit
    def _fwht_kernel(x_ptr, y_ptr, n, scale, G: tl.constexpr):
        row = tl.program_id(0)
        grp = tl.program_id(1)
        i = tl.arange(0, G)
        base = row * n + grp * G
        x = tl.load(x_ptr + base + i)
        p = i[:, None] & i[None, :]
        p = p ^ (p >> 4)
        p = p ^ (p >> 2)
        p = p ^ (p >> 1)
        sign = 1.0 - 2.0 * (p & 1).to(tl.float32)                 # (-1)^popcount(i & j)
        y = tl.sum(x[:, None] * sign, axis=0) * scale
        tl.store(y_ptr + base + i, y)


def fwht_triton(x):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    _check(x)
    n = x.shape[-1]
    flat = x.reshape(-1, n).contiguous()
    out = torch.empty_like(flat)
    _fwht_kernel[(flat.shape[0], n // GROUP)](flat, out, n, 1.0 / math.sqrt(GROUP), G=GROUP)
    return out.reshape(x.shape)
