"""Hostile model configurations, wherever they are read (params metadata, .cact header,
fixture config): wrong types, look-alike and duplicate keys, bounds at the limit and one past.
"""
from tests import paths
import json
import os
import struct
import pytest
from safetensors.torch import save_file
from ladder.sides import fixtures
from reference.cact import CactFormatError, read_cact
from reference.config import ConfigError, V2Config
from reference.params import init_params, load_params
import re
from reference.config import MAX_ENGRAM_ORDER, MAX_ENGRAM_ORDERS, MAX_INT


FIXTURES = paths.FIXTURES


CACT = os.path.join(FIXTURES, "cact_w2.cact")


def _patched_cact(tmp_path, **at_value) -> str:
    data = bytearray(open(CACT, "rb").read())
    for at, value in at_value.items():
        struct.pack_into("<I", data, int(at[1:]), value)
    path = tmp_path / "patched.cact"
    path.write_bytes(bytes(data))
    return str(path)


def test_engram_dilation_1e7_is_refused_in_cact_and_params(tmp_path):
    path = _patched_cact(tmp_path, b72=10 ** 7, b84=10 ** 7)     # dilation = engram_orders[1]
    with pytest.raises(CactFormatError, match=r"engram_orders\[1\]=10000000 outside 1\.\.64"):
        read_cact(path)
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0)
    meta = dict(cfg.to_dict(), engram_orders=[2, 10 ** 7])
    save_file(params, str(tmp_path / "p.safetensors"),
              metadata={"needle_config": json.dumps(meta)})
    with pytest.raises(ConfigError, match=r"needle_config: engram_orders\[1\]=10000000"):
        load_params(tmp_path / "p.safetensors")


@pytest.mark.parametrize("field, value, msg", [
    ("kv_window", "8", r"field kv_window='8' \(str\) must be an integer"),
    ("max_seq_len", 2 ** 70, r"field max_seq_len=1180591620717411303424 \(int\) must be an "
                             r"integer in"),
    ("flash", 1, r"field flash=1 \(int\) must be true or false"),
    ("engram_orders", "23", r"field engram_orders='23' \(str\) must be a list"),
    ("engram_layers", [1.5], r"must be a list of integers"),
    ("dtype", "int8", r"dtype='int8' must be one of"),
    ("num_layers", True, r"field num_layers=True \(bool\) must be an integer"),
])
def test_wrong_typed_config_fields_are_config_errors(field, value, msg):
    with pytest.raises(ConfigError, match=msg):
        V2Config(**{**V2Config.preset("tiny").to_dict(), field: value})
    with pytest.raises(ConfigError, match=msg):
        V2Config.from_json(json.dumps({**V2Config.preset("tiny").to_dict(), field: value}))


@pytest.mark.parametrize("theta", [0.0, -1.0, float("nan"), float("inf")])
def test_rope_theta_must_be_finite_and_positive(theta):
    with pytest.raises(ConfigError, match=f"rope_theta={theta!r} must be finite and > 0"):
        V2Config.preset("tiny").replace(rope_theta=theta)


def test_rope_theta_zero_in_params_metadata_is_refused(tmp_path):
    cfg = V2Config.preset("tiny")
    save_file(init_params(cfg, 0), str(tmp_path / "p.safetensors"),
              metadata={"needle_config": json.dumps(dict(cfg.to_dict(), rope_theta=0.0))})
    with pytest.raises(ConfigError, match="rope_theta=0.0 must be finite and > 0"):
        load_params(tmp_path / "p.safetensors")


# ---------------------------------------------------------------- 7. arguments
def _one_line_exit_2(rc, capsys, *parts):
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    for p in parts:
        assert p in err, err


def _params_with_config(tmp_path, text):
    from safetensors.torch import save_file
    from reference.config import V2Config
    from reference.params import init_params
    path = str(tmp_path / "p.safetensors")
    save_file(init_params(V2Config.preset("tiny"), 0), path, metadata={"needle_config": text})
    return path


def test_confusable_and_duplicate_config_keys_are_refused(tmp_path):
    from reference.config import ConfigError, V2Config
    from reference.params import load_params
    good = V2Config.preset("tiny").to_json()
    assert good.startswith('{"act_bits"')
    assert '"kv_window": 8' in good                 # a windowed model; without it, full causal
    lookalike = good.replace('"kv_window": 8', '"kv_w\u0456ndow": 8')       # Cyrillic i
    with pytest.raises(ConfigError, match=r"needle_config: unknown field 'kv_w\u0456ndow' \(did "
                                          r"you mean 'kv_window'\?\)"):
        load_params(_params_with_config(tmp_path, lookalike))
    dup = good.replace('"kv_window": 8', '"kv_window": 8, "kv_window": 0')
    with pytest.raises(ConfigError, match=r"key 'kv_window' appears twice in one object"):
        load_params(_params_with_config(tmp_path, dup))
    with pytest.raises(ConfigError, match=r"unknown field 'kv_window '"):
        V2Config.from_json(good.replace('"kv_window"', '"kv_window "'))


