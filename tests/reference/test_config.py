import pytest

from reference.config import ConfigError, V2Config


def test_shipped_derived_quantities():
    c = V2Config.preset("shipped")
    assert (c.vocab_size, c.d_model, c.num_heads, c.num_kv_heads, c.num_layers) == \
        (8192, 512, 8, 4, 27)
    assert (c.head_dim, c.kv_dim, c.rep) == (64, 256, 2)
    assert (c.engram_heads_eff, c.engram_sub, c.engram_tables, c.engram_fetched) == (2, 128, 4, 512)
    assert (c.engram_dilation, c.engram_hist_window, c.engram_taps) == (3, 12, 4)
    assert (c.hada_n, c.stream_dim) == (512, 2048)
    # Spec §a.2: per_pos 16704 bytes -> budget 704 -> the header's window 256 wins.
    assert (c.kv_bytes_per_pos, c.kv_budget, c.effective_kv_window) == (16704, 704, 256)
    assert [c.active_lane(i) for i in range(6)] == [0, 1, 2, 3, 0, 1]
    assert c.site_of_layer(15) == 1 and c.site_of_layer(3) is None


def test_upstream_class_defaults_and_unknown_keys():
    c = V2Config(d_model=96, num_heads=4, num_kv_heads=2, engram_layers=[1], mtp_weight=0.3,
                 bogus="x")
    assert c.num_layers == 12 and c.attn_dim == 0 and c.attn_dim_eff == 96
    assert c.head_dim == 24 and c.engram_layers == (1,)
    assert not hasattr(c, "bogus")
    # attn_dim decoupled from d_model
    c2 = V2Config(d_model=64, attn_dim=128, num_heads=4, num_kv_heads=2, engram_layers=(0,))
    assert (c2.head_dim, c2.kv_dim) == (32, 64)
    # Unset window: the budget rule alone (spec §a.2).
    assert V2Config(engram_layers=(2,)).effective_kv_window == V2Config(engram_layers=(2,)).kv_budget


def test_hada_n_pads_to_power_of_two():
    assert V2Config(d_model=48, num_heads=4, num_kv_heads=2, num_layers=2,
                    engram_layers=()).hada_n == 64
    assert V2Config(d_model=768, num_heads=12, num_kv_heads=6, num_layers=27).hada_n == 1024


def test_tiny_exercises_every_path():
    c = V2Config.preset("tiny")
    assert c.num_sites >= 2
    assert c.num_heads > c.num_kv_heads                             # GQA
    assert {c.active_lane(i) for i in range(c.num_layers)} == set(range(c.mhc_lanes))
    assert 0 < c.kv_window < 24                                     # tests run 24+ positions
    assert c.hada_n != c.d_model                                    # Hadamard padding
    assert c.engram_hist_window < c.max_seq_len


@pytest.mark.parametrize("name", ["tiny", "shipped"])
def test_json_round_trip(name):
    c = V2Config.preset(name)
    back = V2Config.from_json(c.to_json())
    assert back == c and back.to_json() == c.to_json()
    assert c.geometry_diff(c.replace(kv_window=3)) == ["kv_window"]


@pytest.mark.parametrize("fields,needle", [
    (dict(num_heads=6, num_kv_heads=4), "num_heads=6"),
    (dict(engram_layers=(2, 40)), "engram_layers[1]=40"),
    (dict(d_model=0), "d_model=0"),
    (dict(kv_window=-1, engram_layers=(2,)), "kv_window=-1"),
    (dict(d_model=64, num_heads=4, num_kv_heads=2, attn_dim=70, engram_layers=(2,)), "attn_dim=70"),
])
def test_bad_configs_are_named(fields, needle):
    with pytest.raises(ConfigError, match=needle.replace("[", r"\[").replace("]", r"\]")):
        V2Config(**fields)


def test_upstream_default_layers_do_not_fit_default_depth():
    # Upstream's class defaults (12 layers, sites (2, 15)) cannot build a model either.
    with pytest.raises(ConfigError, match="engram_layers"):
        V2Config()


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'huge'"):
        V2Config.preset("huge")
