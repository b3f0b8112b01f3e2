"""Every port, not only ours: trace archives, needle-rs's fixture both ways, name maps,
`ladder compare`, the in-process port protocol, and local vs propagated from a dump alone."""
from tests import paths
import json
import os
import struct
import subprocess
import sys

import pytest
import torch

from ladder.engine import archive
from ladder.formats import needle_rs
from ladder.engine.archive import ArchiveError
from ladder.sides.capture import capture_port, capture_reference
from ladder.cli.main import main
from ladder.engine.compare import compare_ladders
from ladder.sides.dump_locate import locate_dump
from ladder.model.geometry import geometry_of
from ladder.formats.namemap import NameMapError, from_dict, load_map
from ladder.engine.rules import DEFAULT_RULES, NEEDLE_RS_RULES
from ladder.sides.reference_rules import rule_for
from ladder.model.names import layer_of
from ladder.engine.trace import Ladder
from tests.captures import clean_port_ladder, reference_ladder, setup

CACT = os.path.join(paths.FIXTURES, "cact_w4.cact")
TOY = "tests.ports.toy_port"


@pytest.fixture(autouse=True)
def _ports_importable(monkeypatch):
    monkeypatch.syspath_prepend(paths.ROOT)


def _save(lad, path, cfg, window=None):
    return lad.save(path, producer={"name": "test", "backend": "torch"},
                    geometry=geometry_of(cfg), kv_window=cfg.kv_window if window is None
                    else window, weights={"source": "init"}, prompt_len=len(lad.steps[0].tokens))


def _rows(cmp):
    return [(r.key, r.passed, r.error, r.max_abs) for r in cmp.rows]


# ---------------------------------------------------------------- trace archives
def test_archive_round_trips_bit_for_bit(tmp_path):
    cfg = setup()[0]
    lad = clean_port_ladder()
    back = Ladder.load(_save(lad, tmp_path / "a.safetensors", cfg))
    assert back.keys() == lad.keys() and back.steps == lad.steps
    assert all(torch.equal(back[k], lad[k]) for k in lad.keys())
    m = back.meta
    assert m["format"] == "needle-parity-trace" and m["schema_version"] == 2
    assert m["geometry"]["num_layers"] == cfg.num_layers and m["captured"] == "all"
    logits = lad[f"{lad.steps[-1].name}/logits"][-1]
    assert m["argmax"][lad.steps[-1].name] == int(torch.argmax(logits))


@pytest.mark.parametrize("side", ["torch", "native"])
def test_dump_then_compare_equals_run_point_for_point(tmp_path, side, capsys):
    """`dump` -> `compare` gives run's comparison: same rows, errors and verdicts."""
    cfg, params, _, tokens, prompt = setup()
    out = tmp_path / f"{side}.safetensors"
    assert main(["dump", side, "--out", str(out)]) == 0
    dumped = Ladder.load(out)
    from port.model import V2Model
    model = V2Model.from_params(params, cfg, backend=side)
    live = capture_port(model, tokens, prompt)
    ref = reference_ladder()
    assert _rows(compare_ladders(dumped, ref, DEFAULT_RULES)) == \
        _rows(compare_ladders(live, ref, DEFAULT_RULES))
    capsys.readouterr()
    assert main(["compare", str(out), "reference"]) == 0
    assert "0 failing (PASS)" in capsys.readouterr().out


