"""The native CPU step (kernels/native, port/native.py): its kernels against float64, its
batch invariance, the model against the torch port, and the no-allocation step.

The model-level properties (ring == full cache, no-op trace == step, prefill_batch ==
step_prefill, every ladder point against the reference, bad inputs) run for backend="native"
through the parametrised `tiny_model` fixture of tests/test_port.py."""
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, strategies as st

from kernels import native
from ladder.rules import KERNEL_RULES, PORT_RULES, max_rel, rule_for
from port.batch import V2Batch
from port.model import V2Model, log_sinkhorn
from reference import cact

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_native_library_builds_here():
    # CI machines of this kind have gcc: the native tests below must not silently skip.
    assert native.available()


@given(st.integers(1, 13), st.integers(1, 70), st.integers(1, 9), st.integers(0, 2**31 - 1))
def test_gemm_rows_do_not_depend_on_the_batch(m, k, n, seed):
    g = torch.Generator().manual_seed(seed)
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    y = native.gemm(x, w)
    for r in range(m):
        assert torch.equal(native.gemm(x[r:r + 1], w)[0], y[r])
    assert torch.equal(native.gemm(x.flip(0), w).flip(0), y)    # nor on the row's slot


@pytest.mark.parametrize("k", [7, 64, 512, 2048])
def test_gemm_against_float64(k):
    g = torch.Generator().manual_seed(k)
    x, w = torch.randn(9, k, generator=g), torch.randn(33, k, generator=g)
    exact = x.double() @ w.double().t()
    err, torch_err = max_rel(native.gemm(x, w), exact), max_rel(x @ w.t(), exact)
    assert rule_for("native/gemm", KERNEL_RULES).check(native.gemm(x, w), exact), err
    print(f"gemm K={k}: native {err:.2e}, torch f32 {torch_err:.2e} vs float64")


@given(st.integers(2, 6), st.floats(0.1, 30.0), st.integers(0, 2**31 - 1))
def test_sinkhorn_against_the_torch_port_and_float64(n, spread, seed):
    z = torch.randn(n, n, generator=torch.Generator().manual_seed(seed)) * spread
    got = native.sinkhorn(z)
    rule = rule_for("native/sinkhorn", KERNEL_RULES)
    assert rule.check(got, log_sinkhorn(z.double()).float()), max_rel(got, log_sinkhorn(z))
    assert rule.check(got, log_sinkhorn(z))
    assert torch.isfinite(got).all()


def test_kernel_inputs_are_checked():
    with pytest.raises(ValueError, match="gemm needs x"):
        native.gemm(torch.zeros(2, 3), torch.zeros(4, 5))
    with pytest.raises(ValueError, match="float32 CPU"):
        native.gemm(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="square"):
        native.sinkhorn(torch.zeros(2, 3))


def test_a_missing_compiler_is_a_clear_error(tmp_path):
    code = ("import kernels.native as n\n"
            "try:\n    n.lib()\nexcept n.NativeUnavailable as e:\n    print('refused:', e)\n")
    env = dict(os.environ, CC=str(tmp_path / "no-such-cc"), NEEDLE_NATIVE_CACHE=str(tmp_path))
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=120)
    assert "refused:" in out.stdout and "no-such-cc" in out.stdout, out.stdout + out.stderr


@pytest.fixture(scope="module")
def pair(tiny_cfg, tiny_params):
    return (V2Model.from_params(tiny_params, tiny_cfg),
            V2Model.from_params(tiny_params, tiny_cfg, backend="native"))


def test_native_matches_the_torch_port_past_three_windows(tiny_cfg, pair):
    a, b = pair
    sa, sb = a.make_state(), b.make_state()
    seq = torch.randint(1, 256, (40,), generator=torch.Generator().manual_seed(5)).tolist()
    for t in seq:
        la, lb = a.step(t, sa), b.step(t, sb)
        assert rule_for("port/logits", PORT_RULES).check(lb, la), max_rel(lb, la)
        assert torch.equal(la.argmax(), lb.argmax())
    assert not torch.equal(sa.lanes, sb.lanes)           # really two computations


def test_native_step_allocates_no_tensor(pair):
    _, b = pair
    state = b.make_state()
    b.prefill_batch(list(range(1, 12)), state, V2Batch(b, 4))
    b.step(3, state)                                      # bindings and scratch made once
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        b.step(4, state)
        b.step_prefill(5, state)
    allocs = [e.key for e in prof.key_averages() if e.cpu_memory_usage != 0]
    assert allocs == []


def test_native_from_cq_runs_on_the_dequantised_matrices(tiny_cfg, tiny_params):
    f = cact.build_cact(tiny_params, tiny_cfg)
    nat = V2Model.from_cactfile(f, "cq", backend="native")
    dense = V2Model.from_params(f.params, tiny_cfg)
    sa, sb = nat.make_state(), dense.make_state()
    for t in [5, 9, 200, 3, 3, 17, 90, 1, 2, 4]:
        assert rule_for("port/logits", PORT_RULES).check(nat.step(t, sa), dense.step(t, sb))


def test_native_refuses_what_it_cannot_run(tiny_cfg, tiny_params):
    with pytest.raises(ValueError, match="runs eagerly on the CPU"):
        V2Model.from_params(tiny_params, tiny_cfg, backend="native", decode="graph")
    m = V2Model.from_params(tiny_params, tiny_cfg, weights="dense")
    with pytest.raises(ValueError, match="dense float32"):
        from port.native import NativeModel
        m.w["rotate"] = True
        NativeModel(tiny_cfg, m.w)


def test_native_probe_heads_match_the_torch_port(tiny_cfg, pair):
    a, b = pair
    t = torch.randint(1, 256, (18,), generator=torch.Generator().manual_seed(9))
    t[-3:] = tiny_cfg.pad_token_id
    rule = rule_for("port/heads", PORT_RULES)
    assert rule.check(b.encode_contrastive(t), a.encode_contrastive(t))
    assert rule.check(b.confidence(t)[None], a.confidence(t)[None])
