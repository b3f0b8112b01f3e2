"""Official DeepSeek-V4.1 config semantics (issue #14): `n_layers` governs, compress_ratios
entries past it belong to the MTP layers (built only when their weights are given), source-list
entries outside the backbone are ignored as the official `is_backbone` ignores them, and the
official inference config.json (ModelArgs field names, every field) is accepted as it is."""
from tests import paths
import json
import os
import shutil
import sys
from types import SimpleNamespace

import pytest
import torch

from ladder.cli.main import main
from ladder.v41.sides import DEFAULT_STEM
from port.v41.attn import AttnStackV41 as PortStack
from reference.v41.attn import AttnStackV41 as RefStack
from reference.v41.config import V41Args, V41ConfigError, mtp_weight_names

sys.path.insert(0, os.path.join(paths.TOOLS, "fixtures"))
import gen_v41_attn_fixture as gen  # noqa: E402

# every field of the official ModelArgs (rev dba1be0a) that is not an attention field, with
# the values a tiny inference config.json would carry; the official loader is ModelArgs(**json)
OFFICIAL_OTHER_FIELDS = dict(
    max_batch_size=1, temperature=1.0, dtype="bf16", expert_dtype=None, vocab_size=256,
    moe_inter_dim=32, n_mtp_layers=1, n_routed_experts=4, n_shared_experts=1,
    n_activated_experts=2, score_func="sqrtsoftplus", gate_temp=1.0, norm_topk_prob=True,
    route_scale=1.0, swiglu_limit=0.0, hc_mult=4, hc_sinkhorn_iters=20, hc_eps=1e-6,
    engram_layer_ids=[], engram_num_embeddings=[], engram_max_ngram_size=1,
    engram_vocab_size=0, engram_n_heads=0, engram_head_dim=0, engram_pad_id=2,
    engram_compressed_vocab_size=0, vision_n_layers=0, vision_dim=1024, vision_n_heads=16,
    vision_inter_dim=2816, vision_patch_size=14, vision_rope_theta=10000.0,
    vision_downsample_ratio=3, vision_max_n_token=1024, vision_min_pixels=544 * 544,
    vision_max_wh_ratio=None, image_token_id=129264, dspark_block_size=6,
    dspark_noise_token_id=0, dspark_target_layer_ids=[3, 4], dspark_markov_rank=16,
    dspark_n_routed_experts=0, dspark_n_activated_experts=0)


def with_mtp_entry(ma):
    """The fixture's model args as the official config carries them with one MTP layer."""
    return dict(ma, compress_ratios=list(ma["compress_ratios"]) + [0], n_mtp_layers=1)


def outputs(stack, man, rec, n_calls=6):
    got = []
    for c in man["calls"][:n_calls]:
        for layer in range(8):
            got.append(stack.forward(layer, rec[c["key"]][layer]["x"], c["start_pos"]).clone())
    return got


@pytest.mark.parametrize("Stack", [RefStack, PortStack], ids=["reference", "port"])
def test_mtp_entry_is_accepted_and_ignored_without_weights(v41_fx, Stack):
    man, rec, w = v41_fx
    ma = with_mtp_entry(man["model_args"])
    assert len(ma["compress_ratios"]) == 9 and ma["n_layers"] == 8
    st = Stack(ma, w)                # was: weights lack 'layers.8.attn.attn_sink'
    assert st.args.n_layers == 8 and st.mtp == []
    plain = Stack(man["model_args"], w)
    for a, b in zip(outputs(st, man, rec), outputs(plain, man, rec)):
        assert torch.equal(a, b)
    # n_mtp_layers=0 (no draft layers) with the extra entry: the same backbone
    assert Stack(dict(ma, n_mtp_layers=0), w).args.ratios == tuple(man["model_args"]
                                                                   ["compress_ratios"])


@pytest.mark.parametrize("Stack", [RefStack, PortStack], ids=["reference", "port"])
def test_mtp_layers_built_when_their_weights_are_given(v41_fx, Stack):
    man, rec, w = v41_fx
    ma = with_mtp_entry(man["model_args"])
    mtp = {n: w[n.replace("mtp.0.", "layers.0.")] for n in mtp_weight_names(0)}
    AttnV41Error = sys.modules[Stack.__module__].AttnV41Error      # each side's own class
    st = Stack(ma, {**w, **mtp})
    assert st.mtp == [0] and all(n in st.w for n in mtp)
    x = rec[man["calls"][0]["key"]][0]["x"]
    with pytest.raises(AttnV41Error, match=r"layer=8 outside 0\.\.7 \(layers 8\.\. are MTP "):
        st.forward(8, x, 0)
    part = dict(mtp)
    del part["mtp.0.attn.wkv.weight"]
    with pytest.raises(AttnV41Error, match=r"weights lack 'mtp.0.attn.wkv.weight' \(MTP layer 8"):
        Stack(ma, {**w, **part})
    with pytest.raises(AttnV41Error, match=r"compress_ratios\[8\]=2 must be 0"):
        Stack(dict(ma, compress_ratios=ma["compress_ratios"][:8] + [2]), {**w, **mtp})
    with pytest.raises(AttnV41Error, match=r"MTP layer 8 has weights but compress_ratios has 8"):
        Stack(dict(ma, compress_ratios=ma["compress_ratios"][:8]), {**w, **mtp})


