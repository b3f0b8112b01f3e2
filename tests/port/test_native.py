"""The native CPU step (kernels/native, port/native.py): its kernels against float64, its
batch invariance, the model against the torch port, and the no-allocation step.

The model-level properties (ring == full cache, no-op trace == step, prefill_batch ==
step_prefill, every ladder point against the reference, bad inputs) run for backend="native"
through the parametrised `tiny_model` fixture of tests/port/test_model.py."""
from tests import paths
import os
import subprocess
import sys

import pytest
import torch
from hypothesis import given, strategies as st

from kernels import native
from ladder.engine.rules import KERNEL_RULES, PORT_RULES
from ladder.sides.reference_rules import max_rel, rule_for
from port.batch import V2Batch
from port.model import V2Model, log_sinkhorn
from reference import cact

ROOT = paths.ROOT


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


_DIGEST = """
import hashlib, torch
from kernels import native
from port.model import V2Model
from reference.config import V2Config
from reference.params import init_params
cfg = V2Config.preset("tiny")
h = hashlib.sha256()
for weights in ("dense", "cq"):
    m = V2Model.from_params(init_params(cfg, 7, perturbed=True), cfg, weights=weights,
                            backend="native")
    s = m.make_state()
    for t in [5, 9, 200, 3, 3, 17, 90, 1, 2, 4, 77, 12]:
        h.update(m.step(t, s).numpy().tobytes())
    h.update(s.k.numpy().tobytes())
g = torch.Generator().manual_seed(0)
x, w = torch.randn(9, 77, generator=g), torch.randn(10, 77, generator=g)
h.update(native.gemm(x, w).numpy().tobytes())
h.update(native.sinkhorn(torch.randn(4, 4, generator=g) * 5).numpy().tobytes())
from port.cq import CqWeight, _level_table
for bits, rows, k in ((2, 37, 300), (2, 64, 512), (4, 37, 300), (4, 64, 2048)):
    cw = CqWeight.from_dense(torch.randn(rows, k, generator=g), bits, "dense")
    pk = native.PackedCq(cw.packed, cw.norms, _level_table(bits), cw.store_bits, k)
    for m in (1, 5):                 # one token (the fused rows), a chunk (decoded blocks)
        h.update(native.cq_product([pk, pk], torch.randn(m, k, generator=g)).numpy().tobytes())
print(h.hexdigest())
"""


@pytest.mark.slow
def test_bits_do_not_depend_on_the_vector_width(tmp_path):
    # The same source built for plain x86-64 (no AVX: the scalar lanes and fmaf), for AVX2
    # only (x86-64-v3: cq_packed.c's 8-lane rows) and for this machine (on an AVX-512 CPU,
    # cq_wide.c's 16-lane rows) gives the same bits. x86-64-v3 and native are one kernel
    # set on an AVX2-only CPU; the test still compares three builds there.
    if os.uname().machine != "x86_64":
        pytest.skip("the portable build is x86-64")
    if "avx2" not in open("/proc/cpuinfo").read():
        pytest.skip("the x86-64-v3 build needs an AVX2 CPU")
    run = lambda env: subprocess.run([sys.executable, "-c", _DIGEST], cwd=ROOT, text=True,
                                     capture_output=True, timeout=600,
                                     env=dict(os.environ, NEEDLE_NATIVE_CACHE=str(tmp_path),
                                              **env))
    wide, avx2, plain = (run({}), run({"NEEDLE_NATIVE_MARCH": "x86-64-v3"}),
                         run({"NEEDLE_NATIVE_MARCH": "x86-64"}))
    assert wide.returncode == avx2.returncode == plain.returncode == 0, \
        wide.stderr + avx2.stderr + plain.stderr
    assert len(os.listdir(tmp_path)) == 3                  # really three builds
    assert wide.stdout == avx2.stdout == plain.stdout


def test_threads_change_no_bit():
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(7, 300, generator=g), torch.randn(1000, 300, generator=g)
    cw = CqWeight.from_dense(torch.randn(600, 300, generator=g), 2, "dense")
    pk = _packed(cw)
    one = native.gemm(x, w), native.cq_product([pk], x)
    try:
        native.set_threads(2)
        two = native.gemm(x, w), native.cq_product([pk], x)
    finally:
        native.set_threads(1)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


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


