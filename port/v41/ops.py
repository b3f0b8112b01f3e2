"""The port's own V4.1 attention pieces (attn_v41 spec §3, §4): quantisers, RoPE, RMSNorm and
the compressed-index builders. Written for the device: no host reads, fixed shapes where the
decode body uses them. (The port never imports the reference's math, docs/design.md "Layout".)

Quantisers take the power-of-two scale from the float32 bit fields (the exponent field alone,
doubled when any mantissa bit was set) and round e2m1 with float32's own round-to-nearest-even:
adding 2^22, 2^23 or 2^24 leaves a float32 whose last place is 0.5, 1 or 2 (the e2m1 step
below 2, in [2, 4) and in [4, 6]), so the addition rounds the magnitude onto the grid, ties to
the even multiple of the step, which is the even e2m1 code; subtracting the constant back is
exact.
"""
from __future__ import annotations

import math

import torch


class AttnV41Error(ValueError):
    """A call the V4.1 runtime refuses (names the value and the limit)."""


R448 = 1.0 / 448.0
R6 = 1.0 / 6.0
EXP_BITS, MANT_BITS = 0x7F800000, 0x007FFFFF


def _pow2_ceil(y: torch.Tensor) -> torch.Tensor:
    """Smallest power of two >= y, for positive normal float32 y (spec §3.4's scale). Keeping
    only y's exponent field gives the power of two at or below y; when that dropped mantissa
    bits, y lay strictly above it and the answer is the next power up (doubling is exact)."""
    raw = y.contiguous().view(torch.int32)
    below = (raw & EXP_BITS).view(torch.float32)
    return torch.where((raw & MANT_BITS) != 0, below * 2, below)


def _e2m1(v: torch.Tensor) -> torch.Tensor:
    """Nearest e2m1 value of float32 v in [-6, 6], ties to the even code (module docstring)."""
    a = v.abs()
    shift = torch.where(a < 2, 2.0 ** 22, torch.where(a < 4, 2.0 ** 23, 2.0 ** 24))
    return ((a + shift) - shift).copysign(v)


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


def _stretch_weight(rd, base, orig, beta_fast, beta_slow):
    """Per frequency k, how far YaRN moves f_k towards f_k / factor: 0 for the fast dims (which
    complete more than beta_fast turns over the trained context `orig`), 1 for the slow ones
    (fewer than beta_slow turns), linear in k across the band between them."""
    def k_for(turns):            # f_k·orig = 2π·turns, f_k = base^(-2k/rd), solved for k
        return rd * math.log(orig / (turns * 2 * math.pi)) / (2 * math.log(base))
    lo = max(math.floor(k_for(beta_fast)), 0)
    hi = min(math.ceil(k_for(beta_slow)), rd - 1)
    k = torch.arange(rd // 2, dtype=torch.float32)
    return ((k - lo) / max(hi - lo, 1e-3)).clamp(0, 1)


def rope_cis(rd, n, base, yarn=False, factor=1.0, orig=0, beta_fast=32, beta_slow=1):
    """complex64 [n, rd/2]: e^{i·p·f_k}; YaRN-corrected frequencies when `yarn`."""
    f = torch.reciprocal(base ** (torch.arange(rd // 2, dtype=torch.float32).mul(2).div(rd)))
    if yarn and orig > 0:
        unmoved = 1 - _stretch_weight(rd, base, orig, beta_fast, beta_slow)
        # spec §3.3's blend, in the float order that makes the table bit-equal to the official
        # one: with w = 1 - stretch, f/factor·(1 - w) + f·w (1 - w is not stretch in float32)
        f = f * unmoved + f / factor * (1 - unmoved)
    pos = torch.arange(n, dtype=torch.float32)
    ang = pos.unsqueeze(1) * f.unsqueeze(0)
    return torch.polar(torch.ones_like(ang), ang)


def rope(x, cis, inverse=False):
    """Rotate the last 2·cis.shape[-1] values of each row of x [n, ..., d] by cis [n, rd/2]."""
    rd = 2 * cis.shape[-1]
    z = torch.view_as_complex(x[..., -rd:].float().unflatten(-1, (-1, 2)).contiguous())
    c = cis.conj() if inverse else cis
    c = c.view(c.shape[0], *([1] * (z.dim() - 2)), c.shape[-1])
    return torch.cat([x[..., :-rd], torch.view_as_real(z * c).flatten(-2).to(x.dtype)], -1)


def rms(x, w, eps):
    """spec §3.2 in f32: normalise by the row's RMS first, then weight (the order is forced)."""
    f = x.float()
    scale = (f.pow(2).mean(-1, keepdim=True) + eps).rsqrt()
    return (f * scale * w).to(x.dtype)


def grouped_projection(o_rot, wo_a, wo_b, groups, out=None):
    """spec §3.10: o_rot [m, H, D] -> (og [m, groups·rank], out [m, dim]). wo_a is
    block-diagonal: group g's contiguous slice of heads meets only rows g·rank.. of wo_a, so
    it runs as one batched product over the groups. `out`: rows to write the result into
    (the same product F.linear runs: og · wo_bᵀ)."""
    lhs = o_rot.reshape(o_rot.shape[0], groups, -1)
    og = torch.einsum("mgk,gnk->mgn", lhs, wo_a.unflatten(0, (groups, -1))).flatten(1)
    if out is None:
        return og, torch.nn.functional.linear(og, wo_b)
    return og, torch.mm(og, wo_b.t(), out=out)


def visible(m, start_pos, ratio, device=None):
    if start_pos == 0:
        return torch.arange(1, m + 1, device=device).div(ratio, rounding_mode="floor")[:, None]
    return torch.full((m, 1), (start_pos + m) // ratio, device=device)


def block_filter(scores, lens, n_blocks, block):
    """The candidate source's keep mask over scores [m, W]: blocks ranked by their best score,
    the newest visible position's block pinned, -inf blocks dropped."""
    m, w = scores.shape
    dev = scores.device
    nb = -(-w // block)
    owner = torch.arange(w, device=dev) // block
    best = torch.full((m, nb), -math.inf, dtype=scores.dtype, device=dev).scatter_reduce(
        1, owner.expand(m, w), scores, reduce="amax")             # exact: a max, no rounding
    newest = torch.div(lens - 1, block, rounding_mode="floor")    # -1 when nothing is visible
    best = torch.where(torch.arange(nb, device=dev) == newest, math.inf, best)
    # torch's topk on the host (the official tie rule) decides which blocks survive
    won = best.topk(min(n_blocks, nb), dim=-1).indices
    chosen = torch.zeros(m, nb, dtype=torch.bool, device=dev).scatter(1, won, True)
    return (chosen & (best != -math.inf)).gather(1, owner.expand(m, w))


def topk_positions(scores, lens, k, offset):
    """[m, k] int64: the k best positions (torch topk's set), ascending, offset, -1 if unseen."""
    pos = torch.sort(scores.topk(k, dim=-1, sorted=False).indices, dim=-1).values
    return torch.where(pos < lens, pos + offset, torch.full_like(pos, -1))


def emit(tr, layer, res, widx, idx, rows_b):
    """One layer's trace points in order (the eager forward and the decode graphs alike)."""
    for name in ("qr", "q", "kv"):
        tr(name, layer, res[name])
    tr("window_idxs", layer, widx)
    if rows_b is not None:
        tr("compressed_rows", layer, rows_b)
    tr("topk_idxs", layer, idx)
    for name in ("o", "o_rot", "og", "out"):
        tr(name, layer, res[name])