def test_official_config_json_field_names(v41_fx, tmp_path):
    """A config.json holding every official ModelArgs field: accepted as loaded (dict and
    ModelArgs-like object alike), the other fields ignored, the backbone the fixture's."""
    man, _, w = v41_fx
    official = {**with_mtp_entry(man["model_args"]), **OFFICIAL_OTHER_FIELDS}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(official))
    loaded = json.loads(path.read_text())
    a = V41Args.from_any(loaded)
    assert a == V41Args.from_any(SimpleNamespace(**loaded))
    assert (a.n_layers, a.n_mtp_layers, a.ratios) == (8, 1, tuple(man["model_args"]
                                                                  ["compress_ratios"]))
    RefStack(loaded, w)
    PortStack(loaded, w)
    # n_mtp_layers absent: the official default (1); n_layers absent: refused, naming it
    no_mtp = {k: v for k, v in loaded.items() if k != "n_mtp_layers"}
    assert V41Args.from_any(no_mtp).n_mtp_layers == 1
    with pytest.raises(V41ConfigError, match="lack the field 'n_layers'"):
        V41Args.from_any({k: v for k, v in loaded.items() if k != "n_layers"})


def test_backbone_rules_follow_the_official_code(v41_fx):
    man, _, _ = v41_fx
    ma = with_mtp_entry(man["model_args"])
    # source lists naming a layer past the backbone: official is_backbone ignores them
    a = V41Args.from_any(dict(ma, kv_source_layers=[2, 4, 8], index_source_layers=[2, 4, 6, 8]))
    assert a.kv_sources == (2, 4) and a.index_sources == (2, 4, 6)
    assert not a.role(7).is_index_source
    # refused: what the official model cannot build or run
    for change, msg in (
            (dict(compress_ratios=[0, 0, 2]), r"compress_ratios has 3 entries; n_layers=8"),
            (dict(n_layers=0), r"n_layers=0 must be an integer >= 1"),
            (dict(n_mtp_layers=-1), r"n_mtp_layers=-1 must be an integer >= 0"),
            (dict(kv_source_layers=[0, 2, 4]), r"kv_source_layers holds layer 0, a ratio-0")):
        with pytest.raises(V41ConfigError, match=msg):
            V41Args.from_any(dict(ma, **change))


def test_fixture_tool_takes_the_backbone_weights(v41_fx):
    """tools/fixtures/gen_v41_attn_fixture.py reads one set of weights per backbone layer from the
    official model: with the MTP entry it asks for no layer 8 (an official model builds none)."""
    man, _, w = v41_fx
    asked = []

    def get_parameter(name):
        asked.append(name)
        return w[name]
    args = SimpleNamespace(**{**with_mtp_entry(man["model_args"]), **OFFICIAL_OTHER_FIELDS})
    got = gen.fixture_weights(SimpleNamespace(get_parameter=get_parameter), args)
    assert {k[2:] for k in got} == set(w) and all(n.startswith("layers.") for n in asked)
    assert not any(n.startswith("layers.8.") for n in asked)


def test_ladder_run_with_the_mtp_entry(tmp_path):
    stem = str(tmp_path / "mtp")
    with open(DEFAULT_STEM + ".json") as f:
        man = json.load(f)
    man["model_args"] = with_mtp_entry(man["model_args"])
    man["calls"] = man["calls"][:6]                       # scenario p1's start: cheap
    with open(stem + ".json", "w") as f:
        json.dump(man, f)
    shutil.copy(DEFAULT_STEM + ".safetensors", stem + ".safetensors")
    lines = []
    rc = main(["run", "--model", "attn_v41", "--fixture", stem], out=lines.append)
    text = "\n".join(lines)
    assert rc == 0, text
    assert "model: 8 layers" in text
    assert "reference vs official: " in text and "over 6 steps, 0 failing (PASS)" in text


def test_port_reads_only_the_description_from_the_reference():
    """The V4.1 port (runtime, graph path, state) imports reference.v41.config and none of the
    reference's V4.1 math (attn, index, quant, rope)."""
    import subprocess
    code = ("import port.v41.attn, port.v41.graph, port.v41.state, sys; "
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('reference.v41'))))")
    loaded = subprocess.check_output([sys.executable, "-c", code], text=True).split()
    assert loaded == ["reference.v41", "reference.v41.config"], loaded
