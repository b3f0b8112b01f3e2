import pytest
import torch
from hypothesis import given, strategies as st

from ladder.engine.rules import PORT_RULES
from ladder.sides.reference_rules import max_rel, rule_for
from port.batch import V2Batch
from port.model import StepError, V2Model
from port.state import StateError
from reference import cact
from reference.config import V2Config
from reference.decode import COARSE, forward_cached, generate, init_kv_cache
from reference.params import init_params, save_params, load_params

MID = V2Config(vocab_size=512, d_model=128, num_heads=4, num_kv_heads=2, num_layers=8,
               max_seq_len=160, engram_layers=(2, 5), engram_slots=1021, kv_window=32,
               rope_theta=100000.0, contrastive_dim=32, dtype="float32")


@pytest.fixture(scope="module", params=["torch", "native"])
def tiny_model(request, tiny_cfg, tiny_params):
    """The torch port and the native C step: every property below holds for both."""
    return V2Model.from_params(tiny_params, tiny_cfg, backend=request.param)


@pytest.fixture(scope="module")
def tiny_cq_model(tiny_cfg, tiny_params):
    return V2Model.from_params(tiny_params, tiny_cfg, weights="cq")


def _seq(cfg, n, seed=0):
    return torch.randint(1, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def _reference_logits(params, cfg, seq):
    kc, vc = init_kv_cache(cfg, 1, len(seq))
    return forward_cached(params, cfg, seq[None], kc, vc, 0)[0][0]


@pytest.mark.parametrize("weights", ["dense", "cq"])
@pytest.mark.parametrize("which", ["tiny", "mid"])
def test_logits_match_reference_past_three_windows(which, weights, tiny_cfg, tiny_params):
    cfg, params = (tiny_cfg, tiny_params) if which == "tiny" else (MID, init_params(MID, 3, True))
    if weights == "cq":      # the reference runs on the same dequantised weights
        f = cact.build_cact(params, cfg)
        model, params = V2Model.from_cactfile(f, "cq"), f.params
    else:
        model = V2Model.from_params(params, cfg)
    prompt, steps = 11, 3 * cfg.kv_window
    seq = _seq(cfg, prompt + steps + 1)
    ref = _reference_logits(params, cfg, seq)
    state = model.make_state()
    got = [model.prefill_batch(seq[:prompt], state, V2Batch(model, 4),
                               logits=torch.empty(cfg.vocab_size)).clone()]
    for p in range(prompt, len(seq)):
        got.append(model.step(int(seq[p]), state).clone())
    got = torch.stack(got)
    want = ref[prompt - 1:]
    assert rule_for("port/logits", PORT_RULES).check(got, want), max_rel(got, want)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_every_ladder_point_matches_reference(tiny_cfg, tiny_params, tiny_model):
    seq = _seq(tiny_cfg, 30, seed=1)
    for upto in (1, 9, 30):                       # first position, just past, three wraps
        ref = {}

        def rtrace(name, layer, v):
            v = v[0][:, -1] if name in ("q", "k", "v") else v[0, -1]
            ref[name if layer is None else f"L{layer:02d}.{name}"] = v.clone()
        kc, vc = init_kv_cache(tiny_cfg, 1, upto)
        forward_cached(tiny_params, tiny_cfg, seq[None, :upto], kc, vc, 0, trace=rtrace)
        state = tiny_model.make_state()
        for t in seq[:upto - 1]:
            tiny_model.step_prefill(int(t), state)
        got = {}
        tiny_model.step_traced(int(seq[upto - 1]), state, None, lambda n, l, v: got.__setitem__(
            n if l is None else f"L{l:02d}.{n}", v.clone()))
        assert set(got) == set(ref)
        coarse = [k for k in got if "." not in k or k.split(".")[1] in COARSE]
        assert len(coarse) > 8 * tiny_cfg.num_layers - 6
        for k in got:
            rule = rule_for(f"port/{k}", PORT_RULES)
            assert rule.check(got[k].reshape(-1), ref[k].reshape(-1)), (upto, k)


def test_greedy_generation_matches_reference_token_for_token():
    params = init_params(MID, 5, perturbed=True)
    model = V2Model.from_params(params, MID)
    prompt = _seq(MID, 6, seed=2).tolist()
    want = generate(params, MID, prompt, 64)
    state = model.make_state()
    model.prefill_batch(prompt[:-1], state, V2Batch(model, 8))
    tok, got = prompt[-1], []
    for _ in range(64):
        tok = int(model.step(tok, state).argmax())
        got.append(tok)
    assert got == want


@given(st.lists(st.integers(0, 255), min_size=1, max_size=28), st.integers(1, 8))
def test_ring_equals_full_cache_bit_for_bit(tiny_model, tokens, window):
    ring, full = tiny_model.make_state(), tiny_model.make_state_full_causal()
    ring.set_kv_window(window, tiny_model)
    full.set_kv_window(window, tiny_model)
    for t in tokens:
        assert torch.equal(tiny_model.step(t, ring), tiny_model.step(t, full))


@given(st.lists(st.integers(0, 255), min_size=1, max_size=20))
def test_noop_trace_equals_step(tiny_model, tokens):
    a, b = tiny_model.make_state(), tiny_model.make_state()
    for t in tokens:
        la = tiny_model.step(t, a).clone()
        lb = tiny_model.step_traced(t, b, torch.empty(256), lambda *args: None)
        assert torch.equal(la, lb)
    assert torch.equal(a.k, b.k) and torch.equal(a.lanes, b.lanes)


@given(st.lists(st.integers(0, 255), min_size=1, max_size=30), st.integers(1, 12),
       st.integers(0, 255))
def test_prefill_batch_equals_step_prefill(tiny_model, tokens, cap, nxt):
    a, b = tiny_model.make_state(), tiny_model.make_state()
    for t in tokens[:-1]:
        tiny_model.step_prefill(t, a)
    want = tiny_model.step(tokens[-1], a).clone()
    last = tiny_model.prefill_batch(tokens, b, V2Batch(tiny_model, cap), torch.empty(256))
    assert torch.equal(last, want)
    for name in ("k", "v", "vraw", "lanes", "hidden"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
    assert a.history() == b.history() == tokens
    assert torch.equal(tiny_model.step(nxt, a), tiny_model.step(nxt, b))


def _snapshot(state):
    return [t.clone() for t in (state.k, state.v, state.vraw, state.lanes, state.hidden)] + \
        [state.history()]


def _same(a, b):
    return all(torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))


def test_bad_inputs_leave_state_untouched(tiny_cfg, tiny_model):
    state = tiny_model.make_state()
    for t in (3, 4, 5):
        tiny_model.step(t, state)
    before = _snapshot(state)
    cases = [
        (lambda: tiny_model.step(256, state), "token id 256 outside 0..vocab_size-1=255"),
        (lambda: tiny_model.step(-1, state), "token id -1"),
        (lambda: tiny_model.step(3, state, torch.empty(255)), r"logits buffer .*\[255\]"),
        (lambda: tiny_model.step(torch.tensor(3, device="meta"), state), "token is on meta"),
        (lambda: tiny_model.prefill_batch([3, 999], state, V2Batch(tiny_model)), "token id 999"),
        (lambda: tiny_model.prefill_batch(torch.tensor([1], device="meta"), state,
                                          V2Batch(tiny_model)), "tokens are on meta"),
    ]
    for call, msg in cases:
        with pytest.raises(StepError, match=msg):
            call()
        assert _same(before, _snapshot(state))
    with pytest.raises(StateError, match="kv_window=9 is wider than the ring \\(8 slots\\)"):
        state.set_kv_window(9, tiny_model)
    with pytest.raises(StateError, match="kv_window=0"):
        state.set_kv_window(0, tiny_model)
    assert state.window == tiny_cfg.kv_window
    full = tiny_model.make_state_full_causal()
    for t in range(tiny_cfg.max_seq_len):
        tiny_model.step_prefill(t % 250 + 1, full)
    with pytest.raises(StepError, match="position 64 is past max_seq_len=64"):
        tiny_model.step(1, full)
    with pytest.raises(StepError, match="run past max_seq_len"):
        tiny_model.prefill_batch([1] * 62, state, V2Batch(tiny_model))


def test_probe_heads_match_reference_with_pads(tiny_cfg, tiny_params, tiny_model):
    from reference import heads
    t = torch.randint(1, 256, (2, 20), generator=torch.Generator().manual_seed(3))
    t[1, -4:] = tiny_cfg.pad_token_id
    t[0, 5] = tiny_cfg.pad_token_id
    rc = heads.encode_contrastive(tiny_params, tiny_cfg, t, dtype="float32")
    rf = heads.forward_confidence(tiny_params, tiny_cfg, t, dtype="float32")
    rule = rule_for("port/heads", PORT_RULES)
    for b in range(2):
        assert rule.check(tiny_model.encode_contrastive(t[b]), rc[b])
        assert rule.check(tiny_model.confidence(t[b])[None], rf[b][None])


@pytest.mark.parametrize("backend", ["torch", "native"])
def test_shipped_geometry_from_a_parameter_file(tmp_path, backend):
    cfg = V2Config.preset("shipped")
    params = init_params(cfg, 0, perturbed=True)
    path = tmp_path / "shipped.safetensors"
    save_params(path, params, cfg)
    params, cfg = load_params(path)
    model = V2Model.from_params(params, cfg, backend=backend)
    seq = _seq(cfg, 3, seed=4)
    state = model.make_state()
    assert state.k.shape == (27, 4, 256, 64)                  # the ring, not max_seq_len
    got = torch.stack([model.step(int(t), state).clone() for t in seq])
    ref = _reference_logits(params, cfg, seq)
    assert rule_for("port/logits", PORT_RULES).check(got, ref)
    assert torch.equal(got.argmax(-1), ref.argmax(-1))


def test_cq_model_from_a_cact_file(tmp_path, tiny_cfg, tiny_params):
    path = tmp_path / "tiny.cact"
    cact.write_cact(path, tiny_params, tiny_cfg)
    cq, dense = V2Model.from_cact(path), V2Model.from_cact(path, weights="dense")
    assert (cq.form, dense.form) == ("rotated", "dense")
    seq = _seq(tiny_cfg, 20, seed=6)
    a, b = cq.make_state(), dense.make_state()
    ref = _reference_logits(cact.read_cact(path).params, tiny_cfg, seq)
    for p, t in enumerate(seq.tolist()):
        la, lb = cq.step(t, a), dense.step(t, b)
        assert rule_for("port/logits", PORT_RULES).check(la, ref[p])
        assert rule_for("port/logits", PORT_RULES).check(lb, ref[p])
        assert not torch.equal(la, lb)          # really two computations
    with pytest.raises(ValueError, match="weights='int8'"):
        V2Model.from_params(tiny_params, tiny_cfg, weights="int8")


@given(st.lists(st.integers(0, 255), min_size=1, max_size=24), st.integers(1, 9))
def test_cq_prefill_batch_equals_step_prefill(tiny_cq_model, tokens, cap):
    a, b = tiny_cq_model.make_state(), tiny_cq_model.make_state()
    for t in tokens:
        tiny_cq_model.step_prefill(t, a)
    tiny_cq_model.prefill_batch(tokens, b, V2Batch(tiny_cq_model, cap))
    assert torch.equal(a.k, b.k) and torch.equal(a.lanes, b.lanes)
    assert torch.equal(tiny_cq_model.step(7, a), tiny_cq_model.step(7, b))


@pytest.mark.slow
def test_triton_backend_matches_torch_backend(tiny_cfg, tiny_params):
    # The fused Triton body (the interpreter on CPU) against the torch port: the same model in
    # another op order and other reduction trees, so the port's float32 rule, not bits.
    dev = "cuda" if torch.cuda.is_available() else "cpu"    # Triton: a GPU, else the interpreter
    a = V2Model.from_params(tiny_params, tiny_cfg)
    b = V2Model.from_params(tiny_params, tiny_cfg, backend="triton", device=dev)
    sa, sb = a.make_state(), b.make_state()
    for t in _seq(tiny_cfg, 10, seed=8).tolist():            # past the window of 8
        la, lb = a.step(t, sa), b.step(t, sb).cpu()
        assert rule_for("port/logits", PORT_RULES).check(lb, la)
        assert torch.equal(la.argmax(), lb.argmax())
    with pytest.raises(ValueError, match="backend='cuda'"):
        V2Model.from_params(tiny_params, tiny_cfg, backend="cuda")
