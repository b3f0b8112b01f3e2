"""The port's own V4.1 attention pieces (attn_v41 spec §3, §4): quantisers, RoPE, RMSNorm and
the compressed-index builders. Written for the device: no host reads, fixed shapes where the
decode body uses them. (The port never imports the reference's math, DESIGN.md "Layout".)

Quantisers compute the power-of-two scale from the float32 bit fields (exponent, +1 when the
mantissa is non-zero) and round e2m1 by counting the midpoints a magnitude exceeds, ties going
up only at the midpoints whose upper neighbour has an even code (0.75, 1.75, 3.5).
"""
from __future__ import annotations

import math

import torch



class AttnV41Error(ValueError):
    """A call the V4.1 runtime refuses (names the value and the limit)."""


R448 = 1.0 / 448.0
R6 = 1.0 / 6.0
_MIDS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_TIE_UP = (False, True, False, True, False, True, False)


def _pow2_ceil(y: torch.Tensor) -> torch.Tensor:
    bits = y.contiguous().view(torch.int32)
    e = (bits >> 23) & 0xFF
    e = e + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (e << 23).view(torch.float32)


def _e2m1(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.int64)
    for mid, up in zip(_MIDS, _TIE_UP):
        code += (a > mid) | ((a == mid) & up) if up else (a > mid)
    c = code.to(torch.float32)             # codes 0..4 step 0.5; 5, 6, 7 are 3, 4, 6
    val = torch.where(code <= 4, c * 0.5, torch.where(code == 7, 6.0, c - 2.0))
    return torch.where(torch.signbit(v), -val, val)


def fp8_rt(x, block=32):
    g = x.float().unflatten(-1, (-1, block))
    s = _pow2_ceil(g.abs().amax(-1, keepdim=True).clamp_min(1e-4) * R448)
    q = (g / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)
    return (q * s).flatten(-2).to(x.dtype)


def fp4_e8m0_rt(x, block=32):
    g = x.float().unflatten(-1, (-1, block))
    s = _pow2_ceil(g.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -126) * R6)
    return (_e2m1((g / s).clamp(-6.0, 6.0)) * s).flatten(-2).to(x.dtype)


def fp4_e4m3_rt(x, block=16):
    g = x.float().unflatten(-1, (-1, block))
    amax = g.abs().amax(-1, keepdim=True).clamp_min(6 * 2.0 ** -9)
    s = (amax / 6.0).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).to(torch.float32)
    return (_e2m1((g / s).clamp(-6.0, 6.0)) * s).flatten(-2).to(x.dtype)


def rope_cis(rd, n, base, yarn=False, factor=1.0, orig=0, beta_fast=32, beta_slow=1):
    """complex64 [n, rd/2]: e^{i·p·f_k}; YaRN-corrected frequencies when `yarn`."""
    inv = 1.0 / (base ** (torch.arange(0, rd, 2, dtype=torch.float32) / rd))
    if yarn and orig > 0:
        def corr(rot):
            return rd * math.log(orig / (rot * 2 * math.pi)) / (2 * math.log(base))
        lo = max(math.floor(corr(beta_fast)), 0)
        hi = min(math.ceil(corr(beta_slow)), rd - 1)
        ramp = ((torch.arange(rd // 2, dtype=torch.float32) - lo) / max(hi - lo, 1e-3)).clamp(0, 1)
        smooth = 1 - ramp
        inv = inv / factor * (1 - smooth) + inv * smooth
    ang = torch.outer(torch.arange(n), inv)
    return torch.polar(torch.ones_like(ang), ang)


def rope(x, cis, inverse=False):
    """Rotate the last 2·cis.shape[-1] values of each row of x [n, ..., d] by cis [n, rd/2]."""
    rd = 2 * cis.shape[-1]
    z = torch.view_as_complex(x[..., -rd:].float().unflatten(-1, (-1, 2)).contiguous())
    c = cis.conj() if inverse else cis
    c = c.view(c.shape[0], *([1] * (z.dim() - 2)), c.shape[-1])
    return torch.cat([x[..., :-rd], torch.view_as_real(z * c).flatten(-2).to(x.dtype)], -1)


def rms(x, w, eps):
    xf = x.float()
    return (w * (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps))).to(x.dtype)


def visible(m, start_pos, ratio, device=None):
    if start_pos == 0:
        return torch.arange(1, m + 1, device=device).div(ratio, rounding_mode="floor")[:, None]
    return torch.full((m, 1), (start_pos + m) // ratio, device=device)


def block_filter(scores, lens, n_blocks, block):
    """The candidate source's keep mask over scores [m, W]: blocks ranked by their best score,
    the newest visible position's block pinned, -inf blocks dropped."""
    m, w = scores.shape
    pad = (-w) % block
    best = torch.nn.functional.pad(scores, (0, pad), value=-math.inf).view(m, -1, block).amax(-1)
    nb = best.shape[1]
    ids = torch.arange(nb, device=scores.device).unsqueeze(0)
    best = best.masked_fill(ids == torch.div(lens - 1, block, rounding_mode="floor"), math.inf)
    top = best.topk(min(n_blocks, nb), dim=-1)
    keep = torch.zeros(m, nb, dtype=torch.bool, device=scores.device)
    keep = keep.scatter(1, top.indices, top.values != -math.inf)
    return keep.unsqueeze(-1).expand(m, nb, block).reshape(m, nb * block)[:, :w]


def topk_positions(scores, lens, k, offset):
    """[m, k] int64: the k best positions (torch topk's set), ascending, offset, -1 if unseen."""
    pos = torch.sort(scores.topk(k, dim=-1, sorted=False).indices, dim=-1).values
    return torch.where(pos < lens, pos + offset, torch.full_like(pos, -1))
