"""The bounded JSON and TOML readers (bounded/io.py): nesting depth, number length,
container and entry counts are refused at the limit plus one, before the parser runs.
"""
import math
import pytest
from bounded import io as safe_io


def test_json_nesting_and_number_length_are_bounded_before_parsing(tmp_path):
    from bounded.io import InputFileError, parse_json, parse_toml
    with pytest.raises(InputFileError, match="nesting depth 65 at byte 64 exceeds the limit 64"):
        parse_json(b"[" * 100000 + b"]" * 100000, "x")
    with pytest.raises(InputFileError, match="number literal of 5000 characters at byte 6"):
        parse_json(b'{"a": ' + b"9" * 5000 + b"}", "x")
    assert parse_json(b'{"s": "' + b"[" * 1000 + b'9' * 1000 + b'"}', "x")["s"][0] == "["
    with pytest.raises(InputFileError, match="TOML nesting depth 65"):
        parse_toml(b"a = " + b"[" * 65 + b"]" * 65, "x")
    with pytest.raises(InputFileError, match="number literal of 70 characters"):
        parse_toml(b"a = " + b"1" * 70, "x")
    assert parse_toml(b'a.b.c = 1\n"x.y.z" = 0.5 # a.b.c.d\n', "x") == \
        {"a": {"b": {"c": 1}}, "x.y.z": 0.5}
    assert math.isfinite(parse_json(b"1e308", "x"))


# ---------------------------------------------------------------- 4. counts, not only bytes
@pytest.fixture
def small_counts(monkeypatch):
    """The count limits lowered (the real ones take a few seconds of scanning to reach)."""
    from bounded import io as safe_io
    monkeypatch.setattr(safe_io, "MAX_CONTAINERS", 3000)
    monkeypatch.setattr(safe_io, "MAX_ENTRIES", 5000)
    return 3000, 5000


def test_json_and_toml_container_and_entry_counts_are_bounded(small_counts):
    from bounded.io import InputFileError, parse_json, parse_toml
    MAX_CONTAINERS, MAX_ENTRIES = small_counts
    n = MAX_CONTAINERS + 10
    with pytest.raises(InputFileError, match=rf"JSON array or object number {MAX_CONTAINERS + 1} "
                                             rf"at byte {3 * MAX_CONTAINERS - 2} exceeds the "
                                             rf"limit of {MAX_CONTAINERS}"):
        parse_json(b"[" + b"[]," * n + b"[]]", "x")
    with pytest.raises(InputFileError, match=rf"JSON element number {MAX_ENTRIES + 1} at byte "
                                             rf"{2 * MAX_ENTRIES} exceeds the limit"):
        parse_json(b"[" + b"0," * MAX_ENTRIES + b"0]", "x")
    with pytest.raises(InputFileError, match=rf"TOML array or table number {MAX_CONTAINERS + 1}"):
        parse_toml(b"a = [" + b"[]," * n + b"[]]", "x")
    with pytest.raises(InputFileError, match=rf"TOML entry number {MAX_ENTRIES + 1}"):
        parse_toml(b"a = [" + b"0," * MAX_ENTRIES + b"0]", "x")
    assert len(parse_json(b"[" + b"[]," * 1000 + b"[]]", "x")) == 1001
    assert len(parse_json(b'["' + b"," * 10000 + b'"]', "x")[0]) == 10000   # commas in a string


def test_json_nesting_and_number_length_at_the_limit_and_one_past():
    edge = b"[" * safe_io.MAX_DEPTH + b"]" * safe_io.MAX_DEPTH
    safe_io.parse_json(edge, "probe")
    with pytest.raises(safe_io.InputFileError, match="nesting depth"):
        safe_io.parse_json(b"[" + edge + b"]", "probe")
    num = b"1" * safe_io.MAX_NUMBER_CHARS
    safe_io.parse_json(b"[" + num + b"]", "probe")
    with pytest.raises(safe_io.InputFileError, match="number literal"):
        safe_io.parse_json(b"[" + num + b"1]", "probe")
