"""kernels/v41/sparse_attn.py: the two-source MQA sparse attention with sink, torch twin and
Triton (interpreter on CPU), against a float64 restatement of the official kernel's numerics
(running max from -1e30, bf16 probabilities weighting the rows, sink in the denominator)."""
import pytest
import torch

from kernels.v41.sparse_attn import (SparseAttnV41Error, sparse_attn_v41, sparse_attn_v41_torch,
                                     triton)
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def plain(q, a, b, idx, scale, sink, tile=64):
    """float64 per query and head over tiles of 64; probabilities rounded to bf16 for the sum."""
    rows = torch.cat([a, b]) if b is not None else a
    q, rows, sink = q.double().cpu(), rows.double().cpu(), sink.double().cpu()
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for t in range(T):
        for h in range(H):
            top, den, acc = -1e30, 0.0, torch.zeros(D, dtype=torch.float64)
            for t0 in range(0, idx.shape[1], tile):
                js = [int(j) for j in idx[t, t0:t0 + tile] if j >= 0]
                if not js:
                    continue
                s = torch.stack([q[t, h] @ rows[j] for j in js]) * scale
                new = max(top, float(s.max()))
                p = torch.exp(s - new)
                den = den * torch.exp(torch.tensor(top - new)) + float(p.sum())
                pb = p.float().bfloat16().double()
                acc = acc * torch.exp(torch.tensor(top - new)) + sum(pb[n] * rows[j]
                                                                     for n, j in enumerate(js))
                top = new
            out[t, h] = acc / (den + torch.exp(sink[h] - top))
    return out


def case(T=3, K=70, na=9, nb=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, 4, 32, generator=g).bfloat16()
    a = torch.randn(na, 32, generator=g).bfloat16()
    b = torch.randn(nb, 32, generator=g).bfloat16() if nb else None
    idx = torch.randint(-1, na + nb, (T, K), generator=g)
    idx[-1] = -1                                                     # nothing selected
    return [x.to(DEV) if x is not None else None for x in (q, a, b, idx)] + \
        [torch.randn(4, generator=g).to(DEV)]


@pytest.mark.parametrize("impl", ["torch", pytest.param(
    "triton", marks=pytest.mark.skipif(triton is None, reason="no Triton"))])
@pytest.mark.parametrize("nb", [0, 12])
def test_against_float64(impl, nb):
    q, a, b, idx, sink = case(nb=nb)
    got = sparse_attn_v41(q, a, b, idx, 0.17, sink, backend=impl)
    assert torch.equal(got[-1].cpu(), torch.zeros_like(got[-1].cpu()))
    assert rule_for(f"{impl}/sparse_attn_v41", KERNEL_RULES).check(
        got.cpu(), plain(q, a, b, idx, 0.17, sink))


@pytest.mark.skipif(triton is None, reason="no Triton")
def test_triton_matches_torch():
    q, a, b, idx, sink = case(seed=4)
    t = sparse_attn_v41_torch(q, a, b, idx, 0.2, sink)
    g = sparse_attn_v41(q, a, b, idx, 0.2, sink, backend="triton")
    assert rule_for("triton_vs_torch/sparse_attn_v41", KERNEL_RULES).check(g.cpu(), t.cpu())


def test_refuses_bad_shapes():
    q, a, b, idx, sink = case()
    with pytest.raises(SparseAttnV41Error, match=r"sink must be \[H=4\]"):
        sparse_attn_v41_torch(q, a, b, idx, 0.2, sink[:3])
    with pytest.raises(SparseAttnV41Error, match=r"rows_b must be \[Nb, D=32\]"):
        sparse_attn_v41_torch(q, a, b[:, :16], idx, 0.2, sink)
    with pytest.raises(SparseAttnV41Error, match="backend='cuda'"):
        sparse_attn_v41(q, a, b, idx, 0.2, sink, backend="cuda")
