"""The committed forward-parity fixture: integrity, port and reference against it, byte-identical
regeneration, and refusal of fixtures that are malformed, corrupt, stale or for another model."""
import json
import os
import shutil

import pytest
import torch

from ladder.sides import fixtures
from ladder.sides.capture import capture_port, capture_reference
from ladder.cli.main import main
from ladder.engine.compare import compare_ladders
from ladder.engine.rules import Rule, RuleSet
from ladder.engine.trace import ReferenceRecorder
from port.model import V2Model
from reference.config import V2Config
from tests.captures import FIXTURE


@pytest.fixture(scope="module")
def fx():
    return fixtures.load(FIXTURE)


def _copy(tmp_path, manifest_edit=None, data_edit=None):
    stem = str(tmp_path / "fx")
    for ext in (".safetensors", ".json"):
        shutil.copyfile(FIXTURE + ext, stem + ext)
    if manifest_edit:
        m = json.load(open(stem + ".json"))
        manifest_edit(m)
        json.dump(m, open(stem + ".json", "w"))
    if data_edit:
        raw = bytearray(open(stem + ".safetensors", "rb").read())
        raw = data_edit(raw)
        open(stem + ".safetensors", "wb").write(bytes(raw))
    return stem


def test_fixture_is_what_its_manifest_says(fx):
    m = fx.manifest
    assert m["schema_version"] == fixtures.SCHEMA and m["generator"] == fixtures.GENERATOR
    assert fx.cfg == V2Config.preset(m["params"]["preset"])
    assert fx.ladder.keys() == m["ladder_order"]
    n = len(fx.tokens)
    assert fx.window and n > fx.window                   # decode steps run past the window
    assert os.path.getsize(FIXTURE + ".safetensors") < 1_000_000


def test_port_and_reference_match_the_fixture(fx):
    params = fixtures.fixture_params(fx)
    model = V2Model.from_params(params, fx.cfg)
    port = capture_port(model, fx.tokens, fx.prompt_len, window=fx.window)
    cmp = compare_ladders(port, fx.ladder, prefix="port")
    assert cmp.passed, str(cmp)
    ref = capture_reference(params, fx.cfg, fx.tokens, fx.prompt_len, window=fx.window)
    cmp = compare_ladders(ref, fx.ladder, prefix="arbiter")
    assert cmp.passed, str(cmp)


def test_fixture_regenerates_byte_for_byte(fx, tmp_path):
    if fx.manifest["torch_version"] != torch.__version__.split("+")[0]:
        pytest.skip(f"fixture written with torch {fx.manifest['torch_version']}")
    m = fx.manifest
    params = fixtures.fixture_params(fx)
    tensors, manifest = fixtures.build(params, fx.cfg, fx.tokens, fx.prompt_len,
                                       params_source=m["params"], seed=m["seed"],
                                       window=fx.window)
    new = fixtures.write(tmp_path / "again", tensors, manifest)
    for path, ext in zip(new, (".safetensors", ".json")):
        assert open(path, "rb").read() == open(FIXTURE + ext, "rb").read(), ext


def test_geometry_mismatch_is_refused_naming_the_field(fx):
    with pytest.raises(fixtures.FixtureError, match="field kv_window is 8 in the fixture, 4 in "
                                                    "the model"):
        fixtures.check_geometry(fx, fx.cfg.replace(kv_window=4))
    with pytest.raises(fixtures.FixtureError, match=r"field vocab_size is 256 .* 8192 .*\(and "):
        fixtures.check_geometry(fx, V2Config.preset("shipped"))
    fixtures.check_geometry(fx, V2Config.preset("tiny"))


@pytest.mark.parametrize("edit, msg", [
    (lambda m: m.pop("sha256"), "manifest lacks field 'sha256'"),
    (lambda m: m.update(schema_version=2), "schema_version=2; this reader knows 1"),
    (lambda m: m.update(seed="0"), "field 'seed' is str, needs int"),
    (lambda m: m["schedule"].pop("prompt_len"), "schedule: manifest lacks field 'prompt_len'"),
    (lambda m: m["schedule"]["tokens"].__setitem__(0, 999), "id 999 outside 0..vocab_size-1"),
    (lambda m: m["schedule"].update(prompt_len=5), "field schedule.steps does not match"),
    (lambda m: m["config"].update(num_layers=0), "field config: num_layers=0"),
    (lambda m: m["ladder_order"].pop(), "field ladder_order does not list"),
    (lambda m: m["sha256"].pop("tokens"), "tensor 'tokens' is in only one of"),
])
def test_malformed_manifests_name_the_field(tmp_path, edit, msg):
    with pytest.raises(fixtures.FixtureError, match=msg):
        fixtures.load(_copy(tmp_path, manifest_edit=edit))


