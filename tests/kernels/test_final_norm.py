"""final_norm: the lane mean and the final ZC norm in one launch. Twin and Triton kernel against
float64, the kernel against the twin, the twin against the model's finish (bit for bit), and
bad inputs."""
import pytest
import torch

from kernels.final_norm import FinalNormError, final_norm_torch, final_norm_triton, triton
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")
IMPLS = [("twin", final_norm_torch),
         pytest.param("triton", final_norm_triton, marks=needs_triton)]


def case(n, d, seed, transposed=False):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(d, n, generator=g).t() if transposed else torch.randn(n, d, generator=g)
    X = X * 3 + 0.5                                      # a non-zero mean per column
    gain = 0.2 * torch.randn(d, generator=g)
    return X.to(DEV), gain.to(DEV)


def float64_finish(X, gain):
    X, gain = X.cpu().double(), gain.cpu().double()
    mean = X.mean(0)
    return mean, (1 + gain) * mean / torch.sqrt((mean * mean).mean() + 1e-6)


@pytest.mark.parametrize("name,impl", IMPLS)
@pytest.mark.parametrize("n,d,transposed", [(4, 48, False), (4, 48, True), (3, 130, False),
                                            (1, 20, False)])
def test_against_float64(name, impl, n, d, transposed):
    X, gain = case(n, d, seed=n * d, transposed=transposed)
    hidden = torch.full((d,), 9.0, device=DEV)
    mean = impl(X, gain, hidden)
    want_mean, want_hidden = float64_finish(X, gain)
    rule = rule_for(f"final_norm/{name}", KERNEL_RULES)
    assert mean.device == X.device and mean.shape == (d,)
    assert rule.check(mean.cpu(), want_mean) and rule.check(hidden.cpu(), want_hidden)


@needs_triton
def test_triton_matches_twin():
    X, gain = case(4, 300, seed=5)
    h_twin, h_kernel = torch.empty(300, device=DEV), torch.empty(300, device=DEV)
    rule = rule_for("final_norm/triton_vs_twin", KERNEL_RULES)
    assert rule.check(final_norm_triton(X, gain, h_kernel).cpu(),
                      final_norm_torch(X, gain, h_twin).cpu())
    assert rule.check(h_kernel.cpu(), h_twin.cpu())


def test_twin_is_the_models_finish_bit_for_bit(tiny_cfg, tiny_params):
    """The torch backend keeps its bits when it uses the twin: port/model.py's finish."""
    from port.model import V2Model
    model = V2Model.from_params(tiny_params, tiny_cfg)
    state = model.make_state()
    X, _ = case(tiny_cfg.mhc_lanes, tiny_cfg.d_model, seed=3)
    model.finish(X.cpu()[None], state, want_logits=False)
    hidden = torch.empty(tiny_cfg.d_model)
    mean = final_norm_torch(X.cpu(), model.final_norm, hidden)
    assert torch.equal(hidden, state.hidden) and torch.equal(mean, X.cpu().mean(0))


@needs_triton
def test_one_launch_and_no_aten_op():
    from tests.kernels.test_sparse_attn import _launches_of
    X, gain = case(4, 48, seed=1)
    hidden = torch.empty(2, 48, device=DEV)[1]                 # a row of a bigger buffer
    kernels, ops = _launches_of(lambda: final_norm_triton(X[:1].expand(4, 48), gain, hidden))
    assert kernels == ["_final_norm_kernel"] and ops == []


def test_bad_inputs_named():
    X, gain = case(4, 48, seed=0)
    hidden = torch.zeros(48, device=DEV)
    for impl in [final_norm_torch] + ([final_norm_triton] if triton else []):
        with pytest.raises(FinalNormError, match=r"X must be non-empty float32 \[n, d\]"):
            impl(X.double(), gain, hidden)
        with pytest.raises(FinalNormError, match=r"gain must be float32 \[d=48\]"):
            impl(X, gain[:40], hidden)
        with pytest.raises(FinalNormError, match=r"hidden_out must be float32 \[d=48\]"):
            impl(X, gain, torch.zeros(4, 48, device=DEV))
    assert torch.equal(hidden, torch.zeros(48, device=DEV))


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


# ---------------------------------------------------------------- eps decides the norm
# x of size 1e-5: mean(x^2) ~ 1e-10, four orders under eps = 1e-6, so the norm's output is
# ~x / 1e-3, not a unit vector: an implementation that drops or misplaces eps is far off.
def _tiny_x(shape, seed, scale=1e-5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


@pytest.mark.parametrize("name,impl", _impls(final_norm_torch, final_norm_triton))
def test_final_norm_where_eps_decides_and_a_zero_mean(name, impl):
    g = torch.Generator().manual_seed(5)
    X, gain = _tiny_x((4, 40), seed=6), 0.2 * torch.randn(40, generator=g)
    hidden = torch.empty(40, device=DEV)
    impl(X.to(DEV), gain.to(DEV), hidden)
    mean = X.double().mean(0)
    want = (1 + gain.double()) * mean / torch.sqrt((mean * mean).mean() + 1e-6)
    assert float(want.abs().max()) < 0.1
    assert rule_for(f"final_norm/{name}", KERNEL_RULES).check(hidden.cpu(), want)
    # lanes that cancel: a zero mean gives a zero hidden row, not NaN
    Z = torch.stack([X[0], -X[0]]).to(DEV)
    impl(Z, gain.to(DEV), hidden)
    assert torch.equal(hidden.cpu(), torch.zeros(40))


# ---------------------------------------------------------------- strided and offset outputs
@pytest.mark.parametrize("name,impl", _impls(final_norm_torch, final_norm_triton))
def test_final_norm_writes_a_strided_hidden_row_and_nothing_else(name, impl):
    g = torch.Generator().manual_seed(11)
    X = (torch.randn(40, 3, generator=g).t() * 3).to(DEV)          # strided lanes too
    gain = (0.2 * torch.randn(40, generator=g)).to(DEV)
    fresh = torch.empty(40, device=DEV)
    impl(X, gain, fresh)
    buf = torch.full((2 * 40 + 1,), 7.0, device=DEV)
    hidden = buf[1::2]                                             # stride 2, offset 1
    assert hidden.stride() == (2,) and hidden.storage_offset() == 1
    impl(X, gain, hidden)
    assert torch.equal(hidden, fresh)
    assert torch.equal(buf[0::2], torch.full((41,), 7.0, device=DEV))
