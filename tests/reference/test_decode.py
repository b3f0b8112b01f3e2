import pytest
import torch

from ladder.sides.reference_rules import rule_for
from reference.decode import (COARSE, DecodeInputError, forward_cached, generate,
                              init_kv_cache)

N = 24   # positions: past the tiny window (8) three times


def _tokens(cfg, B=2, n=N, seed=0):
    return torch.randint(1, cfg.vocab_size, (B, n), generator=torch.Generator().manual_seed(seed))


def _hist_kwargs(t):
    return dict(hist=t, hist_valid=torch.ones(t.shape, dtype=torch.bool))


def _steps(p, cfg, t, window=None, prompt=11):
    kc, vc = init_kv_cache(cfg, t.shape[0], t.shape[1])
    out, kc, vc = forward_cached(p, cfg, t[:, :prompt], kc, vc, 0, kv_window=window,
                                 **_hist_kwargs(t))
    outs = [out]
    for pos in range(prompt, t.shape[1]):
        lg, kc, vc = forward_cached(p, cfg, t[:, pos:pos + 1], kc, vc, pos, kv_window=window,
                                    **_hist_kwargs(t))
        outs.append(lg)
    return torch.cat(outs, 1), kc, vc


@pytest.mark.parametrize("window", [None, 0])
def test_prefill_equals_one_token_steps(tiny_cfg, tiny_params, window):
    t = _tokens(tiny_cfg)
    kc, vc = init_kv_cache(tiny_cfg, 2, N)
    full, k_full, v_full = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0, kv_window=window,
                                          **_hist_kwargs(t))
    mixed, k_mix, v_mix = _steps(tiny_params, tiny_cfg, t, window)
    assert rule_for("self/prefill_vs_steps").check(mixed, full)
    assert torch.equal(mixed.argmax(-1), full.argmax(-1))
    assert rule_for("self/prefill_vs_steps").check(k_mix, k_full)


def test_window_matches_causal_until_it_fills(tiny_cfg, tiny_params):
    w = tiny_cfg.kv_window
    t = _tokens(tiny_cfg)
    kc, vc = init_kv_cache(tiny_cfg, 2, N)
    win, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0, kv_window=w)
    causal, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0, kv_window=0)
    assert torch.equal(win[:, :w], causal[:, :w])
    for pos in range(w, N):
        assert not torch.equal(win[:, pos], causal[:, pos]), pos


def test_sink_keeps_a_position_visible(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg)
    kc, vc = init_kv_cache(tiny_cfg, 2, N)
    sink = torch.zeros(2, N, dtype=torch.bool)
    sink[:, 1] = True
    plain, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0)
    sunk, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0, sink=sink)
    w = tiny_cfg.kv_window
    assert torch.equal(plain[:, :w + 1], sunk[:, :w + 1])    # position 1 still in the window
    assert not torch.equal(plain[:, w + 2], sunk[:, w + 2])


def test_all_masked_row_is_uniform_not_nan(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg, n=6)
    kc, vc = init_kv_cache(tiny_cfg, 2, 6)
    kv = torch.ones(2, 6, dtype=torch.bool)
    kv[0] = False                                            # a fully left-padded row
    logits, k2, v2 = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0, key_valid=kv)
    assert torch.isfinite(logits).all() and torch.isfinite(k2).all()


def test_hist_none_is_history_anchored_at_zero(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg, n=10)
    kc, vc = init_kv_cache(tiny_cfg, 2, 16)
    a, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0)
    b, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0, **_hist_kwargs(t))
    assert torch.equal(a, b)


def test_caches_passed_in_are_not_modified(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg, n=4)
    kc, vc = init_kv_cache(tiny_cfg, 2, 8)
    _, k2, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0)
    assert kc.abs().sum() == 0 and vc.abs().sum() == 0 and k2[:, :, :, :4].abs().sum() > 0