def test_corrupt_files_name_the_tensor_or_offset(tmp_path):
    stem = _copy(tmp_path)
    open(stem + ".json", "w").write('{"schema_version": 1,\n "x": }')
    with pytest.raises(fixtures.FixtureError, match=r"malformed JSON at line 2 column 7 "
                                                    r"\(offset 28\)"):
        fixtures.load(stem)
    cut = lambda raw: raw[:len(raw) // 2]
    with pytest.raises(fixtures.FixtureError, match=r"past the end of the file"):
        fixtures.load(_copy(tmp_path, data_edit=cut))
    huge = lambda raw: (2**40).to_bytes(8, "little") + raw[8:]
    with pytest.raises(fixtures.FixtureError, match="header length 1099511627776 at offset 0"):
        fixtures.load(_copy(tmp_path, data_edit=huge))

    def flip(raw):
        raw[-3] ^= 0x40                               # one bit of the last tensor's data
        return raw
    with pytest.raises(fixtures.FixtureError, match="tensor 'ladder/.*' does not match its sha256"):
        fixtures.load(_copy(tmp_path, data_edit=flip))


def test_stale_parameters_are_refused(tmp_path):
    def reseed(m):
        m["params"]["seed"] = 1
    fx = fixtures.load(_copy(tmp_path, manifest_edit=reseed))
    with pytest.raises(fixtures.FixtureError, match="parameters' sha256 .* regenerate"):
        fixtures.fixture_params(fx)


def test_build_refuses_when_the_float32_reference_disagrees(fx):
    strict = RuleSet(rules={"arbiter/*": Rule(0.0, why="bit-exact, impossible in f32")})
    with pytest.raises(fixtures.FixtureError, match="disagrees with the float64 arbiter at "
                                                    "prefill/.*nothing written"):
        fixtures.build(fixtures.fixture_params(fx), fx.cfg, fx.tokens[:7], 6,
                       params_source=fx.manifest["params"], seed=0, rules=strict)


def test_regen_writes_nothing_when_tracing_changes_a_bit(tmp_path, monkeypatch, capsys):
    rcall = ReferenceRecorder.__call__

    def writes_back(self, name, layer, values):
        rcall(self, name, layer, values)
        if name == "y":
            values.add_(1e-3)
    monkeypatch.setattr(ReferenceRecorder, "__call__", writes_back)
    out = tmp_path / "out"
    out.mkdir()
    rc = main(["regen", "--out", str(out / "fx"), "--steps", "2"], out=lambda *_: None)
    assert rc == 1 and "traced run differs from the plain run" in capsys.readouterr().err
    assert os.listdir(out) == []


def test_a_stale_fixture_is_blamed_not_the_port(tmp_path, monkeypatch, capsys):
    """A fixture written while the reference had a bug (here: L01.attn_out recorded 1 % high)
    fails the fixed port; the run holds the fixture to the reference recomputed now and says
    the file is what is wrong, instead of splitting the port's "error" (issue 34)."""
    import reference.decode as decode
    emit = decode._emit

    def skewed(trace, name, layer, value):
        emit(trace, name, layer, value * 1.01 if (name, layer) == ("attn_out", 1) else value)
    monkeypatch.setattr(decode, "_emit", skewed)
    stem = str(tmp_path / "fx")
    assert main(["regen", "--out", stem, "--steps", "2", "--prompt-len", "3"],
                out=lambda *_: None) == 0
    monkeypatch.setattr(decode, "_emit", emit)
    capsys.readouterr()
    assert main(["run", "--fixture", stem]) == 1
    text = capsys.readouterr().out
    assert f"the stored fixture {stem} disagrees with the reference at prefill/L01.attn_out" \
        in text and f"regenerate it (python -m ladder regen --out {stem})" in text
    assert "the port matches the recomputed reference at every point" in text
    assert "ladder locate" not in text                     # not sent to split the port's error
    assert main(["locate", "--fixture", stem]) == 1
    text = capsys.readouterr().out
    assert "disagrees with the reference at prefill/L01.attn_out" in text
    assert "inherited" not in text and "own error" not in text
    # a fixture that agrees with the reference: the port is blamed as before
    good = str(tmp_path / "good")
    assert main(["regen", "--out", good, "--steps", "2", "--prompt-len", "3"],
                out=lambda *_: None) == 0
    assert main(["run", "--fixture", good, "--plant", "hpost_one"]) == 1
    text = capsys.readouterr().out
    assert "disagrees with the reference" not in text and "first divergence" in text


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def test_fixture_given_by_its_safetensors_file_names_the_right_files(tmp_path, capsys):
    for name in ("x.safetensors", "x.json", "x"):
        assert run("run", "--fixture", str(tmp_path / name)) == (2, "")
        err = capsys.readouterr().err
        assert f"no {tmp_path / 'x'}.json + {tmp_path / 'x'}.safetensors" in err, err
        assert ".safetensors.json" not in err and ".json.json" not in err


def _fixture_copy(tmp_path, name="v2_forward_vectors"):
    import shutil
    from tests.captures import FIXTURE
    for ext in (".json", ".safetensors"):
        shutil.copyfile(FIXTURE + ext, tmp_path / f"{name}{ext}")
    return tmp_path / name


def test_regen_refuses_to_overwrite_the_committed_fixture_from_other_inputs(
        monkeypatch, tmp_path, capsys):
    from ladder.sides import fixtures
    stem = _fixture_copy(tmp_path)          # stands in for the checkout's committed fixture
    monkeypatch.setattr(fixtures, "REPO_FIXTURES", str(tmp_path))
    before = [open(f"{stem}{ext}", "rb").read() for ext in (".json", ".safetensors")]
    for flags in (["--seed", "5"], ["--steps", "3"], ["--preset", "tiny", "--window", "4"]):
        assert run("regen", *flags) == (2, "")
        err = capsys.readouterr().err
        assert f"regen {flags[-2]} {flags[-1]}: would overwrite the committed fixture {stem}" \
               in err and "--force" in err, err
    assert [open(f"{stem}{ext}", "rb").read() for ext in (".json", ".safetensors")] == before
    assert run("regen")[0] == 0             # the default inputs rewrite it (the same bytes)
    assert run("regen", "--seed", "5", "--out", str(tmp_path / "other"))[0] == 0
    assert run("regen", "--seed", "5", "--force")[0] == 0
    assert open(f"{stem}.json", "rb").read() != before[0]


def test_regen_check_names_the_first_differing_field_or_tensor(tmp_path):
    import json
    import torch
    from ladder.sides import fixtures
    from reference.params import load_safetensors
    stem = _fixture_copy(tmp_path, "fx")
    m = json.loads(open(f"{stem}.json").read())
    m["seed"] = 7
    open(f"{stem}.json", "w").write(json.dumps(m, indent=1, sort_keys=True) + "\n")
    rc, text = run("regen", "--out", str(stem), "--check")
    assert rc == 1 and "DIFFER from a fresh regeneration: first at manifest field seed: 7 in " \
                       "the file, 0 regenerated" in text, text
    m["seed"] = 0
    tensors, _ = load_safetensors(f"{stem}.safetensors")
    key = "ladder/decode03/L02.x"
    tensors[key] = tensors[key] + torch.finfo(torch.float32).eps
    m["sha256"][key] = fixtures.tensor_sha256(tensors[key])
    fixtures.write(stem, tensors, m)
    rc, text = run("regen", "--out", str(stem), "--check")
    assert rc == 1 and f"first at tensor {key!r} differs" in text, text
    _fixture_copy(tmp_path, "fx")
    open(f"{stem}.json", "a").write(" ")
    rc, text = run("regen", "--out", str(stem), "--check")
    assert rc == 1 and "same manifest fields and tensors, other bytes (the JSON formatting)" \
        in text, text


def test_fixture_stands_in_for_the_reference_which_does_not_run(monkeypatch):
    import ladder.cli.commands
    from tests.captures import FIXTURE

    def live(*a, **k):
        raise AssertionError("the reference ran live beside --fixture")
    monkeypatch.setattr(ladder.cli.commands, "capture_reference", live)
    rc, text = run("run", "--fixture", FIXTURE)
    assert rc == 0, text
    assert f"reference: not run; fixture {FIXTURE} stands in (reference.decode.forward_cached " \
           f"on float64 parameters, rounded to float32, written by " \
           f"tools/gen_v2_forward_parity.py" in text
    assert "tracing changes no bit: port step_traced" in text
    assert "reference not run (fixture), port" in text


def test_a_fixture_not_written_by_the_reference_is_refused(tmp_path, capsys):
    import json
    for key, value in (("generator", "tools/fixtures/gen_upstream_fixture.py"),
                       ("values", "port (torch, eager) step_traced, float32")):
        stem = _fixture_copy(tmp_path, "fx")
        m = json.loads(open(f"{stem}.json").read())
        m[key] = value
        open(f"{stem}.json", "w").write(json.dumps(m))
        assert run("run", "--fixture", str(stem), "--no-check-plain") == (2, "")
        err = capsys.readouterr().err
        assert f"{stem}.json: field {key}={json.dumps(value)}, needs " in err
        assert "cannot stand in for the reference" in err