def test_a_strided_logits_buffer_is_refused_before_any_change(tiny_cfg, pair):
    from port.model import StepError
    _, b = pair
    state = b.make_state()
    b.step(3, state)
    before = [t.clone() for t in (state.k, state.v, state.vraw, state.lanes, state.hidden)]
    with pytest.raises(StepError, match="strides"):
        b.step(4, state, logits=torch.empty(2 * tiny_cfg.vocab_size)[::2])
    assert state.history() == [3]
    assert all(torch.equal(x, y) for x, y in zip(before, (state.k, state.v, state.vraw,
                                                          state.lanes, state.hidden)))


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


@pytest.fixture(scope="module")
def packed(tiny_cfg, tiny_params):
    f = cact.build_cact(tiny_params, tiny_cfg)
    return f, V2Model.from_cactfile(f, "cq", backend="native")


def test_native_cq_reads_the_packed_codes(tiny_cfg, packed):
    f, nat = packed
    assert nat.form == "packed" and nat.embedding.table is None and nat.mhc.router is None
    assert all(lw.qkvg is None and lw.out is None for lw in nat.layers)
    assert all(s.tables is None and s.kv is None for s in nat.engrams)
    codes = sum(s.packed.numel() for s in f.slots if s.dtype == cact.DTYPE_CQ)
    held = sum(m.packed.numel() for m in nat._native._packed)
    assert held == codes                           # every matrix, each code once
    torch_cq = V2Model.from_cactfile(f, "cq")
    dense = V2Model.from_params(f.params, tiny_cfg)        # the reference's dequantised weights
    sa, sb, sc = nat.make_state(), torch_cq.make_state(), dense.make_state()
    for t in torch.randint(1, 256, (20,), generator=torch.Generator().manual_seed(2)).tolist():
        la, lb, lc = nat.step(t, sa), torch_cq.step(t, sb), dense.step(t, sc)
        assert rule_for("port/logits", PORT_RULES).check(la, lc), max_rel(la, lc)
        assert rule_for("port/logits", PORT_RULES).check(lb, lc)


@given(st.lists(st.integers(0, 255), min_size=1, max_size=24), st.integers(1, 9),
       st.integers(1, 8))
def test_native_cq_prefill_and_ring_properties(packed, tokens, cap, window):
    _, nat = packed
    a, b = nat.make_state(), nat.make_state()
    for t in tokens:
        nat.step_prefill(t, a)
    nat.prefill_batch(tokens, b, V2Batch(nat, cap))
    assert torch.equal(a.k, b.k) and torch.equal(a.vraw, b.vraw) and torch.equal(a.lanes, b.lanes)
    assert torch.equal(nat.step(7, a), nat.step(7, b))
    ring, full = nat.make_state(), nat.make_state_full_causal()
    ring.set_kv_window(window, nat)
    full.set_kv_window(window, nat)
    for t in tokens:
        assert torch.equal(nat.step(t, ring), nat.step(t, full))


def _packed(cw, **band):
    from port.cq import _level_table
    return native.PackedCq(cw.packed, cw.norms, _level_table(cw.bits), cw.store_bits,
                           cw.in_features, **band)


@pytest.mark.parametrize("bits", [2, 3, 4, cact.TERNARY])
def test_packed_product_is_the_dense_product_of_the_decoded_rows(bits):
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(bits)
    cw = CqWeight.from_dense(torch.randn(70, 300, generator=g), bits, "dense")
    pk = _packed(cw)
    x = torch.randn(5, 300, generator=g)
    y = native.cq_product([pk, pk], x)                     # two matrices, one input
    assert torch.equal(y[:, :70], y[:, 70:])
    # Bit for bit: the codes decode to CqWeight's float32 pre-rotation rows (level * norm)
    # and the product is nat_gemm's, on the C side's rotation of the input.
    assert torch.equal(y[:, :70], native.gemm(native.cq_rotate(x, cw.in_pad), cw.rows))
    exact = x.double() @ torch.stack([cw.dequantize_row(o) for o in range(70)]).double().t()
    assert rule_for("native/cq", KERNEL_RULES).check(y[:, :70], exact), max_rel(y[:, :70], exact)
    for r in range(5):                                     # rows do not depend on the batch
        assert torch.equal(native.cq_product([pk], x[r:r + 1])[0], y[r, :70])
    assert rule_for("native/cq", KERNEL_RULES).check(native.cq_row(pk, 11),
                                                     cw.dequantize_row(11))
    assert torch.equal(native.cq_product([_packed(cw, row0=20, rows=9)], x), y[:, 20:29])


