"""Issue #16, one test per failure class: each hostile file ends quickly with the project's own
error naming the file, field and limit. The cases that used to hang or eat memory (FIFOs, links
to /dev/zero, a 50,000-level dotted TOML key) run in one child process under an address-space
and CPU-time limit, so a regression fails the test instead of taking the machine down."""
import json
import math
import os
import resource
import struct
import subprocess
import sys

import pytest
import torch
from safetensors.torch import save_file

from ladder.sides import fixtures
from ladder.engine.rules import DEFAULT_RULES, RulesError, UncoveredPointError, load_rules
from reference.cact import CactFormatError, read_cact
from reference.config import ConfigError, V2Config
from reference.memory_budget import DEFAULT_MAX_MEMORY, MemoryBudgetError, check_memory, \
    implied_bytes, parse_size
from reference.params import ParamsError, init_params, load_params
from reference.tokenizer import Tokenizer, TokenizerFormatError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
CACT = os.path.join(FIXTURES, "cact_w2.cact")
FIXTURE = os.path.join(FIXTURES, "v2_forward_vectors")
AS_LIMIT = 2 << 30


def _patched_cact(tmp_path, **at_value) -> str:
    data = bytearray(open(CACT, "rb").read())
    for at, value in at_value.items():
        struct.pack_into("<I", data, int(at[1:]), value)
    path = tmp_path / "patched.cact"
    path.write_bytes(bytes(data))
    return str(path)


