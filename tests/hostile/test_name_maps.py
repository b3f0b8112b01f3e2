"""Hostile name maps: the [map] precision declaration takes one dtype word per field, and every
refusal of it names the map file."""
import pytest

from ladder.cli.main import main as ladder_main
from ladder.formats.namemap import NameMapError, from_dict, load_map


def _map(tmp_path, precision: str):
    """The shipped needle-rs map with `precision = ...` (TOML text) in its [map] table."""
    body = open(load_map("needle-rs").source).read()
    body = body.replace('name = "needle-rs"\n', f'name = "needle-rs"\nprecision = {precision}\n', 1)
    path = tmp_path / "m.toml"
    path.write_text(body)
    return str(path)


@pytest.mark.parametrize("table", [
    '{activations = "bfloat16,kv=int8"}',          # a whole declaration in one field
    '{activations = "bfloat16", kv = "int8,weights=cq"}',
    '{activations = "act=bfloat16"}',
    '{kv = " int8"}',
    '{activations = "bfloat16 "}',
    '{weights = ""}',
    '{activations = 16}',
])
def test_a_precision_table_field_takes_exactly_one_dtype_word(tmp_path, table):
    path = _map(tmp_path, table)
    with pytest.raises(NameMapError, match=f"^{path}: \\[map\\] precision: field .* must be "
                                           f"one dtype word"):
        load_map(path)


@pytest.mark.parametrize("table, want", [
    ('{activations = "bfloat16", kv = "int8"}', ("bfloat16", "bfloat16", "int8")),
    ('{activations = "bf16"}', ("bfloat16", "bfloat16", "bfloat16")),
    ('"bfloat16,kv=int8"', ("bfloat16", "bfloat16", "int8")),   # the string form: a spec
])
def test_a_precision_of_one_word_per_field_is_read(tmp_path, table, want):
    p = load_map(_map(tmp_path, table)).precision
    assert (p.activations, p.weights, p.kv) == want


@pytest.mark.parametrize("decl", ['{activations = "bfloat16", kv = "float32"}',
                                  '"float16,kv=float32"'])
def test_a_kv_cache_wider_than_activations_names_the_map_file(tmp_path, decl):
    # was: "precision: kv=float32 is wider than ..." with no file named
    path = _map(tmp_path, decl)
    with pytest.raises(NameMapError, match=f"^{path}: \\[map\\] precision: kv=float32 is "
                                           f"wider than activations="):
        load_map(path)


def test_the_precision_refusal_is_one_line_exit_2(tmp_path, capsys):
    stem = tmp_path / "nrs"
    assert ladder_main(["regen", "--format", "needle-rs", "--out", str(stem), "--prompt-len",
                        "2", "--steps", "1"]) == 0
    path = _map(tmp_path, '{activations = "bfloat16,kv=int8"}')
    capsys.readouterr()
    assert ladder_main(["compare", str(stem), "--map", path]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path}: [map] precision: field activations=" in err, err


def test_from_dict_names_its_source_too():
    with pytest.raises(NameMapError, match=r"^src\.toml: \[map\] precision: kv=float32 is "
                                           r"wider"):
        from_dict({"map": {"name": "x", "precision": {"activations": "float16",
                                                      "kv": "float32"}}}, "src.toml")
