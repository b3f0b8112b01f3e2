"""cq_gemv: twin and Triton kernel against float64 from the codes, with bitstreams packed here
by plain integer arithmetic (an independent packer), at every stored width."""
import pytest
import torch

from kernels.cq_gemv import CqGemvError, cq_gemv_torch, cq_gemv_triton, triton, unpack_codes
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for
from kernels.norm_gemv import norm_cq_gemv_torch, norm_cq_gemv_triton

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def pack_by_hand(codes, bits):
    rows = []
    for row in codes.tolist():
        acc = 0
        for k, c in enumerate(row):
            acc |= c << (k * bits)
        rows.append(list(acc.to_bytes(len(row) * bits // 8, "little")))
    return torch.tensor(rows, dtype=torch.uint8)


def case(bits, out=37, in_pad=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 1 << bits, (out, in_pad), generator=g)
    norms = (torch.rand(out, in_pad // 128, generator=g) + 0.5).half()
    levels = torch.randn(1 << bits, generator=g) * 0.1
    xr = torch.randn(in_pad, generator=g)
    return codes, pack_by_hand(codes, bits), norms, levels, xr


@pytest.mark.parametrize("bits", [2, 3, 4])
def test_unpack_inverts_the_hand_packer(bits):
    codes, packed, *_ = case(bits)
    assert torch.equal(unpack_codes(packed, bits, codes.shape[1]), codes)


@pytest.mark.parametrize("bits", [2, 3, 4])
@pytest.mark.parametrize("impl", ["torch", pytest.param(
    "triton", marks=pytest.mark.skipif(triton is None, reason="no Triton"))])
def test_against_float64(bits, impl):
    codes, packed, norms, levels, xr = case(bits, seed=bits)
    lev = levels.double()[codes].reshape(codes.shape[0], -1, 128)
    want = (norms.double() * (lev * xr.double().reshape(-1, 128)).sum(-1)).sum(-1)
    fn = cq_gemv_torch if impl == "torch" else cq_gemv_triton
    got = fn(packed.to(DEV), norms.to(DEV), levels.to(DEV), bits, xr.to(DEV)).cpu()
    assert rule_for(f"{impl}/cq_gemv", KERNEL_RULES).check(got, want)


def test_bad_shapes_named():
    codes, packed, norms, levels, xr = case(3)
    with pytest.raises(CqGemvError, match="bits=5"):
        cq_gemv_torch(packed, norms, levels, 5, xr)
    with pytest.raises(CqGemvError, match=r"packed must be uint8 \[out, 96\]"):
        cq_gemv_torch(packed[:, :90], norms, levels, 3, xr)
    with pytest.raises(CqGemvError, match="levels has 4 entries"):
        cq_gemv_torch(packed, norms, levels[:4], 3, xr)


@pytest.mark.skipif(triton is None, reason="no Triton")
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_triton_matches_torch_twin(bits):
    _, packed, norms, levels, xr = case(bits, out=50, in_pad=384, seed=10 + bits)
    args = (packed.to(DEV), norms.to(DEV), levels.to(DEV), bits, xr.to(DEV))
    assert rule_for("triton_vs_torch/cq_gemv", KERNEL_RULES).check(cq_gemv_triton(*args).cpu(),
                                                                   cq_gemv_torch(*args).cpu())


needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


@pytest.mark.parametrize("name,impl", _impls(norm_cq_gemv_torch, norm_cq_gemv_triton))
def test_packed_product_out_at_an_offset_keeps_its_neighbours(name, impl):
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(13)
    cw = CqWeight.from_dense(torch.randn(9, 100, generator=g) * 0.05, 5)
    x = torch.randn(100, generator=g).to(DEV)
    fresh = impl(x, None, "unit", *cw.kernel_operands(DEV))
    buf = torch.full((30,), 7.0, device=DEV)
    impl(x, None, "unit", *cw.kernel_operands(DEV), out=buf[13:22])
    assert torch.equal(buf[13:22], fresh)
    assert torch.equal(torch.cat([buf[:13], buf[22:]]), torch.full((21,), 7.0, device=DEV))