# ---------------------------------------------------------------- in a limited child process
_CHILD = r"""
import json, os, sys
from ladder import fixtures
from ladder.rules import load_rules
from reference.cact import read_cact
from reference.params import load_params, load_safetensors
tmp, fx = sys.argv[1], sys.argv[2]
os.mkfifo(os.path.join(tmp, "fifo"))
os.symlink("/dev/zero", os.path.join(tmp, "zero"))
for ext in (".cact", ".safetensors", ".toml", ".json"):
    os.symlink(os.path.join(tmp, "fifo"), os.path.join(tmp, "fifo" + ext))
    os.symlink("/dev/zero", os.path.join(tmp, "zero" + ext))
for kind in ("fifo", "zero"):                      # a fixture stem whose manifest is special
    os.symlink(fx + ".safetensors", os.path.join(tmp, kind + "fx.safetensors"))
    os.symlink(os.path.join(tmp, kind), os.path.join(tmp, kind + "fx.json"))
with open(os.path.join(tmp, "deep.toml"), "w") as f:
    f.write("a" + ".a" * 50000 + " = 1\n")
with open(os.path.join(tmp, "quotes.json"), "w") as f:    # an unterminated string of \"
    f.write('{"rules": "' + '\\"' * 200000)
readers = {".cact": read_cact, ".safetensors": load_params, ".toml": load_rules,
           "st": load_safetensors, "fx": fixtures.load}
cases = [(kind + ext, reader, os.path.join(tmp, kind + ext))
         for kind in ("fifo", "zero") for ext, reader in readers.items() if ext[0] == "."]
cases += [(kind + "st", load_safetensors, os.path.join(tmp, kind + ".safetensors"))
          for kind in ("fifo", "zero")]
cases += [(kind + "fx", fixtures.load, os.path.join(tmp, kind + "fx")) for kind in ("fifo", "zero")]
cases += [("dir.cact", read_cact, tmp), ("deep.toml", load_rules, os.path.join(tmp, "deep.toml")),
          ("quotes.json", load_rules, os.path.join(tmp, "quotes.json"))]
out = {}
for name, reader, path in cases:
    try:
        reader(path)
        out[name] = ["accepted", ""]
    except Exception as e:
        out[name] = [type(e).__name__, str(e)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def special_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("special")

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))
        resource.setrlimit(resource.RLIMIT_CPU, (60, 60))

    r = subprocess.run([sys.executable, "-c", _CHILD, str(tmp), FIXTURE], capture_output=True,
                       text=True, timeout=120, preexec_fn=limits, cwd=ROOT,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name, error, what", [
    ("fifo.cact", "CactFormatError", ".cact file is a FIFO"),
    ("fifo.safetensors", "ParamsError", "parameter file is a FIFO"),
    ("fifost", "ParamsError", "safetensors file is a FIFO"),
    ("fifo.toml", "RulesError", "rules file is a FIFO"),
    ("fifofx", "FixtureError", "manifest is a FIFO"),
    ("zero.cact", "CactFormatError", ".cact file is a character device"),
    ("zero.safetensors", "ParamsError", "parameter file is a character device"),
    ("zerost", "ParamsError", "safetensors file is a character device"),
    ("zero.toml", "RulesError", "rules file is a character device"),
    ("zerofx", "FixtureError", "manifest is a character device"),
    ("dir.cact", "CactFormatError", ".cact file is a directory"),
])
def test_special_files_are_refused_before_reading(special_files, name, error, what):
    got, msg = special_files[name]
    assert got == error and what in msg and "not a regular file" in msg, (got, msg)


def test_deep_dotted_toml_key_is_refused_before_tomllib(special_files):
    got, msg = special_files["deep.toml"]
    assert got == "RulesError" and "50000 dotted levels" in msg and "limit 32" in msg, msg


def test_unterminated_string_of_escaped_quotes_is_refused_in_linear_time(special_files):
    # A pre-scan that retried each escaped quote would need minutes of CPU here and be killed.
    got, msg = special_files["quotes.json"]
    assert got == "RulesError" and "malformed JSON" in msg and "Unterminated string" in msg, msg


# ---------------------------------------------------------------- in process (safe to run)
def test_huge_max_seq_len_cact_header_is_refused_by_the_budget(tmp_path):
    path = _patched_cact(tmp_path, b44=2 ** 26)
    with pytest.raises(CactFormatError, match=r"budget of 2\.00 GiB.*largest is the KV cache, "
                                              r".* from max_seq_len=67108864 \(byte 44\)"):
        read_cact(path)
    # The same header under a budget that holds it reads (the limit is the budget, not a cap).
    f = read_cact(path, max_memory=1 << 40)
    assert f.config.max_seq_len == 2 ** 26


def test_cact_window_wider_than_the_kv_budget_is_refused(tmp_path):
    # max_seq_len = kv_window = 2e6: under the memory budget, but the ring and every step's
    # attention would span 2e6 slots; upstream's export never writes more than the KV budget.
    path = _patched_cact(tmp_path, b44=2 * 10 ** 6, b12=2 * 10 ** 6)
    with pytest.raises(CactFormatError, match=r"header field kv_window=2000000 at byte 12 "
                                              r"exceeds the KV budget of 40736 positions"):
        read_cact(path)
    assert read_cact(_patched_cact(tmp_path, b44=2 * 10 ** 6, b12=40736)).config.kv_window \
        == 40736
    # The same geometry from a parameter file's metadata: the same rule.
    cfg = V2Config.preset("tiny")
    meta = dict(cfg.to_dict(), max_seq_len=2 * 10 ** 6, kv_window=2 * 10 ** 6)
    save_file(init_params(cfg, 0), str(tmp_path / "p.safetensors"),
              metadata={"needle_config": json.dumps(meta)})
    with pytest.raises(MemoryBudgetError, match=r"kv_window=2000000 exceeds the KV budget of "
                                                r"[0-9]+ positions"):
        load_params(tmp_path / "p.safetensors")


def test_engram_dilation_1e7_is_refused_in_cact_and_params(tmp_path):
    path = _patched_cact(tmp_path, b72=10 ** 7, b84=10 ** 7)     # dilation = engram_orders[1]
    with pytest.raises(CactFormatError, match=r"engram_orders\[1\]=10000000 outside 1\.\.64"):
        read_cact(path)
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0)
    meta = dict(cfg.to_dict(), engram_orders=[2, 10 ** 7])
    save_file(params, str(tmp_path / "p.safetensors"),
              metadata={"needle_config": json.dumps(meta)})
    with pytest.raises(ConfigError, match=r"needle_config: engram_orders\[1\]=10000000"):
        load_params(tmp_path / "p.safetensors")


@pytest.mark.parametrize("field, value, msg", [
    ("kv_window", "8", r"field kv_window='8' \(str\) must be an integer"),
    ("max_seq_len", 2 ** 70, r"field max_seq_len=1180591620717411303424 \(int\) must be an "
                             r"integer in"),
    ("flash", 1, r"field flash=1 \(int\) must be true or false"),
    ("engram_orders", "23", r"field engram_orders='23' \(str\) must be a list"),
    ("engram_layers", [1.5], r"must be a list of integers"),
    ("dtype", "int8", r"dtype='int8' must be one of"),
    ("num_layers", True, r"field num_layers=True \(bool\) must be an integer"),
])
def test_wrong_typed_config_fields_are_config_errors(field, value, msg):
    with pytest.raises(ConfigError, match=msg):
        V2Config(**{**V2Config.preset("tiny").to_dict(), field: value})
    with pytest.raises(ConfigError, match=msg):
        V2Config.from_json(json.dumps({**V2Config.preset("tiny").to_dict(), field: value}))


@pytest.mark.parametrize("theta", [0.0, -1.0, float("nan"), float("inf")])
def test_rope_theta_must_be_finite_and_positive(theta):
    with pytest.raises(ConfigError, match=f"rope_theta={theta!r} must be finite and > 0"):
        V2Config.preset("tiny").replace(rope_theta=theta)


def test_rope_theta_zero_in_params_metadata_is_refused(tmp_path):
    cfg = V2Config.preset("tiny")
    save_file(init_params(cfg, 0), str(tmp_path / "p.safetensors"),
              metadata={"needle_config": json.dumps(dict(cfg.to_dict(), rope_theta=0.0))})
    with pytest.raises(ConfigError, match="rope_theta=0.0 must be finite and > 0"):
        load_params(tmp_path / "p.safetensors")


def _marker_tokenizer() -> Tokenizer:
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "<m>"] + [f"p{i}" for i in range(11)]
    return Tokenizer(pieces, [0.0] * 16, [2, 2, 2, 1, 3] + [0] * 11)


def _empty_piece(blob: bytes, index: int) -> bytes:
    from reference.tokenizer import _HEAD, _REC
    off = _HEAD.size
    for _ in range(index):
        off += _REC.size + _REC.unpack_from(blob, off)[2]
    score, kind, length = _REC.unpack_from(blob, off)
    return blob[:off] + _REC.pack(score, kind, 0) + blob[off + _REC.size + length:]


def test_empty_user_defined_piece_is_refused_at_read():
    blob = _marker_tokenizer().to_blob()
    with pytest.raises(TokenizerFormatError, match="piece 4: len=0") as e:
        Tokenizer.from_blob(_empty_piece(blob, 4))      # encode() would never return
    assert e.value.field == "piece[4].len"
    assert e.value.offset == 24 + 4 * 7 + len("<pad></s><s><unk>") + 5   # header, 4 records
    with pytest.raises(ValueError, match="must be a non-empty string"):
        Tokenizer(["<pad>", "</s>", "<s>", "<unk>", ""], [0.0] * 5, [2, 2, 2, 1, 3])


def _params_file(tmp_path, change) -> str:
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0, perturbed=True)
    change(params)
    path = str(tmp_path / "p.safetensors")
    save_file(params, path, metadata={"needle_config": cfg.to_json()})
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_params_are_refused(tmp_path, value):
    def poke(p):
        p["stack/final_norm/scale"][5] = value
    with pytest.raises(ParamsError, match=rf"'stack/final_norm/scale' value \[5\].* = "
                                          rf"{value} is not finite"):
        load_params(_params_file(tmp_path, poke))


@pytest.mark.parametrize("cast, name", [(lambda t: t > 0, "BOOL"),
                                        (lambda t: t.round().to(torch.int32), "I32"),
                                        (lambda t: t.round().to(torch.uint8), "U8")])
def test_integer_and_bool_params_are_refused_not_cast(tmp_path, cast, name):
    def convert(p):
        p["embedding/embedding"] = cast(p["embedding/embedding"])
    with pytest.raises(ParamsError, match=f"'embedding/embedding' has dtype {name}"):
        load_params(_params_file(tmp_path, convert))


def test_memory_budget_terms_and_override():
    tiny, shipped = V2Config.preset("tiny"), V2Config.preset("shipped")
    t = implied_bytes(tiny)
    assert t["RoPE tables"][0] == 3 * 64 * 6 * 4 and t["KV cache"][0] == 2 * 6 * 2 * 64 * 12 * 4
    assert t["Engram value ring"][0] == 2 * (3 * 3 + 1) * 48 * 4
    assert check_memory(shipped) < DEFAULT_MAX_MEMORY // 4      # the presets fit with room
    big = tiny.replace(max_seq_len=2 ** 24)
    with pytest.raises(MemoryBudgetError, match=r"largest is the KV cache.*max_seq_len=16777216"):
        check_memory(big)
    assert check_memory(big, budget=64 << 30) > DEFAULT_MAX_MEMORY
    assert parse_size("2G") == 2 << 30 and parse_size("512M") == 512 << 20
    for bad in ("", "-1", "2X", "0", "1e9"):
        with pytest.raises(ValueError):
            parse_size(bad)


@pytest.mark.parametrize("text, msg", [
    ('{"rules": {"*": ' + "1" + "0" * 30 + "}}", r"rtol=1000000000000000000000000000000 must "
                                                r"be a finite number in 0\.\.1000"),
    ('{"rules": {"*": 1e308}}', r"rtol=1e\+308 must be a finite number in 0\.\.1000"),
    ('{"rules": {"*": 1e999}}', r"overflows a float64"),
    ('{"rules": {"*": {"rtol": 1e-5, "atol": 1e300}}}', r"atol=1e\+300"),
    ('{"rules": {"*": 1e-5}, "logits": {"topk": 1e3}}', r"topk=1000\.0 must be an integer"),
    ('{"rules": {"*": 1e-5}, "rel_floor": 2}', r"rel_floor=2 must be a finite number in 0\.\.1"),
    ('{"rules": {"*": 1e-5}, "logits": {"tie_factor": NaN}}', r"NaN is not a JSON number"),
    ('{"rules": {"port/*": 1e-5}}', r"no rule covers every arbiter/ point"),
    ('{"rules": {"port/L*": 1e-5, "arbiter/*": 1e-5}}', r"no rule covers every port/ point"),
])
def test_rules_numbers_in_range_and_every_point_covered(tmp_path, text, msg):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(RulesError, match=msg):
        load_rules(path)


def test_default_rules_minus_arbiter_are_refused_at_load(tmp_path):
    d = DEFAULT_RULES.to_dict()
    d["rules"] = [r for r in d["rules"] if not r["pattern"].startswith("arbiter/")]
    (tmp_path / "r.json").write_text(json.dumps(d))
    with pytest.raises(RulesError, match="no rule covers every arbiter/ point"):
        load_rules(tmp_path / "r.json")
    # A programmatic set with a gap still fails as a RulesError (exit 2), not a bare KeyError.
    with pytest.raises(UncoveredPointError, match="no tolerance rule matches 'arbiter/logits'"):
        DEFAULT_RULES.__class__(rules={"port/*": DEFAULT_RULES.rules["port/*"]}) \
            .for_point("arbiter/logits")


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
