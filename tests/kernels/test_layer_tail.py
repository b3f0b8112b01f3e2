"""layer_tail: attention residual, Hadamard MLP and the mHC merge in one launch. Twin and Triton
kernel against float64, the kernel against the twin."""
import math

import pytest
import torch

from kernels.layer_tail import LayerTailError, layer_tail_torch, layer_tail_triton, triton
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for
from tests.kernels.test_hadamard_mlp import float64_mlp

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def case(n, d, hada_n, seed, expand=False):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)                        # noqa: E731
    X = r(1, d).expand(n, d) if expand else r(n, d)
    args = [r(d) * 3, r(d), r(d), X, torch.softmax(r(n, n), 0), 2 * torch.sigmoid(r(n)),
            0.2 * r(d), torch.tensor(0.7), 0.2 * r(d), *(1 + 0.3 * r(hada_n) for _ in range(3))]
    return [t.to(DEV) for t in args]


def float64_tail(a, bx, u, X, P, hpost, post, attn_gate, pre_hada, d1, d2, d3, eps=1e-6):
    a, bx, u, X, P, hpost, post, ag = (t.cpu().double()
                                       for t in (a, bx, u, X, P, hpost, post, attn_gate))
    z = bx + ag * (1 + post) * a / math.sqrt(float((a * a).mean()) + eps)
    y = z + float64_mlp(z, pre_hada, d1, d2, d3, eps) - u
    return P @ X + hpost[:, None] * y[None, :], y


IMPLS = [("twin", layer_tail_torch), pytest.param(
    "triton", layer_tail_triton, marks=pytest.mark.skipif(triton is None, reason="no Triton"))]


@pytest.mark.parametrize("name,impl", IMPLS)
@pytest.mark.parametrize("n,d,hada_n,expand", [(4, 48, 64, False), (4, 40, 64, True),
                                               (3, 100, 128, False)])
def test_against_float64(name, impl, n, d, hada_n, expand):
    args = case(n, d, hada_n, seed=n + d, expand=expand)
    got, y = impl(*args)
    assert got.device == args[0].device and got.shape == (n, d) and y.shape == (d,)
    want, want_y = float64_tail(*args)
    assert rule_for(f"layer_tail/{name}", KERNEL_RULES).check(got.cpu(), want)
    assert rule_for(f"layer_tail/{name}", KERNEL_RULES).check(y.cpu(), want_y)


@pytest.mark.skipif(triton is None, reason="no Triton")
def test_triton_matches_twin():
    args = case(4, 200, 256, seed=8)
    for a, b in zip(layer_tail_triton(*args), layer_tail_torch(*args)):
        assert rule_for("layer_tail/triton_vs_twin", KERNEL_RULES).check(a.cpu(), b.cpu())


@pytest.mark.parametrize("name,impl", IMPLS)
def test_out_takes_the_lanes(name, impl):
    """out= receives X' (the same bits as a fresh buffer); nothing else of it is written."""
    args = case(3, 40, 64, seed=4)
    buf = torch.full((5, 40), 7.0, device=DEV)
    new, y = impl(*args, out=buf[1:4])
    assert new.data_ptr() == buf[1].data_ptr()
    fresh, fresh_y = impl(*args)
    assert torch.equal(buf[1:4], fresh) and torch.equal(y, fresh_y)
    assert torch.equal(buf[[0, 4]], torch.full((2, 40), 7.0, device=DEV))


@pytest.mark.skipif(triton is None, reason="no Triton")
def test_one_launch_and_no_aten_op():
    from tests.kernels.test_sparse_attn import _launches_of
    args = case(4, 48, 64, seed=3, expand=True)
    out = torch.empty(4, 48, device=DEV)
    kernels, ops = _launches_of(lambda: layer_tail_triton(*args, out=out))
    assert kernels == ["_layer_tail_kernel"] and ops == []


def test_bad_inputs_named():
    args = case(4, 48, 64, seed=0)
    with pytest.raises(LayerTailError, match=r"P must be float32 \[4, 4\]"):
        layer_tail_torch(*args[:4], args[4][:3], *args[5:])
    with pytest.raises(LayerTailError, match=r"X must be float32 \[n, d=48\]"):
        layer_tail_torch(*args[:3], args[3][:, :40], *args[4:])
    with pytest.raises(LayerTailError, match=r"attn_gate must be float32 \[\]"):
        layer_tail_torch(*args[:7], args[7][None], *args[8:])
    buf = torch.zeros(8, 48, device=DEV)
    impls = [layer_tail_torch] + ([layer_tail_triton] if triton else [])
    for impl in impls:
        for bad in (buf[:3], buf[:4, :40], buf[:4].double(), buf[::2]):
            with pytest.raises(LayerTailError, match=r"out must be a contiguous float32 \[4, 48\]"):
                impl(*args, out=bad)
        X = buf[:4]
        with pytest.raises(LayerTailError, match="out must not overlap X"):
            impl(*args[:3], X, *args[4:], out=buf[3:7])
    assert torch.equal(buf, torch.zeros(8, 48, device=DEV))


needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


# ---------------------------------------------------------------- eps decides the norm
# x of size 1e-5: mean(x^2) ~ 1e-10, four orders under eps = 1e-6, so the norm's output is
# ~x / 1e-3, not a unit vector: an implementation that drops or misplaces eps is far off.
def _tiny_x(shape, seed, scale=1e-5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


@pytest.mark.parametrize("name,impl", _impls(layer_tail_torch, layer_tail_triton))
def test_layer_tail_where_eps_decides(name, impl):
    """The attention output a is tiny: its ZC norm is decided by eps."""
    args = case(3, 40, 64, seed=9)
    args[0] = _tiny_x((40,), seed=10).to(DEV)
    got, y = impl(*args)
    want, want_y = float64_tail(*args)
    rule = rule_for(f"layer_tail/{name}", KERNEL_RULES)
    assert rule.check(got.cpu(), want) and rule.check(y.cpu(), want_y)


@pytest.mark.parametrize("name,impl", _impls(layer_tail_torch, layer_tail_triton))
def test_layer_tail_out_at_an_offset_of_a_flat_buffer(name, impl):
    """out= a [n, d] view starting mid-buffer (not on a row boundary of any [., d] layout);
    X read through strides (a transposed view)."""
    args = case(3, 40, 64, seed=12)
    args[3] = args[3].t().contiguous().t()                          # X: strides (1, 3)
    assert args[3].stride() == (1, 3)
    fresh, fresh_y = impl(*args)
    buf = torch.full((5 + 3 * 40 + 4,), 7.0, device=DEV)
    out = buf[5:5 + 120].view(3, 40)
    got, y = impl(*args, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(out, fresh) and torch.equal(y, fresh_y)
    assert torch.equal(buf[:5], torch.full((5,), 7.0, device=DEV))
    assert torch.equal(buf[125:], torch.full((4,), 7.0, device=DEV))
    want, _ = float64_tail(*args)
    assert rule_for(f"layer_tail/{name}", KERNEL_RULES).check(got.cpu(), want)