def test_packed_refuses_bad_bands_and_widths():
    from port.cq import CqWeight
    cw = CqWeight.from_dense(torch.randn(8, 128), 2, "dense")
    with pytest.raises(ValueError, match="outside the matrix"):
        _packed(cw, row0=5, rows=4)
    with pytest.raises(ValueError, match="2, 3 or 4 bits"):
        native.PackedCq(cw.packed, cw.norms, torch.zeros(4), 5, 128)


def test_native_refuses_what_it_cannot_run(tiny_cfg, tiny_params):
    with pytest.raises(ValueError, match="runs eagerly on the CPU"):
        V2Model.from_params(tiny_params, tiny_cfg, backend="native", decode="graph")
    m = V2Model.from_params(tiny_params, tiny_cfg, weights="cq")       # rotated rows
    with pytest.raises(ValueError, match="dense float32"):
        V2Model.new(tiny_cfg, *m.parts, backend="native")


def test_native_probe_heads_match_the_torch_port(tiny_cfg, pair):
    a, b = pair
    t = torch.randint(1, 256, (18,), generator=torch.Generator().manual_seed(9))
    t[-3:] = tiny_cfg.pad_token_id
    rule = rule_for("port/heads", PORT_RULES)
    assert rule.check(b.encode_contrastive(t), a.encode_contrastive(t))
    assert rule.check(b.confidence(t)[None], a.confidence(t)[None])


def _left_padded(cfg):
    t = torch.randint(1, 256, (2, 16), generator=torch.Generator().manual_seed(11))
    t[0, :5] = cfg.pad_token_id         # pad keys before every real token: each real query
    t[1, :1] = cfg.pad_token_id         # has them in its window, only key_ok hides them
    return t


def _heads_agree(model, cfg, params, t) -> bool:
    from reference import heads
    rc = heads.encode_contrastive(params, cfg, t, dtype="float32")
    rf = heads.forward_confidence(params, cfg, t, dtype="float32")
    rule = rule_for("port/heads", PORT_RULES)
    return all(rule.check(model.encode_contrastive(t[b]), rc[b])
               and rule.check(model.confidence(t[b])[None], rf[b][None]) for b in range(2))


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_probe_heads_with_left_padding_match_the_reference(tiny_cfg, tiny_params, backend):
    model = V2Model.from_params(tiny_params, tiny_cfg, backend=backend)
    assert _heads_agree(model, tiny_cfg, tiny_params, _left_padded(tiny_cfg))


def test_left_padding_catches_pad_keys_attended_in_c(tiny_cfg, tiny_params):
    # needle_step.c with key_ok ignored (pad keys attended): the test above must fail on it.
    model = V2Model.from_params(tiny_params, tiny_cfg, backend="native")
    with native.planted_build("NEEDLE_FAULT_PAD_KEYS_ATTENDED"):
        assert not _heads_agree(model, tiny_cfg, tiny_params, _left_padded(tiny_cfg))
    assert _heads_agree(model, tiny_cfg, tiny_params, _left_padded(tiny_cfg))


def test_the_native_steps_first_build_is_announced_on_stderr(tmp_path):
    import os
    import subprocess
    import sys
    root = paths.ROOT
    env = dict(os.environ, NEEDLE_NATIVE_CACHE=str(tmp_path))
    build = [sys.executable, "-c", "from kernels import native; native.build()"]
    first = subprocess.run(build, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "building the native step with " in first.stderr and str(tmp_path) in first.stderr
    again = subprocess.run(build, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "building" not in again.stderr      # cached: silent


def test_the_stage_clock_build_changes_no_bit(packed):
    # tools/bench/bench_native_stages.py times a step with the clock build (stages.h): it must
    # be the same step, and every stage must be charged (a stage left without its mark would
    # read 0 here).
    _, nat = packed
    toks = [5, 9, 200, 3, 3, 17, 90, 1]
    s = nat.make_state()
    plain = [nat.step(t, s).clone() for t in toks]
    with native.stage_build():
        native.stage_take()
        s2 = nat.make_state()
        clocked = [nat.step(t, s2).clone() for t in toks]
        took = native.stage_take()
    assert all(torch.equal(a, b) for a, b in zip(plain, clocked))
    assert torch.equal(s.k, s2.k) and torch.equal(s.lanes, s2.lanes)
    assert set(took) == {"embed", "engram", "router", "lanes_sinkhorn", "qkvg", "attention",
                         "out_proj", "mlp_mix", "final_lm_head"}
    assert all(v > 0 for v in took.values()), took
    assert native.lib() is not native._libs[(native.STAGE_CLOCK,)]   # the clean build again
