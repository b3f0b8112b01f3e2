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
