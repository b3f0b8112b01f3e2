"""qk_rope_ring: q/k norms, RoPE, the gate and the ring write after one token's q|k|v|gate
product, in one launch. Twin and Triton kernel against float64, the kernel against the twin, the
ring written only at the slot read from the device, and the twin against the model's own ops."""
import pytest
import torch

from kernels.qk_rope_ring import QkRopeRingError, qk_rope_ring_torch, qk_rope_ring_triton, triton
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for
from port.model import V2Model, sigmoid, zc

DEV = "cuda" if torch.cuda.is_available() else "cpu"
PARTS = ("q", "k", "v", "gate")


def case(H, KV, hd, R, pos, seed):
    g = torch.Generator().manual_seed(seed)
    qkvg = torch.randn(2 * H * hd + 2 * KV * hd, generator=g) * 2
    qn, kn = 0.2 * torch.randn(hd, generator=g), 0.2 * torch.randn(hd, generator=g)
    ang = torch.outer(torch.arange(16.0), 1.0 / 100.0 ** (torch.arange(0, hd, 2) / hd))
    rings = [torch.randn(KV, R, hd, generator=g) for _ in range(2)]
    pos_t, slot_t = torch.tensor([pos]), torch.tensor([pos % R])
    args = [qkvg, qn, kn, ang.cos(), ang.sin(), pos_t, slot_t, *rings]
    return [t.to(DEV) for t in args]


def float64_prelude(qkvg, qn, kn, cos, sin, pos, slot, k_ring, v_ring, H, KV):
    x, qn, kn = qkvg.cpu().double(), qn.cpu().double(), kn.cpu().double()
    hd = qn.shape[0]
    p = int(pos.cpu()[0])
    c, s = cos.cpu().double()[p], sin.cpu().double()[p]

    def norm_rope(v, g):
        v = (1 + g) * v / torch.sqrt((v * v).mean(-1, keepdim=True) + 1e-6)
        a, b = v[:, :hd // 2], v[:, hd // 2:]
        return torch.cat([a * c - b * s, b * c + a * s], -1)
    A, K = H * hd, KV * hd
    return (norm_rope(x[:A].view(H, hd), qn), norm_rope(x[A:A + K].view(KV, hd), kn),
            x[A + K:A + 2 * K].view(KV, hd), 1 / (1 + torch.exp(-x[A + 2 * K:])))


IMPLS = [("twin", qk_rope_ring_torch), pytest.param(
    "triton", qk_rope_ring_triton, marks=pytest.mark.skipif(triton is None, reason="no Triton"))]


@pytest.mark.parametrize("name,impl", IMPLS)
@pytest.mark.parametrize("H,KV,hd,R,pos", [(4, 2, 12, 8, 11), (8, 4, 16, 5, 3), (2, 2, 6, 4, 0)])
def test_against_float64_and_the_ring(name, impl, H, KV, hd, R, pos):
    args = case(H, KV, hd, R, pos, seed=H * 10 + hd)
    before = [t.clone() for t in args[7:]]
    got = impl(*args, H=H, KV=KV)
    want = float64_prelude(*args, H=H, KV=KV)
    for part, a, b in zip(PARTS, got, want):
        assert rule_for(f"qk_rope_ring/{name}", KERNEL_RULES).check(a.cpu(), b), part
    slot = pos % R
    for ring, old, new in zip(args[7:], before, got[1:3]):
        assert torch.equal(ring[:, slot], new)                    # the slot holds k / v ...
        keep = [r for r in range(R) if r != slot]
        assert torch.equal(ring[:, keep], old[:, keep])           # ... and nothing else moved


@pytest.mark.skipif(triton is None, reason="no Triton")
def test_triton_matches_twin():
    a, b = case(8, 4, 64, 16, 9, seed=1), case(8, 4, 64, 16, 9, seed=1)
    for part, x, y in zip(PARTS, qk_rope_ring_triton(*a, H=8, KV=4),
                          qk_rope_ring_torch(*b, H=8, KV=4)):
        assert rule_for("qk_rope_ring/triton_vs_twin", KERNEL_RULES).check(x.cpu(), y.cpu()), part
    assert rule_for("qk_rope_ring/triton_vs_twin", KERNEL_RULES).check(a[7].cpu(), b[7].cpu())


def test_twin_is_the_models_ops_bit_for_bit():
    """q and k are exactly the model's zc + rope (the gate: its sigmoid, up to the model's
    lane-padding trick, so compared by value there)."""
    H, KV, hd = 4, 2, 12
    qkvg, qn, kn, cos, sin, pos, slot, kr, vr = [t.cpu() for t in case(H, KV, hd, 8, 5, seed=3)]
    q, k, v, gate = qk_rope_ring_torch(qkvg, qn, kn, cos, sin, pos, slot, kr, vr, H, KV)
    c, s = cos[5][None, None], sin[5][None, None]
    rope = V2Model.rope
    assert torch.equal(q, rope(None, zc(qkvg[:48].view(1, H, hd), qn), c, s)[0])
    assert torch.equal(k, rope(None, zc(qkvg[48:72].view(1, KV, hd), kn), c, s)[0])
    assert rule_for("qk_rope_ring/twin", KERNEL_RULES).check(gate, sigmoid(qkvg[96:]))


def test_bad_inputs_named():
    args = case(4, 2, 12, 8, 1, seed=0)
    with pytest.raises(QkRopeRingError, match=r"qkvg must be float32 .* = \[144\]"):
        qk_rope_ring_torch(args[0][:100], *args[1:], H=4, KV=2)
    with pytest.raises(QkRopeRingError, match="H=3, KV=2"):
        qk_rope_ring_torch(*args, H=3, KV=2)
    with pytest.raises(QkRopeRingError, match="pos must be an int64 device buffer"):
        qk_rope_ring_torch(*args[:5], args[5].int(), *args[6:], H=4, KV=2)


needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


# qk_rope_ring: each head is normed on its own; one q head and one k head tiny (eps decides
# there), the others ordinary, so a norm over the wrong span or without eps shows.
@pytest.mark.parametrize("name,impl", _impls(qk_rope_ring_torch, qk_rope_ring_triton))
def test_qk_rope_ring_where_eps_decides_one_head(name, impl):
    H, KV, hd = 4, 2, 12
    args = case(H, KV, hd, 8, 5, seed=31)
    x = args[0].clone()
    x[:hd] *= 1e-5                                   # q head 0
    x[H * hd + hd:H * hd + 2 * hd] *= 1e-5           # k head 1
    args[0] = x
    got = impl(*args, H=H, KV=KV)
    want = float64_prelude(*args, H=H, KV=KV)
    assert float(want[0][0].abs().max()) < 0.1 < float(want[0][1].abs().max())
    for part, a, b in zip(PARTS, got, want):
        assert rule_for(f"qk_rope_ring/{name}", KERNEL_RULES).check(a.cpu(), b), part
