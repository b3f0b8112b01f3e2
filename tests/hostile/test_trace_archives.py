"""Doctored trace archives and needle-rs fixtures: manifests of the wrong types, a blob with
a zero dimension. Each is refused with exit 2, naming the field.
"""
import json
import os
import pytest
from ladder.cli.main import main as ladder_main


def _refused(argv, capsys, tmp_path, match):
    before = sorted(os.listdir(tmp_path))
    assert ladder_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert match in err, err
    assert sorted(os.listdir(tmp_path)) == before            # nothing written
    return err


def _doctored_archive(tmp_path, edit):
    """A trace archive of ours with `edit(manifest)` applied in its metadata."""
    import struct
    from ladder.engine.archive import META_KEY
    src = tmp_path / "a.safetensors"
    assert ladder_main(["dump", "torch", "--out", str(src), "--prompt-len", "2", "--steps",
                        "1"]) == 0
    data = src.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    m = json.loads(header["__metadata__"][META_KEY])
    edit(m)
    header["__metadata__"][META_KEY] = json.dumps(m)
    h = json.dumps(header).encode()
    out = tmp_path / "bad.safetensors"
    out.write_bytes(struct.pack("<Q", len(h)) + h + data[8 + n:])
    src.unlink()
    return str(out)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["points"].__setitem__(0, ["L00.u"]), "point name \"['L00.u']\" must be a string"),
    (lambda m: m["producer"].update(backend=1e308), "field producer.backend must be a string"),
    (lambda m: m["geometry"].update(vocab_size=[0] * 5000), "geometry field vocab_size is [0, 0,"),
    (lambda m: m["geometry"].update(engram_layers=7), "geometry field engram_layers is 7"),
])
def test_an_archive_manifest_of_the_wrong_types_is_refused(tmp_path, capsys, edit, match):
    path = _doctored_archive(tmp_path, edit)
    capsys.readouterr()
    err = _refused(["compare", path], capsys, tmp_path, match)
    assert len(err) < 400, err                         # a 5,000-entry list is not printed


def _sch(**kw):
    return lambda m: m["schedule"].update(**kw)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m.update(kv_window=10 ** 60), "field kv_window=1000000000000000000000000000000"
                                             "000000000000000000000000000000 outside"),
    (lambda m: m.update(kv_window=-1), "field kv_window=-1 outside 0..2147483647"),
    (lambda m: m["producer"].update(precision2="bfloat16"),
     "field producer.precision2 is not a producer field"),
    (_sch(prompt_len=-2 ** 63), "field schedule.prompt_len=-9223372036854775808 outside 0..3"),
    (_sch(prompt_len=2 ** 40), "field schedule.prompt_len=1099511627776 outside 0..3"),
    (_sch(prompt_len=1), "field schedule.prompt_len=1 contradicts schedule.steps[0] "
                         "('prefill', 2 tokens from position 0)"),
])
def test_an_archive_whose_declarations_do_not_hold_is_refused(tmp_path, capsys, edit, match):
    # each read as a number or a key the comparison would use or silently drop
    path = _doctored_archive(tmp_path, edit)
    capsys.readouterr()
    _refused(["compare", path, "reference"], capsys, tmp_path, match)


def test_a_producer_key_of_the_producers_own_is_kept(tmp_path, capsys):
    path = _doctored_archive(tmp_path, lambda m: m["producer"].update({"x-git-sha": "abc"}))
    capsys.readouterr()
    assert ladder_main(["compare", path, "reference"]) == 0


def test_a_needle_rs_blob_with_a_zero_dimension_is_refused(tmp_path, capsys):
    stem = tmp_path / "nrs"
    assert ladder_main(["regen", "--format", "needle-rs", "--out", str(stem), "--prompt-len",
                        "2", "--steps", "1"]) == 0
    m = json.loads((tmp_path / "nrs.json").read_text())
    key = next(iter(m["blob_index"]))
    m["blob_index"][key]["shape"] = [1, 0]
    (tmp_path / "nrs.json").write_text(json.dumps(m))
    capsys.readouterr()
    _refused(["compare", str(stem)], capsys, tmp_path, "shape[1]=0 must be an integer in 1..")


# ---------------------------------------------------------------- steps the file lacks
def _rewritten(tmp_path, keep, edit_manifest=None, name="cut.safetensors"):
    """Our dump (prompt 2 + 2 steps) written again with only the tensors `keep(key)` accepts,
    and `edit_manifest(m)` applied: the data still tiles, so only the lack is wrong."""
    from bounded.safetensors import load_safetensors, write_safetensors
    from ladder.engine.archive import META_KEY
    src = tmp_path / "src.safetensors"
    assert ladder_main(["dump", "torch", "--out", str(src), "--prompt-len", "2", "--steps",
                        "2"]) == 0
    tensors, meta = load_safetensors(src)
    m = json.loads(meta[META_KEY])
    if edit_manifest is not None:
        edit_manifest(m)
    meta[META_KEY] = json.dumps(m)
    out = tmp_path / name
    write_safetensors(out, {k: v for k, v in tensors.items() if keep(k)}, metadata=meta)
    src.unlink()
    return str(out)


