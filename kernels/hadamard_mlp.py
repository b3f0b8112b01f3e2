"""The Hadamard MLP with its norm, in one launch: Triton kernel and torch twin.

    mi  = (1 + gain) · z / sqrt(mean(z²) + eps)            [d]   (the pre_hada ZC norm)
    p   = mi zero-padded to n = hada_n (a power of two >= d)
    t   = silu(d2 · (W (d1 · p)))
    out = (d3 · (W t))[:d]                                  W = Walsh(n) / sqrt(n), symmetric

The twin multiplies by the float32 Walsh matrix as the model does. The kernel holds the whole
vector in one program as an [A, B] tile (n = A·B, both powers of two), and applies W without
storing it: Sylvester order factors as W = W_A (x) W_B, so W p is W_A · P · W_B on the tile,
with every sign (-1)^popcount(i & j) computed in registers and one 1/sqrt(n) at the end.
"""
from __future__ import annotations

import math

import torch

MAX_N = 4096            # the tile must fit one program

try:
    import triton
    import triton.language as tl
except ImportError:                        # pragma: no cover
    triton = None


class HadamardMlpError(ValueError):
    """Inputs that do not describe one Hadamard MLP (names the argument and the rule)."""


def _check(z, gain, d1, d2, d3):
    if z.dim() != 1 or z.dtype != torch.float32 or z.numel() == 0:
        raise HadamardMlpError(f"z must be float32 [d], got {z.dtype} {list(z.shape)}")
    d, n = z.shape[0], d1.shape[0] if d1.dim() == 1 else -1
    if n < d or n & (n - 1) or n > MAX_N:
        raise HadamardMlpError(f"hada_n={n} must be a power of two in {d}..{MAX_N} (d={d})")
    for name, t, size in (("gain", gain, d), ("d1", d1, n), ("d2", d2, n), ("d3", d3, n)):
        if t.shape != (size,) or t.dtype != torch.float32:
            raise HadamardMlpError(f"{name} must be float32 [{size}], got {t.dtype} "
                                   f"{list(t.shape)}")
    return d, n


_WALSH = {}


def walsh_matrix(n: int, device) -> torch.Tensor:
    """Walsh(n)/sqrt(n) in Sylvester order, float32 (rounded once from float64)."""
    key = (n, str(torch.device(device)))
    if key not in _WALSH:
        with torch.inference_mode(False):       # cached: a normal tensor for every caller
            h = torch.ones(1, 1, dtype=torch.float64)
            while h.shape[0] < n:
                h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
            _WALSH[key] = (h / math.sqrt(n)).float().to(device)
    return _WALSH[key]


def hadamard_mlp_torch(z, gain, d1, d2, d3, eps: float = 1e-6):
    d, n = _check(z, gain, d1, d2, d3)
    w = walsh_matrix(n, z.device)
    mi = (1.0 + gain) * z / torch.sqrt((z * z).mean(-1, keepdim=True) + eps)
    t = torch.nn.functional.pad(mi, (0, n - d))
    t = torch.nn.functional.silu(d2 * ((d1 * t) @ w))
    return (d3 * (t @ w))[:d]


if triton is not None:
    @triton.jit
    def _signs(R: tl.constexpr):
        i = tl.arange(0, R)
        p = i[:, None] & i[None, :]
        for s in tl.static_range(5):          # parity of up to 32 bits
            p = p ^ (p >> (1 << (4 - s)))
        return 1.0 - 2.0 * (p & 1).to(tl.float32)

    @triton.jit
    def _walsh_tile(x, A: tl.constexpr, B: tl.constexpr):
        """W_A · x · W_B for x [A, B], unscaled (+-1 entries)."""
        xb = tl.sum(x[:, :, None] * _signs(B)[None, :, :], axis=1)
        return tl.sum(_signs(A)[:, :, None] * xb[:, None, :], axis=0)

    @triton.jit
    def _hadamard_mlp_kernel(z_ptr, g_ptr, d1_ptr, d2_ptr, d3_ptr, out_ptr, d, eps, scale,
                             A: tl.constexpr, B: tl.constexpr):
        idx = tl.arange(0, A)[:, None] * B + tl.arange(0, B)[None, :]
        real = idx < d
        z = tl.load(z_ptr + idx, mask=real, other=0.0)
        ms = tl.sum(tl.sum(z * z, 1), 0) / d + eps
        mi = (1.0 + tl.load(g_ptr + idx, mask=real, other=0.0)) * z / tl.sqrt(ms)
        t = _walsh_tile(tl.load(d1_ptr + idx) * mi, A, B) * scale
        t = tl.load(d2_ptr + idx) * t
        t = t * tl.sigmoid(t)
        t = _walsh_tile(t, A, B) * scale
        tl.store(out_ptr + idx, tl.load(d3_ptr + idx) * t, mask=real)


def hadamard_mlp_triton(z, gain, d1, d2, d3, eps: float = 1e-6):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    d, n = _check(z, gain, d1, d2, d3)
    a = 1 << (n.bit_length() - 1) // 2
    out = torch.empty(d, dtype=torch.float32, device=z.device)
    z, gain, d1, d2, d3 = (t.contiguous() for t in (z, gain, d1, d2, d3))   # no-ops if so
    _hadamard_mlp_kernel[(1,)](z, gain, d1, d2, d3, out, d, eps, 1.0 / math.sqrt(n),
                               A=a, B=n // a)
    return out