def test_fixture_config_with_a_lookalike_key_is_refused(tmp_path):
    m = json.load(open(os.path.join(FIXTURES, "v2_forward_vectors.json")))
    m["config"]["kv_windows"] = m["config"].pop("kv_window")
    (tmp_path / "fx.json").write_text(json.dumps(m))
    os.symlink(os.path.join(FIXTURES, "v2_forward_vectors.safetensors"),
               tmp_path / "fx.safetensors")
    with pytest.raises(fixtures.FixtureError, match=r"field config: unknown field 'kv_windows' "
                                                    r"\(did you mean 'kv_window'\?\)"):
        fixtures.load(tmp_path / "fx")


@pytest.mark.parametrize("theta", [1e-30, 0.5, 1e31])
def test_tiny_or_huge_rope_theta_is_a_config_error(tmp_path, theta, capsys):
    from reference.__main__ import main
    from reference.config import ConfigError, V2Config
    with pytest.raises(ConfigError, match=re.escape(f"rope_theta={theta!r} outside 1..1e30")):
        V2Config.preset("tiny").replace(rope_theta=theta)
    text = json.dumps(dict(V2Config.preset("tiny").to_dict(), rope_theta=theta))
    rc = main(["run", "--steps", "1", "--prompt-len", "1", "--params",
               _params_with_config(tmp_path, text)])
    _one_line_exit_2(rc, capsys, f"rope_theta={theta!r} outside 1..1e30")


# ---------------------------------------------------------------- config bounds, edge and past
def _cfg(tiny_cfg, **kw):
    return tiny_cfg.replace(**kw)


@pytest.mark.parametrize("kw_edge, kw_past, msg", [
    (dict(engram_orders=(2,) * MAX_ENGRAM_ORDERS), dict(engram_orders=(2,) * (MAX_ENGRAM_ORDERS + 1)),
     f"must hold 1..{MAX_ENGRAM_ORDERS} orders"),
    (dict(engram_orders=(1,)), dict(engram_orders=()), f"must hold 1..{MAX_ENGRAM_ORDERS}"),
    (dict(engram_orders=(MAX_ENGRAM_ORDER,)), dict(engram_orders=(MAX_ENGRAM_ORDER + 1,)),
     f"engram_orders\\[0\\]={MAX_ENGRAM_ORDER + 1} outside 1..{MAX_ENGRAM_ORDER}"),
    (dict(engram_orders=(1, 2)), dict(engram_orders=(0, 2)), "engram_orders\\[0\\]=0 outside"),
    (dict(kv_bits=32), dict(kv_bits=33), "kv_bits=33 outside 0..32"),
    (dict(act_bits=0), dict(act_bits=-1), "act_bits=-1 outside 0..32"),
    (dict(rope_theta=1e30), dict(rope_theta=1.1e30), "outside 1..1e30"),
    (dict(rope_theta=1.0), dict(rope_theta=0.999), "outside 1..1e30"),
    (dict(kv_window=0), dict(kv_window=-1), "kv_window=-1 must be >= 0"),
])
def test_config_bounds_at_the_limit_and_one_past(tiny_cfg, kw_edge, kw_past, msg):
    _cfg(tiny_cfg, **kw_edge)
    with pytest.raises(ConfigError, match=msg):
        _cfg(tiny_cfg, **kw_past)


def test_engram_sites_at_num_layers_and_one_past(tiny_cfg):
    L = tiny_cfg.num_layers
    cfg = _cfg(tiny_cfg, engram_layers=tuple(range(L)))
    assert cfg.num_sites == L
    with pytest.raises(ConfigError, match=f"{L + 1} entries, more than num_layers={L}"):
        _cfg(tiny_cfg, engram_layers=tuple(range(L)) + (0,))
    _cfg(tiny_cfg, engram_layers=(L - 1,))
    with pytest.raises(ConfigError, match=f"engram_layers\\[0\\]={L} outside"):
        _cfg(tiny_cfg, engram_layers=(L,))


def test_engram_tables_at_d_model_and_one_past(tiny_cfg):
    """tables = orders x heads; each table's sub-dimension d_model // tables must be >= 1."""
    d, n = tiny_cfg.d_model, len(tiny_cfg.engram_orders)
    cfg = _cfg(tiny_cfg, engram_heads=d // n)
    assert cfg.engram_tables == d and cfg.engram_sub == 1
    with pytest.raises(ConfigError, match="engram sub-dim d_model // tables = 0 must be >= 1"):
        _cfg(tiny_cfg, engram_heads=d // n + 1)


def test_integer_fields_at_max_int_and_one_past(tiny_cfg):
    d = dict(tiny_cfg.to_dict(), pad_token_id=-MAX_INT)
    # in the integer range, so past the type check; then refused as no token id (issue 32)
    with pytest.raises(ConfigError, match=f"pad_token_id=-{MAX_INT} outside 0..vocab_size-1"):
        V2Config.from_file_fields(d)
    with pytest.raises(ConfigError, match=f"-{MAX_INT}..{MAX_INT}"):
        V2Config.from_file_fields(dict(d, pad_token_id=-MAX_INT - 1))
    with pytest.raises(ConfigError, match=f"-{MAX_INT}..{MAX_INT}"):
        V2Config.from_file_fields(dict(d, kv_window=MAX_INT + 1))