def test_dump_then_compare_triton_under_the_interpreter(tmp_path, monkeypatch, capsys):
    pytest.importorskip("triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    out = tmp_path / "t.safetensors"
    flags = ["--prompt-len", "2", "--steps", "1"]
    assert main(["dump", "triton", "--out", str(out), *flags]) == 0
    capsys.readouterr()
    assert main(["compare", str(out), "reference"]) == 0
    text = capsys.readouterr().out
    assert "0 failing (PASS)" in text and "hidden by fusion" in text
    # and point for point what a live capture of the same backend gives
    from port.model import V2Model
    cfg, params, _, tokens, _ = setup()
    live = capture_port(V2Model.from_params(params, cfg, backend="triton"), tokens[:3], 2)
    ref = capture_reference(params, cfg, tokens[:3], 2)
    assert _rows(compare_ladders(Ladder.load(out), ref, DEFAULT_RULES)) == \
        _rows(compare_ladders(live, ref, DEFAULT_RULES))


def _archive_bytes(tmp_path, mutate):
    """A real archive with its manifest edited by `mutate`, re-framed as safetensors."""
    from safetensors.torch import save_file
    cfg = setup()[0]
    p = _save(clean_port_ladder(), tmp_path / "a.safetensors", cfg)
    from reference.params import load_safetensors
    tensors, meta = load_safetensors(p)
    m = json.loads(meta[archive.META_KEY])
    mutate(m, tensors)
    bad = tmp_path / "bad.safetensors"
    save_file(tensors, str(bad), metadata={archive.META_KEY: json.dumps(m)})
    return bad


@pytest.mark.parametrize("mutate,needle", [
    (lambda m, t: m.update(format="other"), "field format"),
    (lambda m, t: m.update(schema_version=3), "schema_version=3"),
    (lambda m, t: m.update(captured="some"), "field captured"),
    (lambda m, t: m["schedule"]["steps"][1].update(pos=-1), "field pos=-1 outside"),
    (lambda m, t: m["schedule"]["steps"][0].update(len=10 ** 9), "field len="),
    (lambda m, t: m["schedule"].update(tokens=[-1]), "schedule.tokens"),
    (lambda m, t: m.update(points=m["points"][1:]), "is not one of field points ('"),
    (lambda m, t: m["schedule"]["steps"][1].update(name="other"),
     "is not one of schedule.steps' names ('prefill', 'other'"),
    (lambda m, t: t.update({"prefill/embed": t["prefill/embed"][:1]}),
     "field captured='all' needs a leading axis of 6 position(s) for step 'prefill'; a "
     "last-position-only dump says captured=\"last\""),
    (lambda m, t: t.update({"prefill/embed": t["prefill/embed"].to(torch.int32)}),
     "is torch.int32; needs float32, float64, float16, bfloat16 or int64"),
    (lambda m, t: m.pop("geometry"), "lacks field 'geometry'"),
])
@pytest.mark.parametrize("lazy", [False, True])
def test_hostile_archive_is_refused_naming_the_field(tmp_path, mutate, needle, lazy):
    with pytest.raises(ArchiveError, match=None) as e:
        Ladder.load(_archive_bytes(tmp_path, mutate), lazy=lazy)
    assert needle in str(e.value)


def _renamed_steps(m, t):
    # what a writer in another language may well do: decode0, decode1, ... (no padding)
    names = {st["name"]: st["name"] if st["name"] == "prefill" else f"decode{int(st['name'][6:])}"
             for st in m["schedule"]["steps"]}
    for st in m["schedule"]["steps"]:
        st["name"] = names[st["name"]]
    m["argmax"] = {names[k]: v for k, v in m["argmax"].items()}
    for key in list(t):
        step, point = key.split("/", 1)
        t[f"{names[step]}/{point}"] = t.pop(key)


def test_steps_are_matched_by_position_and_tokens_not_by_their_spelling(tmp_path, capsys):
    bad = _archive_bytes(tmp_path, _renamed_steps)
    lad = Ladder.load(bad, lazy=True)
    assert [s.name for s in lad.steps] == [s.name for s in clean_port_ladder().steps]
    assert lad.meta["renamed_steps"]["decode0"] == "decode00"
    assert all(torch.equal(lad[k], clean_port_ladder()[k]) for k in clean_port_ladder().keys())
    assert main(["compare", str(bad), "reference"]) == 0
    out = capsys.readouterr().out
    assert "steps matched by position and tokens, read as ours: decode0 -> decode00" in out


def test_ladders_of_different_schedules_name_the_first_step_that_differs():
    from dataclasses import replace
    from ladder.engine.compare import CompareError
    a, b = clean_port_ladder(), reference_ladder()
    steps = list(b.steps)
    steps[2] = replace(steps[2], tokens=(steps[2].tokens[0] + 1,))
    other = Ladder(steps, b.values, "other")
    with pytest.raises(CompareError) as e:
        compare_ladders(a, other, DEFAULT_RULES)
    assert f"step 2 has tokens ({a.steps[2].tokens[0]},)" in str(e.value)


def test_a_manifest_argmax_that_its_logits_contradict_is_refused(tmp_path, capsys):
    def lie(m, t):
        last = m["schedule"]["steps"][-1]["name"]
        m["argmax"][last] = (m["argmax"][last] + 1) % 64
    bad = _archive_bytes(tmp_path, lie)
    assert main(["compare", str(bad), "reference"]) == 2
    err = capsys.readouterr().err
    assert "manifest field argmax['decode" in err and "the archive contradicts itself" in err


def test_a_half_precision_recording_is_named_beside_float32_rules(tmp_path, capsys):
    def halve(m, t):
        m["producer"]["dtype"] = "float16"
        for k in t:
            t[k] = t[k].half() if t[k].is_floating_point() else t[k]
    bad = _archive_bytes(tmp_path, halve)
    main(["compare", str(bad), "reference"])
    out = capsys.readouterr().out
    assert "was recorded in float16" in out and "the rules are float32 rules" in out


def test_archives_are_written_with_the_umask_like_any_file(tmp_path):
    old = os.umask(0o022)
    try:
        p = _save(clean_port_ladder(), tmp_path / "u.safetensors", setup()[0])
    finally:
        os.umask(old)
    assert os.stat(p).st_mode & 0o777 == 0o644           # not safetensors' 0600


def test_a_lazy_archive_reads_the_same_bits_one_step_at_a_time(tmp_path):
    cfg = setup()[0]
    lad = clean_port_ladder()
    path = _save(lad, tmp_path / "a.safetensors", cfg)
    lazy = Ladder.load(path, lazy=True)
    assert lazy.keys() == lad.keys()
    for st in lad.steps:
        for p in lad.points(st.name):
            assert torch.equal(lazy[f"{st.name}/{p}"], lad[f"{st.name}/{p}"])
        held = {k.split("/")[0] for k in lazy.values._cache}
        assert held == {st.name}                 # the other steps stay on disk
    last = lazy.last_only()
    assert torch.equal(last["decode03/L02.x"], lad["decode03/L02.x"][-1:])
    ref = reference_ladder()
    fresh = Ladder.load(path, lazy=True)
    assert _rows(compare_ladders(fresh, ref, DEFAULT_RULES)) == \
        _rows(compare_ladders(lad, ref, DEFAULT_RULES))
    step_bytes = max(sum(lad[f"{st.name}/{p}"].numel() * 4 for p in lad.points(st.name))
                     for st in lad.steps)
    assert fresh.values.peak_held == step_bytes      # one step in memory, never more


def test_archive_reader_uses_the_hostile_input_layer(tmp_path):
    p = tmp_path / "x.safetensors"
    p.write_bytes(struct.pack("<Q", 10 ** 12) + b"{}")
    with pytest.raises(ArchiveError, match="header length"):
        Ladder.load(p)
    with pytest.raises(ArchiveError, match="directory"):
        Ladder.load(tmp_path)


# ---------------------------------------------------------------- needle-rs, both ways
def _read_as_rust(stem):
    """needle-rs's test's reading: floats from bytes, offsets in floats, shape product max 1."""
    m = json.loads(open(stem + ".json").read())
    raw = open(stem + ".f32", "rb").read()
    floats = struct.unpack(f"<{len(raw) // 4}f", raw)

    def get(key):
        e = m["blob_index"].get(key)
        if e is None:
            return None
        n = 1
        for d in e["shape"]:
            n *= d
        return torch.tensor(floats[e["offset"]:e["offset"] + max(n, 1)])
    return m, get


@pytest.mark.parametrize("preset,steps", [("tiny", 4), ("shipped", 2)])
def test_needle_rs_fixture_passes_a_reader_that_does_what_the_rust_test_does(tmp_path, preset,
                                                                            steps):
    from port.model import V2Model
    from reference.config import V2Config
    from reference.params import init_params
    stem = str(tmp_path / "v2")
    flags = ["--preset", preset, "--prompt-len", "3", "--steps", str(steps)]
    assert main(["regen", "--format", "needle-rs", "--out", stem, *flags]) == 0
    m, get = _read_as_rust(stem)
    cfg = V2Config.preset(preset)
    g = m["geometry"]
    assert (g["d_model"], g["num_layers"], g["head_dim"], m["kv_window"]) == \
        (cfg.d_model, cfg.num_layers, cfg.head_dim, cfg.kv_window)
    assert [s["name"] for s in m["steps"]] == ["prefill"] + [f"decode{i}" for i in range(steps)]
    model = V2Model.from_params(init_params(cfg, 0, perturbed=True), cfg)
    state, checked = model.make_state(), 0
    for s in m["steps"]:
        *prefix, last = s["tokens"]
        for t in prefix:
            model.step(t, state)
        seen = {}

        def trace(name, layer, v):
            seen[name if layer is None else f"L{layer:02d}.{name}"] = v.reshape(-1).clone()
        logits = model.step_traced(last, state, None, trace)
        for key, mine in seen.items():
            want = get(f"{s['name']}/{key}")
            if want is None:
                continue
            assert mine.shape == want.shape, key
            assert rule_for(f"needle_rs/{key.split('.')[-1] if '.' in key else key}",
                            NEEDLE_RS_RULES).check(mine, want), key
            checked += 1
        assert int(torch.argmax(logits)) == s["argmax"], s["name"]
    per_step = 3 + 8 * cfg.num_layers - (cfg.num_layers - cfg.num_sites) + 3
    assert checked == per_step * len(m["steps"])
    assert m["generated_ids"] == [s["tokens"][0] for s in m["steps"][1:]]
    # and read back: the same ladder, last positions, our names
    back = needle_rs.read(stem)
    ref = capture_reference({k: v.double() for k, v in init_params(cfg, 0, perturbed=True)
                             .items()}, cfg, back.tokens, 3).last_only()
    for key, v in back.values.items():
        assert torch.equal(v, ref[key].float()), key


def test_needle_rs_from_a_cact_carries_prompt_and_generated_text(tmp_path):
    stem = str(tmp_path / "v2")
    assert main(["regen", "--format", "needle-rs", "--cact", CACT, "--prompt", "hello world",
                 "--steps", "3", "--out", stem]) == 0
    m = json.load(open(stem + ".json"))
    from reference.cact import read_cact
    tok = read_cact(CACT).tokenizer
    assert m["prompt_ids"] == [tok.bos_id] + tok.encode("hello world")
    assert m["generated_text"] == tok.decode(m["generated_ids"]) and m["prompt"] == "hello world"
    assert m["source"] == "cact_w4.cact"
    assert main(["regen", "--format", "needle-rs", "--cact", CACT, "--prompt", "hello world",
                 "--steps", "3", "--out", stem, "--check"]) == 0


def test_needle_rs_fixture_is_either_side(tmp_path, capsys):
    stem = str(tmp_path / "v2")
    assert main(["regen", "--format", "needle-rs", "--out", stem, "--steps", "3"]) == 0
    capsys.readouterr()
    assert main(["compare", stem, "reference", "--steps", "3"]) == 0
    text = capsys.readouterr().out
    assert "0 failing (PASS)" in text and "needle-rs records the coarse ladder only" in text
    assert main(["compare", "torch", stem]) == 0


@pytest.mark.parametrize("edit,needle", [
    (lambda m: m["blob_index"]["prefill/embed"].update(offset=10 ** 9), "offset="),
    (lambda m: m["blob_index"]["prefill/embed"].update(shape=[2000, 4]), "runs past"),
    (lambda m: m["steps"][1].update(name="decode7"), "expected the decode step 0"),
    (lambda m: m["steps"][0]["blobs"].update(weird="prefill/embed"), "does not cover"),
    (lambda m: m["geometry"].update(num_layers="6"), "geometry.num_layers"),
    (lambda m: m.pop("blob_index"), "is not needle-rs's fixture layout (ladder/formats/needle_rs.py). "
                                    "A port's values come in three ways: a trace archive"),
])
def test_hostile_needle_rs_fixture_is_refused(tmp_path, edit, needle):
    stem = str(tmp_path / "v2")
    assert main(["regen", "--format", "needle-rs", "--out", stem, "--steps", "2"]) == 0
    m = json.load(open(stem + ".json"))
    edit(m)
    json.dump(m, open(stem + ".json", "w"))
    with pytest.raises(ValueError) as e:
        needle_rs.read(stem)
    assert needle in str(e.value)


# ---------------------------------------------------------------- name maps
def test_upstream_capture_compares_through_its_map(capsys):
    up = os.path.join(paths.FIXTURES, "upstream_v2.safetensors")
    assert main(["compare", up, "reference", "--map", "upstream-jax", "--preset", "tiny",
                 "--seed", "1234"]) == 0
    text = capsys.readouterr().out
    assert "0 failing (PASS)" in text
    assert "the last layer has none" in text          # L05.x: not compared, with its reason


def test_a_maps_reshape_registry_is_applied_to_foreign_safetensors(tmp_path, capsys):
    # a foreign file that stores every value flat per position ([S, H*hd] for q), read with a
    # documented map saying reshape = "registry": it must compare, not diverge (issue 34)
    from safetensors.torch import save_file
    from ladder.model.points import LAYER, POINTS
    ref = reference_ladder()
    tensors = {f"mine/{k}": v.reshape(v.shape[0], -1).contiguous() for k, v in
               ref.values.items()}
    tensors["mine/tokens"] = torch.tensor(ref.tokens)
    assert tensors["mine/prefill/L00.q"].dim() == 2          # flat, unlike the registry's
    path = tmp_path / "flat.safetensors"
    save_file(tensors, str(path))
    whole = sorted({k.split("/", 1)[1] for k in ref.values if layer_of(k.split("/")[1]) is None})
    per_layer = [p.name for p in POINTS if p.scope == LAYER]
    toml = tmp_path / "flat.toml"
    toml.write_text(f'''[map]
name = "flat"
prefix = "mine/"
tokens = "mine/tokens"
reshape = "registry"

[steps]
prefill = "prefill"
decode = "decode{{i:02d}}"

[[points]]
theirs = "{{name}}"
ours = "{{name}}"
names = {json.dumps(whole)}

[[points]]
theirs = "L{{layer}}.{{name}}"
ours = "L{{layer}}.{{name}}"
names = {json.dumps(per_layer)}
''')
    assert main(["compare", str(path), "reference", "--map", str(toml)]) == 0, \
        capsys.readouterr()
    assert "0 failing (PASS)" in capsys.readouterr().out


def test_a_name_the_map_does_not_cover_is_an_error():
    nm = load_map("needle-rs")
    assert nm.point_of("L07.hres")[0] == "L07.hres"
    with pytest.raises(NameMapError, match="'L07.zz'"):
        nm.point_of("L07.zz")
    with pytest.raises(NameMapError, match="unknown table"):
        from_dict({"map": {"name": "x"}, "renames": {}})
    assert nm.why_not_emitted("L03.q", 6) and nm.why_not_emitted("L03.y", 6) is None


# ---------------------------------------------------------------- dumps located
def _perturbed(lad, key, factor):
    vals = dict(lad.values)
    vals[key] = vals[key] * factor
    return Ladder(lad.steps, vals, "perturbed", dict(lad.hidden), lad.captured, lad.meta)


def test_a_dump_with_one_point_perturbed_is_blamed_there(tmp_path):
    cfg, params = setup()[:2]
    dump = Ladder.load(_save(_perturbed(clean_port_ladder(), "decode03/L02.u", 1.001),
                             tmp_path / "p.safetensors", cfg))
    cmp = compare_ladders(dump, reference_ladder(), DEFAULT_RULES)
    assert cmp.first.key == "decode03/L02.u"
    loc = locate_dump(cmp, dump, reference_ladder(), params, cfg, cfg.kv_window)
    assert loc.position == dump.step("decode03").pos and "own error" in loc.verdict


def test_a_layer_fed_bad_inputs_is_inherited_at_the_next_layer(capsys):
    """The toy port's layer 2 is wrong: own at L02; L03 reproduces from its inputs."""
    assert main(["locate", "--port", f"{TOY}:build_buggy"]) == 1
    text = capsys.readouterr().out
    assert "first divergence: prefill/L02.hpost" in text and "own error" in text
    from ladder.sides.ports import build_port, capture_protocol
    cfg, params, _, tokens, prompt = setup()
    lad = capture_protocol(build_port(f"{TOY}:build_buggy", params, cfg), cfg, tokens, prompt)
    cmp = compare_ladders(lad, reference_ladder(), DEFAULT_RULES)
    loc = locate_dump(cmp, lad, reference_ladder(), params, cfg, cfg.kv_window)
    by = {r.point: r for r in loc.layers}
    assert by["L02.x"].own and by["L02.x"].propagated > 1
    assert by["L03.x"].propagated > 1 and not by["L03.x"].own        # inherited


def test_a_dump_lacking_keys_says_what_the_split_could_not_use(tmp_path):
    cfg, params = setup()[:2]
    from ladder.sides.ports import build_port, capture_protocol
    _, _, _, tokens, prompt = setup()
    lad = capture_protocol(build_port(f"{TOY}:build_buggy", params, cfg), cfg, tokens, prompt)
    keep = {k: v for k, v in lad.values.items() if not k.endswith((".k", ".v"))}
    dump = Ladder(lad.steps, keep, "no kv", {k: "not recorded" for k in lad.values
                                             if k not in keep})
    cmp = compare_ladders(dump, reference_ladder(), DEFAULT_RULES)
    # the first divergence is at position 0, which has no history; decode03's window does
    assert cmp.first.first_bad_pos == 0
    later = locate_dump(_only_from(cmp, "decode03"), dump, reference_ladder(), params, cfg,
                        cfg.kv_window)
    assert "the dump lacks L02.k at" in later.verdict and "record those points" in later.verdict


def _planted_dump(fault, drop=(), last=False):
    from ladder.sides.faults import planted
    from tests.captures import port_model
    cfg, params, _, tokens, prompt = setup()
    with planted(fault, "torch"):
        lad = capture_port(port_model(), tokens, prompt)
    lad = lad.last_only() if last else lad
    keep = {k: v for k, v in lad.values.items() if not any(d in k for d in drop)}
    return Ladder(lad.steps, keep, "dump", {k: "not recorded" for k in lad.values
                                            if k not in keep}, lad.captured), params, cfg


def test_a_fault_in_an_unrecorded_input_is_not_called_the_layers_own():
    # the Engram hash is wrong, but the dump does not record the Engram rows: the reference's
    # own rows stand in, and "own" would blame L01 for what came in with them (issue 34)
    dump, params, cfg = _planted_dump("engram_hash_seed", drop=("/engram_",))
    cmp = compare_ladders(dump, reference_ladder(), DEFAULT_RULES)
    loc = locate_dump(cmp, dump, reference_ladder(), params, cfg, cfg.kv_window)
    assert loc.point == "L01.alpha" and loc.split == "undecided"
    assert loc.verdict.startswith("own, or inherited from an unrecorded input")
    assert "engram_k0 at position 1, engram_v0 at position 1 standing in" in loc.verdict
    rows = [line.split() for line in str(loc).splitlines() if line.endswith(("<- own",
                                                                             "<- own?"))]
    assert rows and all(r[-1] == "own?" for r in rows)      # no row of the layer says "own"
    # recorded, the same fault is found where it is: engram_k0, no layer blamed
    dump, params, cfg = _planted_dump("engram_hash_seed")
    cmp = compare_ladders(dump, reference_ladder(), DEFAULT_RULES)
    assert cmp.first.point == "engram_k0"


def test_a_last_position_dump_names_own_only_where_no_stand_in_reaches_the_point():
    # RoPE at pos+1 in L03: q is wrong. A last-position-only dump lacks the earlier positions'
    # keys, which cannot reach q (only attn on): "own" stands; the layers re-run with stood-in
    # keys are flagged as not to be trusted
    dump, params, cfg = _planted_dump("rope_pos_plus_1", last=True)
    cmp = compare_ladders(dump, reference_ladder(), DEFAULT_RULES)
    loc = locate_dump(cmp, dump, reference_ladder(), params, cfg, cfg.kv_window)
    assert loc.point == "L03.q" and loc.split == "own" and not loc.undecided
    assert "the dump lacks L03.k at 5 position(s)" in loc.verdict
    assert "their local error cannot be trusted as the layer's own" in loc.layers_note
    assert "L03" in loc.layers_note and "L03.q" not in loc.unsure


def test_the_reach_of_a_stand_in_follows_the_layers_data_flow():
    from ladder.sides.dump_locate import relevant_stand_ins
    lacking = ["L02.x@5", "engram_k0@5", "L03.k@2"]
    assert relevant_stand_ins("L03.u", lacking) == ["L02.x@5"]
    assert relevant_stand_ins("L03.bx", lacking) == ["L02.x@5", "engram_k0@5"]
    assert relevant_stand_ins("L03.attn", lacking) == lacking


def _only_from(cmp, step):
    from dataclasses import replace
    rows = [r if r.step == step else replace(r, passed=True) for r in cmp.rows]
    return replace(cmp, rows=rows)


# ---------------------------------------------------------------- ports and the engine
def test_an_independent_port_passes_and_its_planted_bug_is_located(capsys):
    assert main(["run", "--port", f"{TOY}:build"]) == 0
    assert "0 failing (PASS)" in capsys.readouterr().out
    assert main(["run", "--port", f"{TOY}:build_buggy"]) == 1
    out = capsys.readouterr().out
    # run has no --locate flag: the hint names the command that exists
    assert "add --locate" not in out
    assert "`python -m ladder locate` with the same options as this `run`" in out
    assert main(["run", "--port", "no_such_module:x"]) == 2
    assert "cannot import" in capsys.readouterr().err


def test_compare_refuses_mismatched_sides(tmp_path, capsys):
    stem = str(tmp_path / "v2")
    assert main(["regen", "--format", "needle-rs", "--out", stem, "--steps", "2"]) == 0
    capsys.readouterr()
    assert main(["compare", stem, "reference", "--preset", "shipped"]) == 2
    assert "geometry field d_model is 48" in capsys.readouterr().err
    other = str(tmp_path / "v2b")
    assert main(["regen", "--format", "needle-rs", "--out", other, "--steps", "2",
                 "--seed", "3"]) == 0
    capsys.readouterr()
    assert main(["compare", stem, other]) == 2
    assert "tokens differ at position 0" in capsys.readouterr().err


def test_the_comparison_engine_imports_no_model_package():
    code = ("import sys, ladder.compare, ladder.rules, ladder.trace, ladder.table, "
            "ladder.engine.report, ladder.archive, ladder.locate, ladder.namemap, ladder.names, "
            "ladder.model.geometry, ladder.plot; print(sorted(m for m in sys.modules if "
            "m.split('.')[0] in ('reference', 'port', 'kernels')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=paths.ROOT, check=True).stdout
    assert out.strip() == "[]"


def test_a_summary_comparison_keeps_what_the_verdicts_read():
    """keep="summary" (what `compare` streams with) gives the same first divergence, worst
    rows, failing counts and table as keeping every row, holding O(points) rows."""
    from ladder.engine.table import summary
    ref = reference_ladder()
    bad = _perturbed(clean_port_ladder(), "decode03/L02.u", 1.001)
    bad = _perturbed(bad, "decode07/L02.u", 1.002)
    full = compare_ladders(bad, ref, DEFAULT_RULES)
    part = compare_ladders(bad, ref, DEFAULT_RULES, keep="summary")
    assert part.folded and len(part.rows) < len(full.rows) / 4
    assert part.first.key == full.first.key == "decode03/L02.u"
    assert part.worst().key == full.worst().key and part.passed == full.passed
    assert part.total_rows == len(full.rows) and part.total_failing == len(full.failures)
    cols = ["point", "worst_step", "error", "passed", "failing_steps"]
    a, b = summary(full.to_frame())[cols], summary(part.to_frame())[cols]
    assert a.equals(b)
    assert [r.key for r in part.rows if r.step == "decode03"] == \
        [r.key for r in full.rows if r.step == "decode03"]      # the first failing step whole
    assert str(part).splitlines()[0] == str(full).splitlines()[0]


def test_v41_runs_through_the_same_dump_and_compare(tmp_path, capsys):
    """The V4.1 attention's ladder as an archive: dump -> compare equals `run`'s comparison
    (reference vs official, port vs reference) row for row."""
    from ladder.engine.rules import V41_RULESET
    from ladder.v41.sides import compare as v41_compare, load_fixture, run_side
    from reference.v41.attn import AttnV41
    path = tmp_path / "v41.safetensors"
    assert main(["dump", "reference", "--model", "attn_v41", "--out", str(path)]) == 0
    lad = Ladder.load(path)
    assert lad.meta["leading_axis"] == "free" and any(v.dtype == torch.int64
                                                      for v in lad.values.values())
    man, rec, w = load_fixture()
    ref_run = run_side(AttnV41(man["model_args"], w), man, rec)
    live = v41_compare(ref_run, rec, "v41_official", man["calls"], V41_RULESET)
    from ladder.v41.sides import to_ladder
    dumped = compare_ladders(lad, to_ladder(rec, man["calls"], "official"), V41_RULESET,
                             prefix="v41_official")
    assert _rows(dumped) == _rows(live)
    capsys.readouterr()
    assert main(["compare", str(path), "official", "--model", "attn_v41"]) == 0
    assert "0 failing (PASS)" in capsys.readouterr().out
    assert main(["compare", "torch", str(path), "--model", "attn_v41"]) == 0


def test_a_ports_own_hidden_points_are_not_compared_with_its_reason(capsys):
    """A protocol port that cannot show a point says why; the comparison lists it under that
    reason as not compared, never as fused and never as a pass."""
    from ladder.sides.ports import capture_protocol
    from tests.ports.toy_port import ToyPort

    class Hiding(ToyPort):
        hidden_points = {"nx": "kept in registers by my kernel"}

        def step_traced(self, token, state, logits, trace):
            keep = (lambda n, i, v: None if n == "nx" else trace(n, i, v)) if trace else None
            return super().step_traced(token, state, logits, keep)
    cfg, params, _, tokens, prompt = setup()
    lad = capture_protocol(Hiding(params, cfg), cfg, tokens, prompt)
    assert lad.hidden["prefill/L00.nx"] == "kept in registers by my kernel"
    cmp = compare_ladders(lad, reference_ladder(), DEFAULT_RULES)
    assert cmp.passed and "not compared" in str(cmp) and "my kernel" in str(cmp)
    assert "hidden by fusion" not in str(cmp)
