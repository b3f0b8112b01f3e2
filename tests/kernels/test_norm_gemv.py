"""norm_gemv: an RMS norm folded into the product next to it, for dense float32 weights (plain or
Cactus-Quants pre-rotation rows) and for packed CQ codes. Twins and Triton kernels against
float64, kernels against twins, and the twin's norms against the model's, bit for bit."""
import math

import pytest
import torch

from kernels.norm_gemv import (NormGemvError, norm_cq_gemv_torch, norm_cq_gemv_triton,
                               norm_gemv_torch, norm_gemv_triton, rms_norm_torch, triton)
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for
from port.model import unit_rms, zc
from tests.kernels.test_cq_gemv import pack_by_hand

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")


def walsh128():
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < 128:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h / math.sqrt(128)


def float64_input(x, gain, kind, k_pad=None):
    """norm(x) in float64, zero-padded to k_pad and rotated per 128-group when k_pad is given."""
    v = x.cpu().double().reshape(-1)
    rms = torch.sqrt((v * v).mean() + 1e-6)
    xn = {"zc": lambda: (1 + gain.cpu().double()) * v / rms, "unit": lambda: v / rms,
          "none": lambda: v, "mul": lambda: v * gain.cpu().double()}[kind]()
    if k_pad is None:
        return xn
    xn = torch.cat([xn, torch.zeros(k_pad - xn.shape[0], dtype=torch.float64)])
    return (xn.reshape(-1, 128) @ walsh128()).reshape(-1)


