"""Hostile fixture manifests: every field range-checked (seed, prompt_len, length, window,
token ids), the manifest's size capped before it is read.
"""
from tests import paths
import json
import os
import pytest
from ladder.sides import fixtures
from tests.captures import FIXTURE                                 # noqa: E402


FIXTURES = paths.FIXTURES




@pytest.mark.parametrize("edit, msg", [
    (lambda m: m["schedule"].update(kv_window=2 ** 70), r"kv_window=1180591620717411303424 "
                                                        r"outside 0\.\.2147483647"),
    (lambda m: m["schedule"].update(kv_window=65), r"kv_window=65 exceeds max_seq_len=64"),
    (lambda m: m.update(seed=-1), r"seed=-1 outside 0\.\."),
    (lambda m: m["schedule"].update(prompt_len=0), r"prompt_len=0 outside 1\.\."),
    (lambda m: m["config"].update(kv_window="8"), r"field config: field kv_window='8'"),
    (lambda m: m["config"].update(max_seq_len=2 ** 26), r"field config: the geometry implies"),
])
def test_fixture_manifest_fields_are_range_checked(tmp_path, edit, msg):
    m = json.load(open(FIXTURE + ".json"))
    edit(m)
    stem = tmp_path / "fx"
    (tmp_path / "fx.json").write_text(json.dumps(m))
    os.symlink(FIXTURE + ".safetensors", tmp_path / "fx.safetensors")
    with pytest.raises(fixtures.FixtureError, match=msg):
        fixtures.load(stem)


# ---------------------------------------------------------------- file-size caps
def test_manifest_size_cap_at_the_limit_and_one_past(tmp_path, monkeypatch):
    from ladder.sides import fixtures
    from tests.captures import FIXTURE
    size = len(open(FIXTURE + ".json", "rb").read())
    monkeypatch.setattr(fixtures, "MAX_MANIFEST", size)
    fixtures.read_manifest(FIXTURE + ".json")
    monkeypatch.setattr(fixtures, "MAX_MANIFEST", size - 1)
    with pytest.raises(fixtures.FixtureError, match=f"{size} bytes exceeds the manifest limit "
                                                    f"{size - 1}"):
        fixtures.read_manifest(FIXTURE + ".json")


def _fixture_copy(tmp_path, edit):
    import json
    import shutil
    stem = str(tmp_path / "fx")
    for ext in (".safetensors", ".json"):
        shutil.copyfile(FIXTURE + ext, stem + ext)
    m = json.load(open(stem + ".json"))
    edit(m)
    json.dump(m, open(stem + ".json", "w"))
    return stem


@pytest.mark.parametrize("field, edge, past, msg", [
    ("seed", 2 ** 63 - 1, 2 ** 63, "field seed="),     # torch.Generator.manual_seed's int64
    ("seed", 0, -1, "field seed=-1 outside"),
])
def test_manifest_seed_at_its_bounds(tmp_path, field, edge, past, msg):
    fixtures.read_manifest(_fixture_copy(tmp_path, lambda m: m.update({field: edge})) + ".json")
    with pytest.raises(fixtures.FixtureError, match=msg):
        fixtures.read_manifest(_fixture_copy(tmp_path, lambda m: m.update({field: past}))
                               + ".json")


def test_manifest_prompt_len_at_its_bounds(tmp_path):
    m = fixtures.read_manifest(_fixture_copy(
        tmp_path, lambda m: m["schedule"].update(prompt_len=1)) + ".json")
    assert m["schedule"]["prompt_len"] == 1
    with pytest.raises(fixtures.FixtureError, match="prompt_len=0 outside 1"):
        fixtures.read_manifest(_fixture_copy(
            tmp_path, lambda m: m["schedule"].update(prompt_len=0)) + ".json")


def test_fixture_length_and_window_at_max_seq_len(tmp_path):
    """schedule.tokens may hold max_seq_len positions and kv_window may equal max_seq_len;
    one more of either is refused by name."""
    n = len(fixtures.read_manifest(FIXTURE + ".json")["schedule"]["tokens"])
    fx = fixtures.load(_fixture_copy(tmp_path, lambda m: m["config"].update(max_seq_len=n)))
    assert fx.cfg.max_seq_len == n == len(fx.tokens)
    with pytest.raises(fixtures.FixtureError, match=f"holds {n} positions, more than "
                                                    f"max_seq_len={n - 1}"):
        fixtures.load(_fixture_copy(tmp_path, lambda m: m["config"].update(max_seq_len=n - 1)))
    msl = fixtures.read_manifest(FIXTURE + ".json")["config"]["max_seq_len"]
    fx = fixtures.load(_fixture_copy(tmp_path, lambda m: m["schedule"].update(kv_window=msl)))
    assert fx.window == msl
    with pytest.raises(fixtures.FixtureError, match=f"kv_window={msl + 1} exceeds"):
        fixtures.load(_fixture_copy(tmp_path,
                                    lambda m: m["schedule"].update(kv_window=msl + 1)))


