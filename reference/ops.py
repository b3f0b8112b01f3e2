"""The operators of needle v2 (spec §b), in the dtype of their inputs.

Each mirrors the arithmetic order of upstream's helper of the same role, because the reference
is judged to float32 rounding against it: ZCRMSNorm divides by the rms, rms_unit multiplies by
the reciprocal root, RoPE tables are built in the working dtype, Sinkhorn runs exactly 20
log-domain iterations.
"""
from __future__ import annotations

import functools
import math

import torch

EPS = 1e-6
HASH_SEED = 0x9E3779B9
HASH_PRIME = 0x01000193
U32 = 0xFFFFFFFF
SINKHORN_ITERS = 20


def zcrms(x, scale, eps: float = EPS):
    """Zero-centred RMSNorm: (1 + g) * x / sqrt(mean(x^2) + eps)."""
    rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps)
    return (1.0 + scale) * x / rms


def rms_unit(x, eps: float = EPS):
    """Parameter-free RMS normalisation: x * rsqrt(mean(x^2) + eps)."""
    return x * torch.rsqrt(torch.mean(x * x, dim=-1, keepdim=True) + eps)


@functools.lru_cache(maxsize=32)
def _rope_tables(head_dim: int, length: int, theta: float, dtype: torch.dtype):
    # Built in the working dtype (f32: upstream's tables; f64: the arbiter's exact tables).
    # A 16-bit working dtype (the noise-floor reference) builds them in float32 and rounds
    # once: positions past 256 are not even integers in bfloat16, and no port builds them so.
    # Outside inference mode even when the first caller is in it (a sweep's case): a cached
    # inference tensor would refuse later callers' autograd and in-place use.
    with torch.inference_mode(False):
        if dtype in (torch.bfloat16, torch.float16):
            cos, sin = _rope_tables(head_dim, length, theta, torch.float32)
            return cos.to(dtype), sin.to(dtype)
        expo = torch.arange(0, head_dim, 2, dtype=dtype) / head_dim
        inv = 1.0 / torch.pow(torch.tensor(theta, dtype=dtype), expo)
        angles = torch.outer(torch.arange(length, dtype=dtype), inv)
        return torch.cos(angles), torch.sin(angles)


def rope_tables(head_dim: int, length: int, theta: float, dtype=torch.float32):
    """cos, sin tables [length, head_dim/2]; cached, so callers must not write into them."""
    return _rope_tables(int(head_dim), int(length), float(theta), dtype)


def apply_rope(x, cos, sin):
    """Half-split RoPE on the last axis; cos/sin [S, hd/2] broadcast over leading axes."""
    half = x.shape[-1] // 2
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, b * cos + a * sin], dim=-1)


@functools.lru_cache(maxsize=16)
def _walsh(n: int, dtype: torch.dtype):
    with torch.inference_mode(False):       # cached: see _rope_tables
        h = torch.ones(1, 1, dtype=torch.float64)
        while h.shape[0] < n:
            h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
        return (h / math.sqrt(n)).to(dtype)


def walsh_matrix(n: int, dtype=torch.float32):
    """Orthonormal Sylvester-Walsh matrix of size n (natural order), ±1/sqrt(n) rounded once."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Walsh size n={n} must be a power of two")
    return _walsh(n, dtype)


HALF = (torch.bfloat16, torch.float16)


def matmul(a, b):
    """a @ b. 16-bit operands (the noise-floor reference, reference/precision.py) multiply in
    float32 and the product rounds once to their dtype: what torch's own 16-bit CPU matmul
    computes (float32 accumulation, one rounding) up to summation order, and several times
    faster on a CPU without 16-bit dot instructions. float32 and float64: `a @ b` itself."""
    if a.dtype in HALF:
        return (a.float() @ b.float()).to(a.dtype)
    return a @ b


def silu(z):
    return z * torch.sigmoid(z)


def hadamard_mlp(h, d1, d2, d3, d_model: int):
    """(d3 ⊙ (silu(d2 ⊙ ((d1 ⊙ z) H)) H))[:d] with z = h zero-padded to the Walsh size."""
    n = d1.shape[-1]
    H = walsh_matrix(n, h.dtype)
    z = torch.nn.functional.pad(h, (0, n - d_model)) if n != d_model else h
    z = matmul(d1 * z, H)
    z = matmul(silu(d2 * z), H)
    return (d3 * z)[..., :d_model]


def log_sinkhorn_steps(logits, iters: int = SINKHORN_ITERS):
    """The log-domain plan before the first iteration and after each of `iters` (rows then
    columns): what sinkhorn exponentiates last, and the ones before it."""
    z = logits
    yield z
    for _ in range(iters):
        z = z - torch.logsumexp(z, dim=-1, keepdim=True)
        z = z - torch.logsumexp(z, dim=-2, keepdim=True)
        yield z


def sinkhorn(logits, iters: int = SINKHORN_ITERS):
    """Log-domain Sinkhorn: rows then columns, fixed iteration count, then exp."""
    for z in log_sinkhorn_steps(logits, iters):
        pass
    return torch.exp(z)


def shift_right(x, offset: int):
    """Shift along axis 1 by `offset`, filling with zeros (positions before the start)."""
    if offset == 0:
        return x
    pad = torch.zeros(x.shape[:1] + (min(offset, x.shape[1]),) + x.shape[2:], dtype=x.dtype)
    return torch.cat([pad, x[:, : x.shape[1] - offset]], dim=1)[:, : x.shape[1]]


def engram_indices(tokens, orders, heads: int, slots: int):
    """Hash every position's n-grams into table rows: [B, T] int -> [B, T, len(orders)*heads].

    uint32 arithmetic emulated in int64: each product of two values < 2^32 fits, and masking
    to 32 bits after each multiply gives the wrap-around. Tokens hash as unsigned; positions
    before the start of `tokens` hash as 0.
    """
    u = tokens.to(torch.int64) & U32
    out = []
    for oi, order in enumerate(orders):
        for h in range(heads):
            acc = torch.full_like(u, (HASH_SEED * (oi * heads + h + 1)) & U32)
            for j in range(order):
                acc = ((acc ^ shift_right(u, j)) * HASH_PRIME) & U32
            acc = acc ^ (acc >> 15)
            out.append(acc % slots)
    return torch.stack(out, dim=-1)


def mhc_lane_offsets(num_layers: int, lanes: int, dtype=torch.float32):
    """Constant router offsets: pre +4 on the layer's active lane, -4 elsewhere; post 0 / -4."""
    lane = torch.eye(lanes, dtype=dtype)[torch.arange(num_layers) % lanes]
    return 8 * lane - 4, -4 * (1 - lane)