def test_trace_noop_is_bit_identical_and_ordered(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg, n=12)
    kc, vc = init_kv_cache(tiny_cfg, 2, 12)
    plain, pk, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0)
    seen = []
    traced, tk, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0,
                                   trace=lambda name, layer, v: seen.append((name, layer)))
    assert torch.equal(plain, traced) and torch.equal(pk, tk)
    names = [n if layer is None else f"L{layer:02d}.{n}" for n, layer in seen]
    assert names[:5] == ["embed", "engram_k0", "engram_v0", "engram_k1", "engram_v1"]
    assert names[-3:] == ["lane_mean", "final_norm", "logits"]
    for i in range(tiny_cfg.num_layers):
        coarse = [n for n in names if n.startswith(f"L{i:02d}.") and n[4:] in COARSE]
        want = [c for c in COARSE if c != "alpha" or i in tiny_cfg.engram_layers]
        assert coarse == [f"L{i:02d}.{c}" for c in want]
    assert len(names) == len(set(names))


def test_float64_runs_the_same_code(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg, n=12)
    p64 = {k: v.double() for k, v in tiny_params.items()}
    kc, vc = init_kv_cache(tiny_cfg, 2, 12, torch.float64)
    l64, k64, _ = forward_cached(p64, tiny_cfg, t, kc, vc, 0)
    kc, vc = init_kv_cache(tiny_cfg, 2, 12)
    l32, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0)
    assert l64.dtype == k64.dtype == torch.float64
    assert rule_for("self/f32_vs_f64").check(l32, l64)
    assert not torch.equal(l32.double(), l64)


def test_generate_equals_greedy_recompute(tiny_cfg, tiny_params):
    prompt = _tokens(tiny_cfg, B=1, n=5)[0].tolist()
    out = generate(tiny_params, tiny_cfg, prompt, 14)
    assert len(out) == 14 and out == generate(tiny_params, tiny_cfg, prompt, 14)
    seq = list(prompt)
    for _ in range(14):       # no cache: the whole sequence each time
        t = torch.tensor([seq])
        kc, vc = init_kv_cache(tiny_cfg, 1, len(seq))
        lg, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0)
        seq.append(int(lg[0, -1].argmax()))
    assert seq[5:] == out


def test_bad_inputs_raise_named_errors(tiny_cfg, tiny_params):
    cfg, p = tiny_cfg, tiny_params
    kc, vc = init_kv_cache(cfg, 1, 16)
    ok = torch.tensor([[3, 4]])
    cases = [
        (dict(tokens=torch.tensor([[3, 256]])), "token id 256 outside 0..vocab_size-1=255"),
        (dict(tokens=torch.tensor([[-1]])), "token id -1"),
        (dict(tokens=torch.tensor([3.0])), "integer tensor"),
        (dict(pos=15), r"positions pos=15..16 must lie in 0..15"),
        (dict(pos=-1), "pos=-1"),
        (dict(kc=kc[:, :, :1]), r"k_cache shape \[6, 1, 1, 16, 12\]"),
        (dict(kc=kc.double()), "caches are torch.float64"),
        (dict(hist=torch.zeros(1, 1, dtype=torch.int64)), "hist must be integer"),
        (dict(sink=torch.zeros(1, 5, dtype=torch.bool)), r"sink must be bool \[B=1, M=16\]"),
        (dict(key_valid=torch.zeros(1, 16)), "key_valid must be bool"),
        (dict(kv_window=-2), "kv_window=-2"),
    ]
    for change, msg in cases:
        kw = dict(tokens=ok, kc=kc, vc=vc, pos=0)
        kw.update(change)
        extra = {k: kw.pop(k) for k in ("hist", "sink", "key_valid", "kv_window") if k in kw}
        with pytest.raises(DecodeInputError, match=msg):
            forward_cached(p, cfg, kw["tokens"], kw["kc"], kw.get("vc", vc) if "kc" not in change
                           else kw["kc"], kw["pos"], **extra)
    with pytest.raises(DecodeInputError, match="max_len=65"):
        init_kv_cache(cfg, 1, 65)
