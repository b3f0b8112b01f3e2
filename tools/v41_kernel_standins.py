"""Pure-torch stand-ins for the tilelang kernels the official V4.1 `inference/model.py` imports
from `kernel` (used only by tools/gen_v41_attn_fixture.py, which installs this module as
`kernel` in sys.modules before loading the official file).

Written from the kernels' documented behaviour (attn_v41 spec §6.2, §3.4, §3.5, §3.8), on
purpose independent of reference/attn_v41_quant.py so the fixture checks the reference's
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
    bits = y.float().contiguous().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return ((exp + 127) << 23).view(torch.float32)


def _e2m1(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    d = (a[..., None] - _GRID).abs()
    code = d.argmin(-1)                    # the lower code of a tied pair comes first
    nxt = d.gather(-1, (code + 1).clamp_max(7)[..., None])[..., 0]
    tie = (code < 7) & (nxt == d.gather(-1, code[..., None])[..., 0])
    code = torch.where(tie & (code % 2 == 1), code + 1, code)       # ties go to the even code
    return torch.where(torch.signbit(v), -_GRID[code], _GRID[code])


def act_quant(x, block_size=128, scale_fmt=None, scale_dtype=torch.float32, inplace=False):
    if not inplace or scale_fmt is None:
        raise NotImplementedError("stand-in: only the in-place power-of-two form is used in "
                                  "bf16 mode")
    g = x.float().unflatten(-1, (-1, block_size))
    s = _pow2_ceil_bits(g.abs().amax(-1, keepdim=True).clamp_min(1e-4) * _R448)
    q = (g / s).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    x.copy_((q * s).flatten(-2))
    return x


def fp4_act_quant(x, block_size=32, inplace=False, scale_dtype=torch.float8_e8m0fnu):
    if not inplace:
        raise NotImplementedError("stand-in: only the in-place form is used")
    g = x.float().unflatten(-1, (-1, block_size))
    amax = g.abs().amax(-1, keepdim=True)
    if scale_dtype == torch.float8_e4m3fn:
        s = (amax.clamp_min(6 * 2.0 ** -9) / 6.0).clamp(-448, 448).to(torch.float8_e4m3fn).float()
    else:
        s = _pow2_ceil_bits(amax.clamp_min(6 * 2.0 ** -126) * _R6)
    x.copy_((_e2m1((g / s).clamp(-6, 6)) * s).flatten(-2))
    return x


def sparse_attn(q, kv, attn_sink, topk_idxs, softmax_scale):
    b, m, h, d = q.shape
    qf, kvf = q.float(), kv.float()
    acc = torch.zeros(b, m, h, d)
    den = torch.zeros(b, m, h)
    run_max = torch.full((b, m, h), -1e30)
    bi = torch.arange(b)[:, None, None]
    for t0 in range(0, topk_idxs.shape[-1], 64):
        j = topk_idxs[..., t0:t0 + 64].long()
        ok = j != -1
        rows = kvf[bi, j.clamp_min(0)] * ok[..., None]
        s = torch.einsum("bmhd,bmkd->bmhk", qf, rows)
        s = torch.where(ok[:, :, None, :], s, -torch.inf) * softmax_scale
        new_max = torch.maximum(run_max, s.amax(-1))
        alpha = torch.exp(run_max - new_max)
        p = torch.exp(s - new_max[..., None])
        den = den * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + torch.einsum("bmhk,bmkd->bmhd",
                                                    p.to(torch.bfloat16).float(), rows)
        run_max = new_max
    den = den + torch.exp(attn_sink.float() - run_max)
    return (acc / den[..., None]).to(torch.bfloat16)


def hc_split_sinkhorn(mixes, hc_scale, hc_base, hc_mult=4, sinkhorn_iters=20, eps=1e-6):
    n = hc_mult
    mx, sc, bs = mixes.float(), hc_scale.float(), hc_base.float()
    pre = torch.sigmoid(mx[..., :n] * sc[0] + bs[:n]) + eps
    post = 2 * torch.sigmoid(mx[..., n:2 * n] * sc[1] + bs[n:2 * n])
    comb = (mx[..., 2 * n:] * sc[2] + bs[2 * n:]).unflatten(-1, (n, n))
    comb = torch.exp(comb - comb.amax(-1, keepdim=True))
    comb = comb / comb.sum(-1, keepdim=True) + eps
    comb = comb / (comb.sum(-2, keepdim=True) + eps)
    for _ in range(sinkhorn_iters - 1):
        comb = comb / (comb.sum(-1, keepdim=True) + eps)
        comb = comb / (comb.sum(-2, keepdim=True) + eps)
    return pre, post, comb


def fp8_gemm(*args, **kwargs):
    raise NotImplementedError("stand-in: the fixture model runs with bf16 weights")


def fp4_gemm(*args, **kwargs):
    raise NotImplementedError("stand-in: the fixture model runs with bf16 weights")
