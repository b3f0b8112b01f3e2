"""Hostile DeepSeek-V4.1 fixtures: model_args and calls typed, ranged and budgeted;
--max-memory applies to `--model attn_v41`.
"""
import json
import os
import pytest
from ladder.cli.main import main as ladder_main
from ladder.v41.sides import DEFAULT_STEM as V41_STEM, V41FixtureError, load_fixture


def _v41_stem(tmp_path, edit):
    """A V4.1 fixture stem whose manifest is the committed one after `edit(manifest)`."""
    m = json.load(open(V41_STEM + ".json"))
    edit(m)
    (tmp_path / "v41.json").write_text(json.dumps(m))
    os.symlink(V41_STEM + ".safetensors", tmp_path / "v41.safetensors")
    return str(tmp_path / "v41")


def _ma(**kw):
    return lambda m: m["model_args"].update(kw)


def _call(i, **kw):
    return lambda m: m["calls"][i].update(kw)


# ---------------------------------------------------------------- 1. the V4.1 fixture
@pytest.mark.parametrize("edit, msg", [
    (_ma(rope_theta="1e4"), r"rope_theta='1e4' \(str\) must be a finite number > 1"),
    (_ma(rope_theta=1.0), r"rope_theta=1\.0 \(float\) must be a finite number > 1"),
    (_ma(beta_slow=0), r"beta_slow=0 \(int\) must be a finite number > 0"),
    (_ma(rope_factor=[2]), r"rope_factor=\[2\] \(list\) must be a finite number"),
    (_ma(norm_eps=-1.0), r"norm_eps=-1\.0 \(float\) must be a finite number >= 0"),
    (_ma(index_topk=-1), r"index_topk=-1 \(int\) must be an integer in 0\.\.2147483647"),
    (_ma(original_seq_len=2 ** 40), r"original_seq_len=1099511627776 \(int\) must be an int"),
    (_ma(candidate_block_size="2"), r"candidate_block_size='2' \(str\) must be an integer"),
    (_ma(compress_ratios="00221111"), r"compress_ratios=.00221111. must be a sequence of at most"),
    (_ma(compress_ratios=[0, 0, 2.5, 2, 1, 1, 1, 1]), r"compress_ratios=\[0, 0, 2\.5,"),
    (_ma(kv_source_layers=[2, 4] * 3000), r"kv_source_layers=\[2, 4, 2, .*\.\.\. must be a "
                                          r"sequence of at most 4096"),
    (_ma(max_seq_len=2 ** 31 - 1), r"implies .* over the memory budget of 2\.00 GiB "
                                   r"\(--max-memory\); the largest is the .* max_seq_len="
                                   r"2147483647"),
    (_ma(compress_ratios=[0] * 8, kv_source_layers=[], index_source_layers=[],
         candidate_source_layer=-1, window_size=10 ** 8),
     r"over the memory budget .* window_size=100000000"),
    (_ma(dim=65), r"tensor 'w/layers\.0\.attn\.wq_a\.weight' is bfloat16 \[16, 64\]; model_args "
                  r"need bfloat16 \[16, 65\]"),
    (_ma(head_dim=64), r"tensor 'w/layers\.0\.attn\.wq_b\.weight' is bfloat16 \[128, 16\]"),
    (lambda m: m.update(calls=[]), r"manifest field 'calls' is empty"),
    (lambda m: m["calls"][0].pop("start_pos"), r"calls\[0\] field start_pos=None must be an "
                                               r"integer in 0\.\.63"),
    (_call(0, m="1"), r"calls\[0\] field m='1' must be an integer in 1\.\.64"),
    (_call(0, m=2), r"tensor 'c000/L0/x' is bfloat16 \[1, 64\]; model_args need bfloat16 "
                    r"\[2, 64\]"),
    (_call(5, start_pos=63, m=1), None),     # inside max_seq_len: accepted (a ladder failure)
    (_call(5, start_pos=60, m=5), r"calls\[5\] field m=5 .*|start_pos=60 \+ m=5 exceeds"),
    (_call(1, key="c000"), r"calls\[1\] field key='c000' repeats an earlier call's key"),
    (lambda m: m.update(calls=m["calls"] * 100), r"'calls' has 4800 entries, over the limit "
                                                 r"4096"),
    (lambda m: m["official"].update(revision=12), r"official field revision=12 must be a string"),
    (lambda m: m["scenarios"][0].pop("name"), r"'scenarios' must be a list of at most 4096 "
                                              r"objects with a string 'name'"),
    (lambda m: m.update(scenarios={"p1": 1}), r"'scenarios' must be a list"),
])
def test_v41_fixture_model_args_and_calls_are_typed_ranged_and_budgeted(tmp_path, edit, msg):
    stem = _v41_stem(tmp_path, edit)
    if msg is None:
        load_fixture(stem)
        return
    with pytest.raises(V41FixtureError, match=msg):
        load_fixture(stem)


