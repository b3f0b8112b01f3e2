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
