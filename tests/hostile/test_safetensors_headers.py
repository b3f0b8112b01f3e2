"""Hostile safetensors headers, through every reader that takes one: dimensions bounded,
dtype a string, the entry count checked before the header is parsed.
"""
from tests import paths
import json
import os
import struct
import pytest
from ladder.v41.sides import DEFAULT_STEM as V41_STEM, V41FixtureError, load_fixture


FIXTURES = paths.FIXTURES


# ---------------------------------------------------------------- 2. safetensors headers
def _st(path, entries: dict, data: bytes = b"") -> str:
    head = json.dumps(entries).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head + data)
    return str(path)


def _readers(tmp_path):
    """Every reader of a safetensors file, each with the error class it raises."""
    from ladder.sides import fixtures
    from reference.params import ParamsError, load_params, load_safetensors, \
        read_safetensors_header

    def v2_fixture(p):
        os.symlink(os.path.join(FIXTURES, "v2_forward_vectors.json"), tmp_path / "fx.json")
        os.replace(p, tmp_path / "fx.safetensors")
        return fixtures.load(tmp_path / "fx")

    def v41_fixture(p):
        os.symlink(V41_STEM + ".json", tmp_path / "v41.json")
        os.replace(p, tmp_path / "v41.safetensors")
        return load_fixture(str(tmp_path / "v41"))
    return {"load_safetensors": (load_safetensors, ParamsError),
            "read_safetensors_header": (read_safetensors_header, ParamsError),
            "load_params": (load_params, ParamsError),
            "fixtures.load": (v2_fixture, fixtures.FixtureError),
            "v41.load_fixture": (v41_fixture, V41FixtureError)}


@pytest.mark.parametrize("reader", ["load_safetensors", "read_safetensors_header", "load_params",
                                    "fixtures.load", "v41.load_fixture"])
@pytest.mark.parametrize("entry, msg", [
    ({"dtype": "F32", "shape": [2 ** 64, 0], "data_offsets": [0, 0]},
     r"field shape=\[18446744073709551616, 0\] is invalid \(at most 8 integers in "
     r"0\.\.2147483647\)"),
    ({"dtype": "U8", "shape": [2 ** 40, 0, 5], "data_offsets": [0, 0]}, r"field shape=.* invalid"),
    ({"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]},
     r"field dtype=\['F32'\] is not one of"),
    ({"dtype": {"F32": 1}, "shape": [1], "data_offsets": [0, 4]},
     r"field dtype=\{'F32': 1\} is not one of"),
])
def test_safetensors_dimensions_bounded_and_dtype_a_string_in_every_reader(tmp_path, reader,
                                                                          entry, msg):
    fn, error = _readers(tmp_path)[reader]
    path = _st(tmp_path / "t.safetensors", {"t": entry}, b"\0" * entry["data_offsets"][1])
    with pytest.raises(error, match=r"tensor 't' " + msg):
        fn(path)


# ---------------------------------------------------------------- 4. counts, not only bytes
@pytest.fixture
def small_counts(monkeypatch):
    """The count limits lowered (the real ones take a few seconds of scanning to reach)."""
    from bounded import io as safe_io
    monkeypatch.setattr(safe_io, "MAX_CONTAINERS", 3000)
    monkeypatch.setattr(safe_io, "MAX_ENTRIES", 5000)
    return 3000, 5000


def test_safetensors_header_with_many_entries_is_refused_before_parsing(tmp_path,
                                                                        small_counts):
    from reference.params import ParamsError, load_safetensors
    entry = b'{"dtype":"U8","shape":[0],"data_offsets":[0,0]}'
    head = b"{" + b",".join(b'"t%d":' % i + entry for i in range(2000)) + b"}"
    path = tmp_path / "many.safetensors"
    path.write_bytes(struct.pack("<Q", len(head)) + head)
    with pytest.raises(ParamsError, match=r"header: JSON array or object number 3001 at byte "
                                          r"[0-9]+ exceeds the limit"):
        load_safetensors(path)
