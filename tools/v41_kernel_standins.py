"""Pure-torch stand-ins for the tilelang kernels the official V4.1 `inference/model.py` imports
from `kernel` (used only by tools/gen_v41_attn_fixture.py, which installs this module as
`kernel` in sys.modules before loading the official file).

Written from the kernels' documented behaviour (attn_v41 spec §6.2, §3.4, §3.5, §3.8), on
purpose independent of reference/v41/quant.py so the fixture checks the reference's
quantisers rather than reusing them:

  act_quant        in place: per block, amax floored at 1e-4, scale = 2^ceil(log2(amax·f32(1/448)))
                   from the float32 bit fields, values clamped to ±448 and cast to e4m3 (RNE)
  fp4_act_quant    in place: e2m1 by nearest grid value, ties to the even code; e8m0 scales
                   (block 32, pow2 ceiling of amax·f32(1/6), amax >= 6·2^-126) or e4m3 scales
                   (block 16, e4m3(amax/6), amax >= 6·2^-9)
  sparse_attn      online softmax over tiles of 64 selected rows, running max from -1e30, -1
                   rows masked, probabilities rounded to bf16 for the row sum, sink added to
                   the denominator at the end, bf16 out
  hc_split_sinkhorn  pre = sigmoid(m·s0 + b) + eps, post = 2·sigmoid(m·s1 + b), comb =
                   row softmax + eps, column normalise (+eps), then iters-1 row/column rounds
  fp8_gemm, fp4_gemm  not needed with bf16 weights: they refuse
"""
from __future__ import annotations

import torch