@pytest.mark.parametrize("step", ["prefill", "decode00", "decode01"])
def test_a_dump_lacking_a_whole_step_is_refused_naming_step_and_file(tmp_path, capsys, step):
    # was: KeyError from ladder/engine/lazy_values.py (exit 1, a traceback)
    path = _rewritten(tmp_path, lambda k: not k.startswith(step + "/"))
    capsys.readouterr()
    err = _refused(["locate", "--dump", path], capsys, tmp_path,
                   f"{path}: schedule.steps[")
    assert f"{step!r} has none of its tensors" in err, err
    from ladder.engine.archive import ArchiveError
    from ladder.engine.trace import Ladder
    for lazy in (False, True):             # refused by the reader, whichever way it reads
        with pytest.raises(ArchiveError, match=f"'{step}' has none of its tensors"):
            Ladder.load(path, lazy=lazy)


def test_a_step_declared_not_emitted_whole_is_read_and_reported(tmp_path, capsys):
    # every point of decode00 declared absent: read, its points "not compared" (was: the same
    # KeyError from the lazy reader)
    def declare(m):
        m["not_emitted"].update({f"decode00/{p}": "skipped by the writer" for p in m["points"]})
    path = _rewritten(tmp_path, lambda k: not k.startswith("decode00/"), declare)
    capsys.readouterr()
    assert ladder_main(["compare", path, "reference"]) == 0
    assert "skipped by the writer" in capsys.readouterr().out


def test_a_dump_lacking_some_of_a_steps_points_is_a_verdict_not_a_crash(tmp_path, capsys):
    # a port that does not record a point fails on it by name (exit 1), no traceback
    path = _rewritten(tmp_path, lambda k: not k.startswith("decode00/L00."))
    capsys.readouterr()
    assert ladder_main(["locate", "--dump", path]) == 1
    out = capsys.readouterr().out
    assert "first divergence: decode00/L00." in out and "not traced by" in out, out


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path, capsys):
    from bounded.safetensors import load_safetensors, write_safetensors
    path = _rewritten(tmp_path, lambda k: True)
    tensors, meta = load_safetensors(path)
    tensors["decode00/L01.x"] = tensors["decode00/L01.x"][:, :, :-1].contiguous()
    write_safetensors(path, tensors, metadata=meta)
    assert ladder_main(["locate", "--dump", path]) == 1
    got = capsys.readouterr()
    assert "decode00/L01.x has shape [4, 47] per position, the registry says [4, 48]" in \
        got.out + got.err and "Traceback" not in got.err


# ---------------------------------------------------------------- counts a manifest declares
def _manifest(n_steps, n_points, **over):
    """A manifest text of a one-token prefill and n_steps - 1 decode steps over n_points."""
    m = {"format": "needle-parity-trace", "schema_version": 2,
         "producer": {"name": "p", "precision": "float32"}, "geometry": {}, "kv_window": 0,
         "weights": {}, "argmax": {}, "captured": "last", "not_emitted": {},
         "points": [f"p{i}" for i in range(n_points)],
         "schedule": {"tokens": [1] * n_steps, "prompt_len": 1,
                      "steps": [{"name": f"s{i}", "pos": i, "len": 1} for i in range(n_steps)]}}
    m.update(over)
    return json.dumps(m)


def test_steps_times_points_past_the_cell_limit_is_refused_from_the_manifest(tmp_path):
    from ladder.engine.archive import MAX_CELLS, ArchiveError, parse_manifest
    # 60,000 steps x 600 points: 36M (step, point) entries a reader would build; refused by
    # the manifest alone, before any tensor is framed
    with pytest.raises(ArchiveError, match=f"declare 36000000 .step, point. cells; limit "
                                           f"{MAX_CELLS}"):
        parse_manifest(_manifest(60000, 600), "a.safetensors")
    # a step-free not_emitted entry stands for a cell at every step
    many = {f"q{i}": "why" for i in range(40)}
    with pytest.raises(ArchiveError, match=r"schedule.steps \(60000\) x points and "
                                           r"not_emitted \(41\)"):
        parse_manifest(_manifest(60000, 1, not_emitted=many), "a.safetensors")
    assert parse_manifest(_manifest(2048, 550), "a.safetensors")["_steps"]   # shipped's size


def test_positions_past_the_limit_are_refused(tmp_path):
    from ladder.engine.archive import MAX_POSITIONS, ArchiveError, parse_manifest
    with pytest.raises(ArchiveError, match=f"schedule.tokens holds {MAX_POSITIONS + 1} ids; "
                                           f"limit {MAX_POSITIONS} positions"):
        parse_manifest(_manifest(1, 1, schedule={"tokens": [1] * (MAX_POSITIONS + 1),
                                                 "prompt_len": MAX_POSITIONS + 1,
                                                 "steps": [{"name": "s", "pos": 0,
                                                            "len": MAX_POSITIONS + 1}]}), "a")
    far = {"tokens": [1, 1], "prompt_len": 0,
           "steps": [{"name": "s", "pos": MAX_POSITIONS - 1, "len": 2}]}
    with pytest.raises(ArchiveError, match=f"pos={MAX_POSITIONS - 1} \\+ len=2 runs past "
                                           f"position {MAX_POSITIONS - 1}"):
        parse_manifest(_manifest(1, 1, schedule=far), "a")
    far["steps"][0]["pos"] = 2 ** 31 - 2
    with pytest.raises(ArchiveError, match=f"pos=2147483646 outside 0..{MAX_POSITIONS - 1}"):
        parse_manifest(_manifest(1, 1, schedule=far), "a")
