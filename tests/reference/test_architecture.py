import torch

from ladder.sides.reference_rules import max_rel, rule_for
from reference import architecture, heads
from reference.decode import forward_cached, init_kv_cache


def _tokens(cfg, B=2, n=20, seed=4):
    return torch.randint(1, cfg.vocab_size, (B, n), generator=torch.Generator().manual_seed(seed))


def test_decode_equals_training_graph_in_f32(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg)
    kc, vc = init_kv_cache(tiny_cfg, 2, 20)
    dec, _, _ = forward_cached(tiny_params, tiny_cfg, t, kc, vc, 0, kv_window=0)
    for flash in (True, False):
        arch = architecture.forward(tiny_params, tiny_cfg, t, dtype="float32", flash=flash)
        assert rule_for("self/decode_vs_arch_f32").check(arch, dec), (flash, max_rel(arch, dec))
        assert torch.equal(arch.argmax(-1), dec.argmax(-1))


def test_bf16_training_graph_gap_is_reported(tiny_cfg, tiny_params, record_property):
    t = _tokens(tiny_cfg)
    f32 = architecture.forward(tiny_params, tiny_cfg, t, dtype="float32")
    bf16 = architecture.forward(tiny_params, tiny_cfg, t, dtype="bfloat16")
    gap = max_rel(bf16, f32)
    record_property("bf16_vs_f32_max_rel", gap)
    print(f"bf16 training graph vs f32: max|d|/max|f32| = {gap:.3e}")
    assert bf16.dtype == torch.float32
    assert 1e-4 < gap and rule_for("self/arch_bf16_vs_f32").check(bf16, f32)


def test_engram_enters_only_at_site_layers(tiny_cfg, tiny_params):
    # Zeroing a site's value projection must change the output; a site flag on a layer
    # without that site must contribute exact zeros (the einsum form).
    t = _tokens(tiny_cfg, n=12)
    base = architecture.forward(tiny_params, tiny_cfg, t, dtype="float32")
    p = dict(tiny_params)
    p["engrams_1/value_proj/kernel"] = torch.zeros_like(p["engrams_1/value_proj/kernel"])
    cut = architecture.forward(p, tiny_cfg, t, dtype="float32")
    layer = tiny_cfg.engram_layers[1]
    _, hid_a = architecture.forward(tiny_params, tiny_cfg, t, dtype="float32", collect_hidden=True)
    _, hid_b = architecture.forward(p, tiny_cfg, t, dtype="float32", collect_hidden=True)
    assert not torch.equal(base, cut)
    assert torch.equal(hid_a[:layer], hid_b[:layer])          # before the site: untouched
    assert not torch.equal(hid_a[layer], hid_b[layer])


def test_hidden_cells_layout_and_window(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg)
    cells = architecture.hidden_cells(tiny_params, tiny_cfg, t, dtype="float32")
    assert cells.shape == (2, 20, tiny_cfg.num_layers + 1, tiny_cfg.d_model)
    x0 = tiny_params["embedding/embedding"][t] * tiny_cfg.d_model ** 0.5
    assert torch.equal(cells[:, :, 0], x0)
    _, hidden = architecture.forward(tiny_params, tiny_cfg, t, dtype="float32",
                                     collect_hidden=True)
    assert torch.equal(cells[:, :, 1:], hidden.permute(1, 2, 0, 3))
    w = tiny_cfg.kv_window
    cw = architecture.hidden_cells(tiny_params, tiny_cfg, t, window=w, dtype="float32")
    assert not torch.equal(cells, cw)
    # Tap 3 reaches 9 back; with window 8 the training graph drops it (mask diagonal), so
    # windowed cells differ from position 9 on — and only there (taps 0-2 and the n-grams
    # stay inside the window, attention sees identical keys below the window).
    assert torch.equal(cells[:, :w], cw[:, :w])


def test_probe_heads(tiny_cfg, tiny_params):
    t = _tokens(tiny_cfg)
    t[1, -4:] = tiny_cfg.pad_token_id
    e = heads.encode_contrastive(tiny_params, tiny_cfg, t, dtype="float32")
    assert e.shape == (2, tiny_cfg.contrastive_dim)
    assert rule_for("heads/unit_norm").check(e.norm(dim=-1), torch.ones(2))
    c = heads.forward_confidence(tiny_params, tiny_cfg, t, dtype="float32")
    assert c.shape == (2,) and torch.isfinite(c).all()
    cw = heads.forward_confidence(tiny_params, tiny_cfg, t, window=4, dtype="float32")
    assert not torch.equal(c, cw)
