import json
import math
import struct

import pytest
import torch
from hypothesis import given, strategies as st

from reference.config import V2Config
from reference.params import (ParamsError, check_params, init_params, load_params,
                              load_safetensors, param_shapes, save_params)

DEGENERATE = {  # upstream init values that hide bugs (spec §a.3)
    "stack/layers/block/ZCRMSNorm_0/scale": 0.0,
    "stack/layers/block/attn_gate": 0.0,
    "stack/mhc_a_pre": 0.01,
    "stack/final_norm/scale": 0.0,
    "stack/layers/block/hadamard_mlp/d1": 1.0,
    "stack/layers/block/hadamard_mlp/d3": 0.02,
}


def test_upstream_init_distributions(tiny_cfg):
    p = init_params(tiny_cfg, seed=3)
    for key, value in DEGENERATE.items():
        assert torch.equal(p[key], torch.full_like(p[key], value)), key
    assert torch.equal(p["stack/mhc_b_res"], 4 * torch.eye(4).expand(tiny_cfg.num_layers, 4, 4))
    taps = p["engrams_0/taps"]
    assert torch.equal(taps[0], torch.ones(48)) and torch.equal(taps[1:], torch.zeros(3, 48))
    big = init_params(V2Config.preset("shipped").replace(num_layers=2, engram_layers=(0,)), 0)
    assert abs(float(big["embedding/embedding"].std()) - 0.02) < 2e-4
    assert abs(float(big["stack/layers/block/self_attn/out_proj/kernel"].std())
               - 0.02 / math.sqrt(4)) < 2e-4


def test_perturbed_moves_every_degenerate_init(tiny_cfg):
    base, pert = init_params(tiny_cfg, 3), init_params(tiny_cfg, 3, perturbed=True)
    for key in list(DEGENERATE) + ["stack/mhc_b_res", "engrams_0/taps", "engrams_1/taps",
                                   "stack/mhc_b_pre", "stack/mhc_b_post"]:
        assert not torch.equal(base[key], pert[key]), key
        # not constant along any layer either
        assert float(pert[key].std()) > 0.05, key
    for key in base:
        assert pert[key].shape == base[key].shape and torch.isfinite(pert[key]).all()


def test_init_is_seeded(tiny_cfg):
    a, b, c = (init_params(tiny_cfg, s, perturbed=True) for s in (5, 5, 6))
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(a["embedding/embedding"], c["embedding/embedding"])


def test_save_load_round_trip_bitwise(tmp_path, tiny_cfg, tiny_params):
    path = tmp_path / "p.safetensors"
    save_params(path, tiny_params, tiny_cfg)
    back, cfg = load_params(path)
    assert cfg == tiny_cfg and set(back) == set(tiny_params)
    assert all(torch.equal(back[k], tiny_params[k]) for k in back)


def test_extra_upstream_keys_ignored_missing_and_misshapen_named(tmp_path, tiny_cfg, tiny_params):
    extra = dict(tiny_params)
    extra["mtp_block/self_attn/q_proj/kernel"] = torch.zeros(3, 3)
    extra["contrastive_head/log_temp"] = torch.tensor(-2.66)
    assert set(check_params(extra, tiny_cfg)) == set(tiny_params)
    no_heads = {k: v for k, v in tiny_params.items() if "_head/" not in k}
    assert set(check_params(no_heads, tiny_cfg)) == set(no_heads)   # heads are optional
    missing = dict(tiny_params)
    del missing["stack/mhc_phi_res"]
    with pytest.raises(ParamsError, match="missing parameter 'stack/mhc_phi_res'"):
        check_params(missing, tiny_cfg)
    bad = dict(tiny_params)
    bad["engrams_1/taps"] = torch.zeros(3, 48)
    with pytest.raises(ParamsError, match=r"'engrams_1/taps' has shape \[3, 48\].*\[4, 48\]"):
        check_params(bad, tiny_cfg)
    path = tmp_path / "nocfg.safetensors"
    save_params(path, tiny_params)
    with pytest.raises(ParamsError, match="no needle_config"):
        load_params(path)
    assert load_params(path, tiny_cfg)[1] == tiny_cfg


def test_shapes_follow_upstream_stacking():
    s = param_shapes(V2Config.preset("shipped"))
    assert s["stack/layers/block/self_attn/q_proj/kernel"] == (27, 512, 512)
    assert s["stack/layers/block/self_attn/k_proj/kernel"] == (27, 512, 256)
    assert s["stack/mhc_phi_res"] == (27, 2048, 16)
    assert s["engrams_0/embedding"] == (4, 8192, 128)
    assert s["contrastive_head/proj/kernel"] == (2048, 128)
    assert s["confidence_head/proj/kernel"] == (4096, 1)
    n = sum(math.prod(v) for v in s.values())
    assert 43.0e6 < n < 44.0e6          # spec §a.3: ≈43.6 M exported parameters


def _valid_file(tmp_path, tiny_cfg, tiny_params):
    path = tmp_path / "ok.safetensors"
    small = {k: v for k, v in tiny_params.items() if k.startswith("stack/mhc_a")}
    save_params(path, small, tiny_cfg)
    return path, path.read_bytes()


def test_malformed_safetensors_named(tmp_path, tiny_cfg, tiny_params):
    path, raw = _valid_file(tmp_path, tiny_cfg, tiny_params)
    cases = {
        "short": (raw[:5], "8-byte header length at offset 0"),
        "huge_header": (struct.pack("<Q", 1 << 40) + raw[8:], "header length .* exceeds"),
        "truncated_data": (raw[:-3], "past the end of the file"),
    }
    hlen = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + hlen])
    header["stack/mhc_a_pre"]["shape"] = [7]
    body = json.dumps(header).encode()
    cases["shape_lies"] = (struct.pack("<Q", len(body)) + body + raw[8 + hlen:],
                           "'stack/mhc_a_pre' shape \\[7\\] needs 28 bytes")
    for name, (blob, msg) in cases.items():
        bad = tmp_path / f"{name}.safetensors"
        bad.write_bytes(blob)
        with pytest.raises(ParamsError, match=msg):
            load_params(bad, tiny_cfg)


@given(st.data())
def test_random_corruption_only_raises_params_error(tmp_path_factory, tiny_cfg, tiny_params, data):
    tmp = tmp_path_factory.mktemp("fuzz")
    path, raw = _valid_file(tmp, tiny_cfg, tiny_params)
    blob = bytearray(raw)
    if data.draw(st.booleans()):
        blob = blob[:data.draw(st.integers(0, len(blob) - 1))]
    else:
        for _ in range(data.draw(st.integers(1, 4))):
            i = data.draw(st.integers(0, len(blob) - 1))
            blob[i] = data.draw(st.integers(0, 255))
    path.write_bytes(bytes(blob))
    try:
        tensors, _ = load_safetensors(path)
    except ParamsError:
        return
    assert all(isinstance(t, torch.Tensor) for t in tensors.values())
