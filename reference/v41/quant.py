"""The V4.1 activation round trips (attn_v41 spec §3.4, §3.5), as the official kernels define them.

Each takes a bf16 tensor whose last axis is a multiple of the block, quantises every block with
one scale and returns the dequantised values in bf16:

  fp8_roundtrip      block 32, e4m3 codes, scale 2^ceil(log2(amax·f32(1/448))), amax >= 1e-4
                     (the window kv row, RoPE tail included)
  fp4_roundtrip_e8m0 block 32, e2m1 codes, scale 2^ceil(log2(amax·f32(1/6))), amax >= 6·2^-126
                     (indexer queries and index keys)
  fp4_roundtrip_e4m3 block 16, e2m1 codes, scale e4m3(amax/6), amax >= 6·2^-9
                     (compressed latents)

The official kernels multiply by the float32 reciprocal of 448 (or 6) before taking the
power-of-two ceiling; that product, not the quotient, is what is rounded up. e2m1 rounds to the
nearest grid value {0, .5, 1, 1.5, 2, 3, 4, 6} with ties to the even code, e4m3 to nearest even;
both saturate (values are clamped before the cast).

`*_f64` restate each in float64 from the definitions alone (no torch float8 cast), for tests.
"""
from __future__ import annotations

import math

import torch

FP8_MAX, FP4_MAX = 448.0, 6.0
# module constants: normal tensors even when first imported inside inference mode
with torch.inference_mode(False):
    INV_448 = torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)
    INV_6 = torch.tensor(1.0 / FP4_MAX, dtype=torch.float32)


class QuantError(ValueError):
    """A tensor a round trip cannot take (names the shape, dtype and block)."""


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    if x.dtype != torch.bfloat16:
        raise QuantError(f"round trips take bf16 input (the official kernels' in_dtype), got "
                         f"{x.dtype}")
    if x.shape[-1] % block:
        raise QuantError(f"last axis {x.shape[-1]} is not a multiple of the block {block}")
    return x.float().unflatten(-1, (-1, block))


def pow2_ceil(y: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 y) for positive normal float32 y: y = m·2^e with m in [0.5, 1), so the
    ceiling is e, or e - 1 when y is itself a power of two (m == 0.5)."""
    m, e = torch.frexp(y)
    return torch.ldexp(torch.ones_like(y), torch.where(m == 0.5, e - 1, e))


def e2m1_round(v: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 value of v in [-6, 6], ties to the even code: the grid has step 0.5 below 2,
    1 in [2, 4) and 2 in [4, 6], and torch.round rounds half to even on each step count."""
    a = v.abs()
    r = torch.where(a < 2, torch.round(a * 2) / 2,
                    torch.where(a < 4, torch.round(a), torch.round(a / 2) * 2))
    return torch.copysign(r, v)


def fp8_roundtrip(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    g = _blocks(x, block)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(1e-4)
    s = pow2_ceil(amax * INV_448)
    q = (g / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (q * s).flatten(-2).to(torch.bfloat16)


def fp4_roundtrip_e8m0(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    g = _blocks(x, block)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(FP4_MAX * 2.0 ** -126)
    s = pow2_ceil(amax * INV_6)
    return (e2m1_round((g / s).clamp(-FP4_MAX, FP4_MAX)) * s).flatten(-2).to(torch.bfloat16)


def fp4_roundtrip_e4m3(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    g = _blocks(x, block)
    amax = g.abs().amax(-1, keepdim=True).clamp_min(FP4_MAX * 2.0 ** -9)
    s = (amax / FP4_MAX).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float()
    return (e2m1_round((g / s).clamp(-FP4_MAX, FP4_MAX)) * s).flatten(-2).to(torch.bfloat16)


# ---- float64 definitions (tests) ----

def _f32(v: float) -> float:
    return float(torch.tensor(v, dtype=torch.float32))


def _rne_step(v: float, step: float) -> float:
    q = v / step                       # exact: step is a power of two
    f = math.floor(q)
    r = f + (1 if q - f > 0.5 or (q - f == 0.5 and f % 2) else 0)
    return r * step


def e4m3_f64(v: float) -> float:
    """e4m3fn (bias 7, 3 mantissa bits, max 448, subnormal step 2^-9) of a clamped value."""
    v = max(-FP8_MAX, min(FP8_MAX, v))
    if v == 0:
        return 0.0
    e = max(math.floor(math.log2(abs(v))), -6)
    while 2.0 ** e > abs(v):           # guard log2 rounding at exact powers of two
        e -= 1
    while 2.0 ** (e + 1) <= abs(v):
        e += 1
    e = max(e, -6)
    return math.copysign(min(_rne_step(abs(v), 2.0 ** (e - 3)), FP8_MAX), v)


def e2m1_f64(v: float) -> float:
    grid = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    a = min(abs(v), 6.0)
    best = min(range(8), key=lambda i: (abs(grid[i] - a), i % 2))   # tie: even code
    return math.copysign(grid[best], v)


def _pow2_ceil_f64(y: float) -> float:
    e = math.ceil(math.log2(y))
    while 2.0 ** (e - 1) >= y:
        e -= 1
    while 2.0 ** e < y:
        e += 1
    return 2.0 ** e


def _roundtrip_f64(x: torch.Tensor, block: int, scale_of, code_of) -> torch.Tensor:
    vals = x.double().reshape(-1, block).tolist()
    out = []
    for row in vals:
        s = scale_of(max(abs(v) for v in row))
        out.append([code_of(_f32(v / s)) * s for v in row])   # f32 quotient
    return torch.tensor(out, dtype=torch.float64).reshape(x.shape).to(torch.bfloat16)


def fp8_roundtrip_f64(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    inv = _f32(1 / FP8_MAX)
    return _roundtrip_f64(x, block, lambda a: _pow2_ceil_f64(_f32(max(a, _f32(1e-4)) * inv)),
                          e4m3_f64)


def fp4_roundtrip_e8m0_f64(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    inv = _f32(1 / FP4_MAX)
    return _roundtrip_f64(x, block,
                          lambda a: _pow2_ceil_f64(_f32(max(a, 6 * 2.0 ** -126) * inv)),
                          e2m1_f64)


def fp4_roundtrip_e4m3_f64(x: torch.Tensor, block: int = 16) -> torch.Tensor:
    return _roundtrip_f64(x, block, lambda a: e4m3_f64(_f32(max(a, 6 * 2.0 ** -9) / FP4_MAX)),
                          e2m1_f64)