def test_v41_max_memory_applies_to_attn_v41(tmp_path, capsys):
    stem = _v41_stem(tmp_path, lambda m: None)
    with pytest.raises(V41FixtureError, match=r"over the memory budget of 65536 bytes"):
        load_fixture(stem, max_memory=64 << 10)
    assert load_fixture(stem, max_memory=64 << 20)[0]["calls"]
    assert ladder_main(["run", "--model", "attn_v41", "--fixture", stem,
                        "--max-memory", "64K"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "over the memory budget of 65536 bytes (--max-memory)" in err, \
        err


def _v41_stem_with(tmp_path, **model_args):
    m = json.load(open(V41_STEM + ".json"))
    m["model_args"].update(model_args)
    (tmp_path / "v41.json").write_text(json.dumps(m))
    os.symlink(V41_STEM + ".safetensors", tmp_path / "v41.safetensors")
    return str(tmp_path / "v41")


def _refused(argv, capsys, tmp_path, match):
    before = sorted(os.listdir(tmp_path))
    assert ladder_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert match in err, err
    assert sorted(os.listdir(tmp_path)) == before            # nothing written
    return err


@pytest.mark.parametrize("field, value, match", [
    ("compress_ratios", [0, 0, 10 ** 9, 2, 1, 1, 1, 1],
     "compress_ratios[2]=1000000000 outside 0..max_seq_len=64"),
    ("original_seq_len", 0, "original_seq_len=0 outside 1..2147483647"),
    ("beta_slow", 10 ** 9, "beta_slow=1000000000, beta_fast=32: need 0 < beta_slow <= "
                           "beta_fast <= original_seq_len=32"),
])
def test_v41_fields_out_of_range_are_config_errors(tmp_path, capsys, field, value, match):
    stem = _v41_stem_with(tmp_path, **{field: value})
    _refused(["run", "--model", "attn_v41", "--fixture", stem], capsys, tmp_path, match)


# ---------------------------------------------------------------- counts that size loops
def test_n_mtp_layers_past_the_layer_cap_is_refused_before_any_loop(tmp_path, capsys,
                                                                     monkeypatch):
    # was: accepted, then one loop turn per MTP stage (weights checked, stages built) for a
    # billion stages: `run` still going after 200 s
    import ladder.v41.sides as v41_sides
    import reference.v41.config as v41_config
    from reference.v41.config import MAX_LIST, V41Args, V41ConfigError
    stem = _v41_stem_with(tmp_path, n_mtp_layers=10 ** 9)
    # the refusal is the args' own check: no MTP stage is ever visited
    for mod in (v41_config, v41_sides):
        monkeypatch.setattr(mod, "mtp_weight_names", lambda k: pytest.fail("MTP stage visited"))
    err = _refused(["run", "--model", "attn_v41", "--fixture", stem], capsys, tmp_path,
                   f"n_mtp_layers=1000000000 outside 0..{MAX_LIST - 8}: n_layers + "
                   f"n_mtp_layers = 1000000008 exceeds {MAX_LIST}")
    assert "v41.json: model_args" in err
    ma = json.load(open(V41_STEM + ".json"))["model_args"]
    with pytest.raises(V41ConfigError, match=f"n_mtp_layers={MAX_LIST - 7} outside"):
        V41Args.from_any(dict(ma, n_mtp_layers=MAX_LIST - 7))
    assert V41Args.from_any(dict(ma, n_mtp_layers=MAX_LIST - 8)).n_mtp_layers == MAX_LIST - 8


def test_n_mtp_layers_at_the_cap_loads(tmp_path):
    from reference.v41.config import MAX_LIST
    man = load_fixture(_v41_stem_with(tmp_path, n_mtp_layers=MAX_LIST - 8))[0]
    assert man["model_args"]["n_mtp_layers"] == MAX_LIST - 8


def test_n_layers_past_the_layer_cap_is_named_itself(tmp_path, capsys):
    # a huge n_layers is its own field's fault, not the MTP count's
    from reference.v41.config import MAX_LIST
    stem = _v41_stem_with(tmp_path, n_layers=10 ** 9)
    _refused(["run", "--model", "attn_v41", "--fixture", stem], capsys, tmp_path,
             f"n_layers=1000000000 outside 1..{MAX_LIST}")