_R448 = torch.tensor(1 / 448.0, dtype=torch.float32)
_R6 = torch.tensor(1 / 6.0, dtype=torch.float32)
_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_ceil_bits(y: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 y) for positive normal float32 y, on the bit pattern: adding 2^23 - 1 carries
    into the exponent exactly when the mantissa is non-zero; clearing the mantissa leaves the
    power of two."""
    bits = y.float().contiguous().view(torch.int32)
    return ((bits + 0x7FFFFF) & ~0x7FFFFF).view(torch.float32)


def _e2m1(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    d = (a[..., None] - _GRID).abs()
    code = d.argmin(-1)                    # the lower code of a tied pair comes first
    nxt = d.gather(-1, (code + 1).clamp_max(7)[..., None])[..., 0]
    tie = (code < 7) & (nxt == d.gather(-1, code[..., None])[..., 0])
    code = torch.where(tie & (code % 2 == 1), code + 1, code)       # ties go to the even code
    return torch.where(torch.signbit(v), -_GRID[code], _GRID[code])


def _requantise(x, block, scale_of, snap):
    """The in-place round trip both quantisers share: per block of `block` values one scale
    from the block's largest magnitude, each value divided by it, snapped onto the code grid,
    multiplied back and stored into x (bf16 rounding on the store)."""
    blocks = x.float().unflatten(-1, (-1, block))
    scale = scale_of(blocks.abs().amax(-1, keepdim=True))
    x.copy_((snap(blocks / scale) * scale).flatten(-2))
    return x


def _e4m3_snap(v):
    # saturate first: torch's e4m3fn cast is RNE but turns values past 448 into NaN
    return v.clamp(-448, 448).to(torch.float8_e4m3fn).float()


def _e2m1_snap(v):
    return _e2m1(v.clamp(-6, 6))


# spec §3.4/§3.5 scales from a block's largest magnitude (floored so a zero block divides by a
# normal number); the power-of-two ones round up amax·f32(1/max), not amax/max
def _fp8_scale(peak):
    return _pow2_ceil_bits(peak.clamp_min(1e-4) * _R448)


def _e8m0_scale(peak):
    return _pow2_ceil_bits(peak.clamp_min(6 * 2.0 ** -126) * _R6)


def _e4m3_scale(peak):
    return _e4m3_snap(peak.clamp_min(6 * 2.0 ** -9) / 6.0)


_FP4_SCALES = {torch.float8_e8m0fnu: _e8m0_scale, torch.float8_e4m3fn: _e4m3_scale}


def act_quant(x, block_size=128, scale_fmt=None, scale_dtype=torch.float32, inplace=False):
    if not inplace or scale_fmt is None:
        raise NotImplementedError("stand-in: only the in-place power-of-two form is used in "
                                  "bf16 mode")
    return _requantise(x, block_size, _fp8_scale, _e4m3_snap)


def fp4_act_quant(x, block_size=32, inplace=False, scale_dtype=torch.float8_e8m0fnu):
    if not inplace:
        raise NotImplementedError("stand-in: only the in-place form is used")
    if scale_dtype not in _FP4_SCALES:
        raise NotImplementedError(f"stand-in: fp4 scales are e8m0 or e4m3, not {scale_dtype}")
    return _requantise(x, block_size, _FP4_SCALES[scale_dtype], _e2m1_snap)


class _Streaming:
    """The kernel's softmax state for one (query, head): the largest score seen so far (floored
    at -1e30, so a query with nothing selected ends with exp(-inf) = 0 weights, not NaN), the
    denominator and the unnormalised output, both rescaled whenever the largest score grows."""

    def __init__(self, lead, d):
        self.peak = torch.full(lead, -1e30)
        self.den = torch.zeros(lead)
        self.num = torch.zeros(*lead, d)

    def absorb(self, scores, values):
        """scores [..., h, k] (-inf where absent), values [..., k, d] (zero where absent)."""
        peak = torch.maximum(self.peak, scores.amax(-1))
        rescale = torch.exp(self.peak - peak)
        w = torch.exp(scores - peak.unsqueeze(-1))
        # spec §6.2: the denominator takes the f32 weights, the weighted row sum the bf16 ones
        self.den = self.den * rescale + w.sum(-1)
        self.num = self.num * rescale.unsqueeze(-1) + \
            torch.einsum("bmhk,bmkd->bmhd", w.bfloat16().float(), values)
        self.peak = peak

    def result(self, sink):
        # the sink joins the denominator only, after the last tile (spec §3.8)
        return (self.num / (self.den + torch.exp(sink - self.peak)).unsqueeze(-1)).bfloat16()


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    """q [b, m, h, d] bf16, kv [b, n, d] bf16 (each row key and value), sink [h] f32, topk_idxs
    [b, m, k] (-1: nothing) -> [b, m, h, d] bf16, taking the selection 64 entries at a time."""
    qf, table = q.float(), kv.float()
    state = _Streaming(q.shape[:3], q.shape[3])
    batch = torch.arange(q.shape[0]).view(-1, 1, 1)
    for tile in topk_idxs.long().split(64, dim=-1):
        present = tile >= 0
        values = table[batch, tile.clamp_min(0)] * present.unsqueeze(-1)
        dots = torch.einsum("bmhd,bmkd->bmhk", qf, values)
        state.absorb(dots.masked_fill(~present.unsqueeze(2), -torch.inf) * softmax_scale,
                     values)
    return state.result(attn_sink.float())


def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
    """(pre [.., n], post [.., n], comb [.., n, n]) from the 2n + n·n mixes, all f32: pre and
    post are shifted sigmoids, comb a near doubly-stochastic matrix (Sinkhorn)."""
    n = hc_mult
    parts = (mixes.float() * hc_scale.float().repeat_interleave(torch.tensor([n, n, n * n]))
             ).split([n, n, n * n], dim=-1)
    base = hc_base.float().split([n, n, n * n])
    pre = torch.sigmoid(parts[0] + base[0]) + eps
    post = torch.sigmoid(parts[1] + base[1]) * 2
    logits = (parts[2] + base[2]).unflatten(-1, (n, n))
    # round 0 starts from the row softmax (+eps) and normalises columns; every later round
    # normalises rows, then columns, each with eps in the divisor (kernel order, spec §6.2)
    comb = torch.exp(logits - logits.amax(-1, keepdim=True))
    comb = comb / comb.sum(-1, keepdim=True) + eps
    for rnd in range(sinkhorn_iters):
        if rnd:
            comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def fp8_gemm(*args, **kwargs):
    raise NotImplementedError("stand-in: the fixture model runs with bf16 weights")


def fp4_gemm(*args, **kwargs):
    raise NotImplementedError("stand-in: the fixture model runs with bf16 weights")