def test_fixture_token_ids_at_the_vocabulary_edge(tmp_path):
    v = fixtures.read_manifest(FIXTURE + ".json")["config"]["vocab_size"]

    def tok(t):
        return lambda m: m["schedule"]["tokens"].__setitem__(0, t)
    # the largest id passes the bound and is caught by the tokens tensor's digest instead
    with pytest.raises(fixtures.FixtureError, match="tensor 'tokens' differs"):
        fixtures.load(_fixture_copy(tmp_path, tok(v - 1)))
    with pytest.raises(fixtures.FixtureError, match=f"id {v} outside 0..vocab_size-1"):
        fixtures.load(_fixture_copy(tmp_path, tok(v)))
    with pytest.raises(fixtures.FixtureError, match="id -1 outside"):
        fixtures.load(_fixture_copy(tmp_path, tok(-1)))


# ---------------------------------------------------------------- needle-rs's counts
def _needle_rs(tmp_path, edit):
    """needle-rs's fixture as regen writes it (prompt 2 + 1 step), `edit(manifest)` applied."""
    from ladder.cli.main import main as ladder_main
    stem = tmp_path / "nrs"
    assert ladder_main(["regen", "--format", "needle-rs", "--out", str(stem), "--prompt-len",
                        "2", "--steps", "1"]) == 0
    m = json.loads((tmp_path / "nrs.json").read_text())
    edit(m)
    (tmp_path / "nrs.json").write_text(json.dumps(m))
    return str(stem)


def _decode_steps(n, blobs=None):
    def edit(m):
        b = m["steps"][1]["blobs"] if blobs is None else blobs
        m["steps"] += [{"name": f"decode{i}", "pos": 2 + i, "tokens": [3], "blobs": b}
                       for i in range(1, n)]
    return edit


def _no_work(monkeypatch):
    """Make reading the values file or building a step's entries fail loudly: a refusal that
    comes after either came after the work it should have prevented."""
    import bounded.io
    from ladder.formats.namemap import NameMap

    real = bounded.io.open_regular

    def opened(path, *a, **k):
        if os.fspath(path).endswith(".f32"):
            raise AssertionError("the values file was opened before the refusal")
        return real(path, *a, **k)

    def built(*a, **k):
        raise AssertionError("step entries were built before the refusal")
    monkeypatch.setattr(bounded.io, "open_regular", opened)
    monkeypatch.setattr(NameMap, "why_not_emitted", built)


def test_a_needle_rs_fixture_of_170000_blobless_steps_is_refused_up_front(tmp_path, capsys,
                                                                           monkeypatch):
    # was: read for minutes (170,000 steps x the registry's points, each matched by fnmatch)
    from ladder.formats import needle_rs
    from ladder.engine.archive import MAX_CELLS
    stem = _needle_rs(tmp_path, _decode_steps(170000, blobs={}))
    capsys.readouterr()
    _no_work(monkeypatch)
    with pytest.raises(needle_rs.NeedleRsError, match=f"field steps lists 170001 steps x 130 "
                                                      f"registry points = 22100130 .step, "
                                                      f"point. cells; limit {MAX_CELLS}"):
        needle_rs.read(stem)
    from ladder.cli.main import main as ladder_main
    assert ladder_main(["compare", stem]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "field steps lists 170001 steps" in err, err


def test_a_needle_rs_fixture_at_the_cell_limit_is_read(tmp_path, monkeypatch):
    from ladder.formats import needle_rs
    from ladder.engine import archive
    monkeypatch.setattr(needle_rs, "MAX_CELLS", 130 * 5)     # 5 steps of this geometry
    lad = needle_rs.read(_needle_rs(tmp_path, _decode_steps(4)))
    assert len(lad.steps) == 5 and archive.MAX_CELLS > 130 * 5
    monkeypatch.setattr(needle_rs, "MAX_CELLS", 130 * 5 - 1)
    with pytest.raises(needle_rs.NeedleRsError, match="at most 4 steps of this geometry"):
        needle_rs.read(_needle_rs(tmp_path, _decode_steps(4)))


def test_a_needle_rs_step_with_no_blobs_is_refused_naming_it(tmp_path):
    from ladder.formats import needle_rs
    stem = _needle_rs(tmp_path, lambda m: m["steps"][1].update(blobs={}))
    with pytest.raises(needle_rs.NeedleRsError, match=r"steps\[1\]: field blobs of step "
                                                      r"'decode0' is empty"):
        needle_rs.read(stem)


@pytest.mark.parametrize("edit, msg", [
    (lambda m: m.update(max_len=10 ** 60), r"field max_len=1000000000000000000000000000000"
                                           r"000000000 must be an integer in 0\.\.1048576"),
    (lambda m: m.update(max_len="4"), r"field max_len=4 must be an integer"),
    (lambda m: m.update(generated_ids=[0] * (2 ** 20 + 1)),
     r"field generated_ids holds 1048577 ids; limit 1048576"),
])
def test_needle_rs_declared_lengths_are_bounded(tmp_path, edit, msg):
    from ladder.formats import needle_rs
    with pytest.raises(needle_rs.NeedleRsError, match=msg):
        needle_rs.read(_needle_rs(tmp_path, edit))


def test_needle_rs_positions_past_the_limit_are_refused_before_the_ids(tmp_path, monkeypatch):
    from ladder.formats import needle_rs
    monkeypatch.setattr(needle_rs, "MAX_POSITIONS", 4)        # max_len: 4
    assert len(needle_rs.read(_needle_rs(tmp_path, _decode_steps(2))).tokens) == 4
    with pytest.raises(needle_rs.NeedleRsError, match=r"steps\[3\]: field tokens holds 1 ids, "
                                                      r"past 4 positions in all"):
        needle_rs.read(_needle_rs(tmp_path, _decode_steps(3)))