def dense_case(shape, n_out, kind, rotate, seed, expand=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * 3
    if expand:                                   # the first layer's lanes: one row, n times
        x = x[:1].expand(*shape)
    k = x.numel()
    gain = 0.2 * torch.randn(k, generator=g) if kind in ("zc", "mul") else None
    k_w = -(-k // 128) * 128 if rotate else k
    w = torch.randn(n_out, k_w, generator=g) / math.sqrt(k_w)     # rows [out, in] as held
    to = lambda t: None if t is None else t.to(DEV)
    return to(x), to(gain), to(w).t(), k_w


DENSE = [((48,), 37, "zc", False, False), ((4, 48), 50, "unit", False, True),
         ((200,), 20, "zc", True, False), ((4, 48), 24, "unit", True, True),
         ((4, 12), 33, "none", False, False), ((4, 12), 30, "mul", False, False),
         ((150,), 20, "none", True, False), ((150,), 36, "mul", True, False)]


@pytest.mark.parametrize("name,impl", [("twin", norm_gemv_torch), pytest.param(
    "triton", norm_gemv_triton, marks=needs_triton)])
@pytest.mark.parametrize("shape,n_out,kind,rotate,expand", DENSE)
def test_dense_against_float64(name, impl, shape, n_out, kind, rotate, expand):
    x, gain, w_t, k_w = dense_case(shape, n_out, kind, rotate, seed=n_out, expand=expand)
    got = impl(x, gain, w_t, kind, rotate)
    assert got.device == x.device
    want = float64_input(x, gain, kind, k_w if rotate else None) @ w_t.cpu().double()
    assert rule_for(f"norm_gemv/{name}", KERNEL_RULES).check(got.cpu(), want)


def cq_case(bits, k, out, kind, seed):
    g = torch.Generator().manual_seed(seed)
    k_pad = -(-k // 128) * 128
    codes = torch.randint(0, 1 << bits, (out, k_pad), generator=g)
    norms = (torch.rand(out, k_pad // 128, generator=g) + 0.5).half()
    levels = torch.randn(1 << bits, generator=g) * 0.1
    x = torch.randn(k, generator=g)
    gain = 0.2 * torch.randn(k, generator=g) if kind in ("zc", "mul") else None
    args = [x, gain, kind, pack_by_hand(codes, bits), norms, levels, bits]
    return [a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args], codes


@pytest.mark.parametrize("name,impl", [("twin", norm_cq_gemv_torch), pytest.param(
    "triton", norm_cq_gemv_triton, marks=needs_triton)])
@pytest.mark.parametrize("bits,kind", [(2, "zc"), (3, "unit"), (4, "zc"), (2, "none"),
                                       (3, "mul")])
def test_cq_against_float64(name, impl, bits, kind):
    args, codes = cq_case(bits, 200, 37, kind, seed=bits)
    x, gain, _, _, norms, levels, _ = args
    got = impl(*args)
    lev = levels.cpu().double()[codes].reshape(codes.shape[0], -1, 128)
    xr = float64_input(x, gain, kind, codes.shape[1]).reshape(-1, 128)
    want = (norms.cpu().double() * (lev * xr).sum(-1)).sum(-1)
    assert got.device == x.device
    assert rule_for(f"norm_gemv/{name}", KERNEL_RULES).check(got.cpu(), want)


@needs_triton
def test_triton_matches_twin():
    x, gain, w_t, _ = dense_case((2, 150), 70, "zc", True, seed=11)   # 3 groups, 3 programs
    assert rule_for("norm_gemv/triton_vs_twin", KERNEL_RULES).check(
        norm_gemv_triton(x, gain, w_t, "zc", True).cpu(),
        norm_gemv_torch(x, gain, w_t, "zc", True).cpu())
    args, _ = cq_case(2, 300, 40, "unit", seed=12)
    assert rule_for("norm_gemv/triton_vs_twin", KERNEL_RULES).check(
        norm_cq_gemv_triton(*args).cpu(), norm_cq_gemv_torch(*args).cpu())
    for kind in ("none", "mul"):
        x, gain, w_t, _ = dense_case((3, 50), 40, kind, kind == "mul", seed=13)
        assert rule_for("norm_gemv/triton_vs_twin", KERNEL_RULES).check(
            norm_gemv_triton(x, gain, w_t, kind, kind == "mul").cpu(),
            norm_gemv_torch(x, gain, w_t, kind, kind == "mul").cpu())
        args, _ = cq_case(4, 130, 20, kind, seed=14)
        assert rule_for("norm_gemv/triton_vs_twin", KERNEL_RULES).check(
            norm_cq_gemv_triton(*args).cpu(), norm_cq_gemv_torch(*args).cpu())


def test_twin_norms_are_the_models_bit_for_bit():
    g = torch.Generator().manual_seed(3)
    x, gain, lanes = torch.randn(48, generator=g), torch.randn(48, generator=g), \
        torch.randn(4, 48, generator=g)
    assert torch.equal(rms_norm_torch(x, gain, "zc"), zc(x[None], gain)[0])
    assert torch.equal(rms_norm_torch(lanes, None, "unit"), unit_rms(lanes.reshape(1, -1))[0])


def test_bad_inputs_named():
    x, gain, w_t, _ = dense_case((48,), 10, "zc", False, seed=0)
    with pytest.raises(NormGemvError, match="kind='rms'"):
        norm_gemv_torch(x, gain, w_t, "rms")
    with pytest.raises(NormGemvError, match=r"kind 'zc' needs a float32 gain \[48\]"):
        norm_gemv_torch(x, None, w_t, "zc")
    with pytest.raises(NormGemvError, match="w_t has 48 rows; K=48 needs 128"):
        norm_gemv_torch(x, gain, w_t, "zc", rotate=True)
    args, _ = cq_case(2, 200, 5, "zc", seed=1)
    args[3] = args[3][:, :16]                      # 64 codes: fewer than K=200
    with pytest.raises(NormGemvError, match="hold 64 2-bit codes"):
        norm_cq_gemv_torch(*args)
    with pytest.raises(NormGemvError, match=r"kind 'none' takes no gain"):
        norm_gemv_torch(x, gain, w_t, "none")
    with pytest.raises(NormGemvError, match=r"kind 'mul' needs a float32 gain \[48\]"):
        norm_gemv_torch(x, gain[:47], w_t, "mul")
    buf = torch.zeros(20, device=DEV)
    for bad in (buf[:9], buf[::2], buf.double()[:10], buf[:10, None]):
        with pytest.raises(NormGemvError, match=r"out must be a contiguous float32 \[10\]"):
            norm_gemv_torch(x, gain, w_t, "zc", out=bad)
        if triton:
            with pytest.raises(NormGemvError, match=r"out must be a contiguous float32 \[10\]"):
                norm_gemv_triton(x, gain, w_t, "zc", out=bad)
    assert torch.equal(buf, torch.zeros(20, device=DEV))


@pytest.mark.parametrize("name", ["twin", pytest.param("triton", marks=needs_triton)])
def test_out_writes_a_slice_and_nothing_else(name):
    """out= is where y lands (e.g. one part of a q|k|v buffer): the same bits as a fresh y, and
    the rest of the buffer untouched."""
    dense = {"twin": norm_gemv_torch, "triton": norm_gemv_triton}[name]
    packed = {"twin": norm_cq_gemv_torch, "triton": norm_cq_gemv_triton}[name]
    x, gain, w_t, _ = dense_case((4, 12), 20, "mul", False, seed=4)
    buf = torch.full((50,), 7.0, device=DEV)
    y = dense(x, gain, w_t, "mul", out=buf[10:30])
    assert y.data_ptr() == buf[10:].data_ptr()
    assert torch.equal(buf[10:30], dense(x, gain, w_t, "mul"))
    assert torch.equal(buf[:10], torch.full((10,), 7.0, device=DEV))
    assert torch.equal(buf[30:], torch.full((20,), 7.0, device=DEV))
    args, _ = cq_case(3, 150, 17, "zc", seed=6)
    buf = torch.full((40,), 7.0, device=DEV)
    packed(*args, out=buf[3:20])
    assert torch.equal(buf[3:20], packed(*args))
    assert torch.equal(torch.cat([buf[:3], buf[20:]]), torch.full((23,), 7.0, device=DEV))


@pytest.mark.parametrize("bits", [2, 4, 5])                 # 5 = ternary, stored as crumbs
def test_packed_path_reads_the_ports_cq_weights(bits):
    """The kernels' packed contract is CqWeight's storage: the codes of a real quantised matrix,
    on the device under test, give CqWeight's own product of the normed input."""
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(bits)
    cw = CqWeight.from_dense(torch.randn(40, 200, generator=g) * 0.05, bits)
    x, gain = torch.randn(200, generator=g), 0.2 * torch.randn(200, generator=g)
    want = cw.matvec(zc(x[None], gain)[0])
    ops = cw.kernel_operands(DEV)
    assert all(t.device.type == torch.device(DEV).type for t in ops[:3])
    for name, impl in [("twin", norm_cq_gemv_torch)] + \
            ([("triton", norm_cq_gemv_triton)] if triton else []):
        got = impl(x.to(DEV), gain.to(DEV), "zc", *ops).cpu()
        assert rule_for("norm_gemv/triton_vs_twin", KERNEL_RULES).check(got, want), name


@needs_triton
@pytest.mark.parametrize("kind", ["zc", "mul"])
def test_one_launch_and_no_aten_op(kind):
    """In the decode body's layout (expanded lanes, [in, out] weight views, packed operands as
    stored, out= a slice) each product is its kernel's launch and nothing else."""
    from tests.kernels.test_sparse_attn import _launches_of
    x, gain, w_t, _ = dense_case((4, 48), 30, kind, True, seed=2, expand=True)
    buf = torch.empty(64, device=DEV)
    kernels, ops = _launches_of(lambda: norm_gemv_triton(x, gain, w_t, kind, True,
                                                         out=buf[4:34]))
    assert kernels == ["_norm_gemv_kernel"] and ops == []
    args, _ = cq_case(3, 150, 20, kind, seed=3)
    kernels, ops = _launches_of(lambda: norm_cq_gemv_triton(*args, out=buf[40:60]))
    assert kernels == ["_norm_cq_gemv_kernel"] and ops == []


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


# ---------------------------------------------------------------- eps decides the norm
# x of size 1e-5: mean(x^2) ~ 1e-10, four orders under eps = 1e-6, so the norm's output is
# ~x / 1e-3, not a unit vector: an implementation that drops or misplaces eps is far off.
def _tiny_x(shape, seed, scale=1e-5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def _f64_norm(x, gain, kind, eps):
    v = x.cpu().double().reshape(-1)
    r = torch.sqrt((v * v).mean() + eps)
    return (1 + gain.cpu().double()) * v / r if kind == "zc" else v / r


@pytest.mark.parametrize("name,impl", _impls(norm_gemv_torch, norm_gemv_triton))
@pytest.mark.parametrize("kind,eps", [("zc", 1e-6), ("unit", 1e-6), ("zc", 1e-2)])
def test_norm_gemv_where_eps_decides(name, impl, kind, eps):
    g = torch.Generator().manual_seed(1)
    x = _tiny_x((2, 24), seed=2)
    gain = 0.2 * torch.randn(48, generator=g) if kind == "zc" else None
    w = torch.randn(20, 48, generator=g) / math.sqrt(48)
    got = impl(x.to(DEV), None if gain is None else gain.to(DEV), w.to(DEV).t(), kind,
               eps=eps)
    want = _f64_norm(x, gain if gain is not None else torch.zeros(48), kind, eps) @ \
        w.double().t()
    # the scale: eps rules, so |xn| ~ |x| / sqrt(eps), far below a unit vector's
    assert float(want.abs().max()) < 0.1
    assert rule_for(f"norm_gemv/{name}", KERNEL_RULES).check(got.cpu(), want)


@pytest.mark.parametrize("name,impl", _impls(norm_gemv_torch, norm_gemv_triton))
def test_norm_gemv_of_a_zero_vector_is_zero_not_nan(name, impl):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(10, 48, generator=g)
    for kind, gain in (("zc", torch.randn(48, generator=g)), ("unit", None)):
        got = impl(torch.zeros(48, device=DEV), None if gain is None else gain.to(DEV),
                   w.to(DEV).t(), kind)
        assert torch.equal(got.cpu(), torch.zeros(10)), kind


@pytest.mark.parametrize("name,impl", _impls(norm_cq_gemv_torch, norm_cq_gemv_triton))
@pytest.mark.parametrize("bits", [2, 5])                          # 5: ternary, as crumbs
def test_packed_norm_gemv_where_eps_decides(name, impl, bits):
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(bits)
    cw = CqWeight.from_dense(torch.randn(12, 100, generator=g) * 0.05, bits)
    x, gain = _tiny_x((100,), seed=4), 0.2 * torch.randn(100, generator=g)
    want = cw.matvec(((1 + gain) * x / torch.sqrt((x * x).mean() + 1e-6)))
    assert float(want.abs().max()) > 0
    got = impl(x.to(DEV), gain.to(DEV), "zc", *cw.kernel_operands(DEV)).cpu()
    assert rule_for("norm_gemv/triton_vs_twin", KERNEL_RULES).check(got, want)
