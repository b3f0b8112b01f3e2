"""Issue #24 §4, the hostile inputs found that turn: one group per kind, each case a tiny file or
argument list ending in the project's own error (exit 2, one line, no traceback)."""
import json
import os
import re
import struct
import sys

import pytest
import torch

from ladder.cli.main import main as ladder_main
from ladder.v41.sides import DEFAULT_STEM as V41_STEM, V41FixtureError, load_fixture

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


def _v41_stem(tmp_path, edit):
    """A V4.1 fixture stem whose manifest is the committed one after `edit(manifest)`."""
    m = json.load(open(V41_STEM + ".json"))
    edit(m)
    (tmp_path / "v41.json").write_text(json.dumps(m))
    os.symlink(V41_STEM + ".safetensors", tmp_path / "v41.safetensors")
    return str(tmp_path / "v41")


def _ma(**kw):
    return lambda m: m["model_args"].update(kw)


def _call(i, **kw):
    return lambda m: m["calls"][i].update(kw)


# ---------------------------------------------------------------- 1. the V4.1 fixture
@pytest.mark.parametrize("edit, msg", [
    (_ma(rope_theta="1e4"), r"rope_theta='1e4' \(str\) must be a finite number > 1"),
    (_ma(rope_theta=1.0), r"rope_theta=1\.0 \(float\) must be a finite number > 1"),
    (_ma(beta_slow=0), r"beta_slow=0 \(int\) must be a finite number > 0"),
    (_ma(rope_factor=[2]), r"rope_factor=\[2\] \(list\) must be a finite number"),
    (_ma(norm_eps=-1.0), r"norm_eps=-1\.0 \(float\) must be a finite number >= 0"),
    (_ma(index_topk=-1), r"index_topk=-1 \(int\) must be an integer in 0\.\.2147483647"),
    (_ma(original_seq_len=2 ** 40), r"original_seq_len=1099511627776 \(int\) must be an int"),
    (_ma(candidate_block_size="2"), r"candidate_block_size='2' \(str\) must be an integer"),
    (_ma(compress_ratios="00221111"), r"compress_ratios=.00221111. must be a sequence of at most"),
    (_ma(compress_ratios=[0, 0, 2.5, 2, 1, 1, 1, 1]), r"compress_ratios=\[0, 0, 2\.5,"),
    (_ma(kv_source_layers=[2, 4] * 3000), r"kv_source_layers=\[2, 4, 2, .*\.\.\. must be a "
                                          r"sequence of at most 4096"),
    (_ma(max_seq_len=2 ** 31 - 1), r"implies .* over the memory budget of 2\.00 GiB "
                                   r"\(--max-memory\); the largest is the .* max_seq_len="
                                   r"2147483647"),
    (_ma(compress_ratios=[0] * 8, kv_source_layers=[], index_source_layers=[],
         candidate_source_layer=-1, window_size=10 ** 8),
     r"over the memory budget .* window_size=100000000"),
    (_ma(dim=65), r"tensor 'w/layers\.0\.attn\.wq_a\.weight' is bfloat16 \[16, 64\]; model_args "
                  r"need bfloat16 \[16, 65\]"),
    (_ma(head_dim=64), r"tensor 'w/layers\.0\.attn\.wq_b\.weight' is bfloat16 \[128, 16\]"),
    (lambda m: m.update(calls=[]), r"manifest field 'calls' is empty"),
    (lambda m: m["calls"][0].pop("start_pos"), r"calls\[0\] field start_pos=None must be an "
                                               r"integer in 0\.\.63"),
    (_call(0, m="1"), r"calls\[0\] field m='1' must be an integer in 1\.\.64"),
    (_call(0, m=2), r"tensor 'c000/L0/x' is bfloat16 \[1, 64\]; model_args need bfloat16 "
                    r"\[2, 64\]"),
    (_call(5, start_pos=63, m=1), None),     # inside max_seq_len: accepted (a ladder failure)
    (_call(5, start_pos=60, m=5), r"calls\[5\] field m=5 .*|start_pos=60 \+ m=5 exceeds"),
    (_call(1, key="c000"), r"calls\[1\] field key='c000' repeats an earlier call's key"),
    (lambda m: m.update(calls=m["calls"] * 100), r"'calls' has 4800 entries, over the limit "
                                                 r"4096"),
    (lambda m: m["official"].update(revision=12), r"official field revision=12 must be a string"),
    (lambda m: m["scenarios"][0].pop("name"), r"'scenarios' must be a list of at most 4096 "
                                              r"objects with a string 'name'"),
    (lambda m: m.update(scenarios={"p1": 1}), r"'scenarios' must be a list"),
])
def test_v41_fixture_model_args_and_calls_are_typed_ranged_and_budgeted(tmp_path, edit, msg):
    stem = _v41_stem(tmp_path, edit)
    if msg is None:
        load_fixture(stem)
        return
    with pytest.raises(V41FixtureError, match=msg):
        load_fixture(stem)


def test_v41_max_memory_applies_to_attn_v41(tmp_path, capsys):
    stem = _v41_stem(tmp_path, lambda m: None)
    with pytest.raises(V41FixtureError, match=r"over the memory budget of 65536 bytes"):
        load_fixture(stem, max_memory=64 << 10)
    assert load_fixture(stem, max_memory=64 << 20)[0]["calls"]
    assert ladder_main(["run", "--model", "attn_v41", "--fixture", stem,
                        "--max-memory", "64K"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "over the memory budget of 65536 bytes (--max-memory)" in err, \
        err


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


# ---------------------------------------------------------------- 3. what the budget counts
def test_budget_counts_a_params_file_as_stored(tmp_path):
    """A float64 parameter file is held as stored (8 bytes a value) beside the float32 copy:
    a budget the float32 tables fit but the file's tensors do not is refused before reading."""
    from safetensors.torch import save_file
    from reference.config import V2Config
    from reference.memory_budget import MemoryBudgetError, check_memory
    from reference.params import init_params, load_params
    cfg = V2Config.preset("tiny")
    path = str(tmp_path / "p64.safetensors")
    save_file({k: v.double() for k, v in init_params(cfg, 0).items()}, path,
              metadata={"needle_config": cfg.to_json()})
    budget = max(check_memory(cfg), os.path.getsize(path)) + 4096
    with pytest.raises(MemoryBudgetError, match=r"over the memory budget .* the largest is the "
                                                r"tensors as stored"):
        load_params(path, max_memory=budget)
    assert load_params(path, max_memory=2 * budget)[0]["embedding/embedding"].dtype == \
        torch.float64


def test_budget_counts_the_cact_file_and_its_dequantised_copies(tmp_path):
    """Reading a .cact holds the file, the slots' copy of it and the dequantised slots beside
    the parameters: a budget the tables alone fit is refused, naming the term."""
    from reference.cact import CactFormatError, read_cact
    from reference.memory_budget import check_memory
    from reference.cact_check import check_header
    path = os.path.join(FIXTURES, "cact_w2.cact")
    cfg = read_cact(path).config
    header_cfg = check_header(open(path, "rb").read(), path)[1]   # what the budget is of
    budget = max(check_memory(header_cfg), os.path.getsize(path)) + 4096
    with pytest.raises(CactFormatError, match=r"over the memory budget of .* \(--max-memory\); "
                                              r"the largest is the"):
        read_cact(path, max_memory=budget)
    assert read_cact(path, max_memory=64 << 20).config == cfg


_PEAK = r"""
import resource, sys, torch
torch.set_num_threads(1)
what = sys.argv[1]
def rss():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
if what == "values":          # 64 MB of NaN: the check must not make an int64 index of each
    from reference.params import ParamsError, check_values
    t = torch.full((1 << 24,), float("nan"))
    before = rss()
    try:
        check_values({"w": t}, "x")
    except ParamsError:
        pass
else:                         # a 4096 x 4096 2-bit matrix: 16 MB of codes
    from reference import cq
    packed = torch.randint(0, 256, (4096, 1024), dtype=torch.uint8)
    before = rss()
    codes = cq.unpack(packed, 2, 4096)
print(rss() - before)
"""


def test_value_checks_and_cq_unpack_working_copies_are_bounded():
    """The value scan and the CQ unpack used to make whole-tensor int64 copies (an all-NaN
    tensor's nonzero() is twice its size; unpacking, 17 bytes a weight): the peak they add
    is now their result and a bounded slice. One child process each (a process's peak RSS
    only grows), both at once."""
    import subprocess
    limits = {"values": 40 << 20, "unpack": 96 << 20}     # before: ~150 MiB and ~436 MiB
    kids = {what: subprocess.Popen([sys.executable, "-c", _PEAK, what], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                   env=dict(os.environ, PYTHONPATH=ROOT))
            for what in limits}
    for what, kid in kids.items():
        out, err = kid.communicate(timeout=60)
        assert kid.returncode == 0, err[-2000:]
        grew = int(out.split()[-1])
        assert grew < limits[what], f"{what}: peak grew {grew >> 20} MiB (limit " \
                                    f"{limits[what] >> 20} MiB)"


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


@pytest.mark.parametrize("rules, msg", [
    ([{"pattern": f"port/p{i}", "rtol": 1e-3} for i in range(600)] + [{"pattern": "*",
                                                                      "rtol": 1e-3}],
     r"field 'rules' has 601 rules, over the limit 512"),
    ([{"pattern": "*" + "a*" * 5000, "rtol": 1e-3}, {"pattern": "*", "rtol": 1e-3}],
     r"rules\[0\]: field pattern of 10001 characters \('\*a\*a.*exceeds the limit 256"),
])
def test_rules_pattern_count_and_length_are_bounded(tmp_path, rules, msg):
    from ladder.engine.rules import RulesError, load_rules
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"rules": rules}))
    with pytest.raises(RulesError, match=msg):
        load_rules(path)


# ---------------------------------------------------------------- 5. outputs of failed runs
def _tiny_fixture():
    return {"a": torch.arange(6.0), "b": torch.ones(2, 3)}, {"schema": 1, "note": "x"}


def test_fixture_write_is_all_or_nothing_when_the_manifest_fails(tmp_path):
    from ladder.sides import fixtures
    from ladder.engine.atomic import OutputError
    stem = tmp_path / "fx"
    tensors, manifest = _tiny_fixture()
    fixtures.write(stem, tensors, manifest)
    before = (tmp_path / "fx.safetensors").read_bytes()
    os.unlink(tmp_path / "fx.json")
    os.mkdir(tmp_path / "fx.json")                    # the manifest cannot be written
    with pytest.raises(OutputError, match=r"fx\.json: it is a directory; nothing was written"):
        fixtures.write(stem, {"a": torch.zeros(3)}, manifest)
    assert (tmp_path / "fx.safetensors").read_bytes() == before     # tensors not replaced
    assert sorted(os.listdir(tmp_path)) == ["fx.json", "fx.safetensors"]   # no .tmp left


def test_fixture_write_on_a_full_disk_is_an_os_error_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: the write fails with EFBIG, not SIGXFSZ."""
    import resource
    import signal
    from ladder.sides import fixtures
    from ladder.engine.atomic import OutputError
    tensors = {"a": torch.zeros(1 << 16)}            # 256 KB, over the 64 KB limit below
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, old[1]))
    try:
        with pytest.raises(OutputError, match=r"cannot write .*fx\.safetensors: File too large"):
            fixtures.write(tmp_path / "fx", tensors, {"schema": 1})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_sig)
    assert os.listdir(tmp_path) == []


def test_report_is_all_or_nothing(tmp_path):
    from ladder.engine.atomic import OutputError
    from ladder.engine.compare import compare_ladders
    from ladder.engine.report import write_report
    from ladder.engine.rules import Rule, RuleSet
    from ladder.engine.trace import Ladder, schedule
    steps = schedule([1, 2, 3], 1)
    values = {f"{st.name}/L00.x": torch.ones(len(st.tokens), 4) for st in steps}
    cmp = compare_ladders(Ladder(steps, values, "port"), Ladder(steps, values, "ref"),
                          RuleSet(rules={"port/*": Rule(1e-3)}))
    os.mkdir(tmp_path / "ladder.html")                 # the last of the three cannot land
    with pytest.raises(OutputError, match=r"ladder\.html: it is a directory"):
        write_report(cmp, tmp_path, plot_backend="svg")
    assert os.listdir(tmp_path) == ["ladder.html"]     # no .md, no .csv, no temporary file
    os.rmdir(tmp_path / "ladder.html")
    assert sorted(os.path.basename(p) for p in write_report(cmp, tmp_path,
                                                            plot_backend="svg").values()) == \
        ["ladder.csv", "ladder.html", "ladder.md"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert os.stat(tmp_path / "ladder.md").st_mode & 0o777 == 0o666 & ~mask   # as open() makes


@pytest.mark.parametrize("argv, flag", [(["regen", "--out", ""], "--out ''"),
                                        (["regen", "--out", "/tmp/"], "--out '/tmp/'"),
                                        (["report", "--out", ""], "--out ''")])
def test_empty_out_is_refused(tmp_path, monkeypatch, capsys, argv, flag):
    monkeypatch.chdir(tmp_path)
    assert ladder_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}: ") and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- 6. text and paths
def test_rule_why_with_a_lone_surrogate_prints_escaped(tmp_path, capsys):
    """pytest's captured stdout is strict UTF-8, as a UTF-8 terminal is."""
    path = tmp_path / "r.json"
    path.write_text('{"rules": {"*": {"rtol": 1e-3, "why": "bad \\ud800 here"}}}')
    assert ladder_main(["rules", "--rules", str(path)]) == 0
    assert 'why = "bad \\ud800 here"' in capsys.readouterr().out


def _stop(*a, **k):
    from ladder.cli.main import LadderInputError
    raise LadderInputError("stopped after the header")


def test_v41_field_with_a_lone_surrogate_prints_escaped(tmp_path, monkeypatch, capsys):
    import ladder.v41.cli
    stem = _v41_stem(tmp_path, lambda m: m["official"].update(repo="deepseek\udc80\ud800"))
    monkeypatch.setattr(ladder.v41.cli, "run_side", _stop)        # the header is the point
    assert ladder_main(["run", "--model", "attn_v41", "--fixture", stem]) == 2
    cap = capsys.readouterr()
    assert "fixture v41 of deepseek\\x80\\ud800 @" in cap.out, cap.out
    assert cap.err == "error: stopped after the header\n"


def test_non_utf8_file_name_prints_escaped(tmp_path, monkeypatch, capsys):
    import ladder.cli.commands
    d = os.fsencode(str(tmp_path))
    stem = os.fsdecode(d + b"/fx\xff")
    for ext in (".json", ".safetensors"):
        os.symlink(os.path.join(FIXTURES, "v2_forward_vectors" + ext), stem + ext)
    monkeypatch.setattr(ladder.cli.commands, "bar", _stop)
    assert ladder_main(["run", "--fixture", stem]) == 2
    assert "vs fixture " + str(tmp_path) + "/fx\\xff" in capsys.readouterr().out


def test_report_text_with_a_lone_surrogate_is_written_escaped(tmp_path):
    from ladder.engine.atomic import write_all
    write_all({tmp_path / "a.md": "why \ud800 \udcff"})
    assert (tmp_path / "a.md").read_text() == "why \\ud800 \\xff"


# ---------------------------------------------------------------- 7. arguments
def _one_line_exit_2(rc, capsys, *parts):
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    for p in parts:
        assert p in err, err


@pytest.mark.parametrize("argv, parts", [
    (["run", "--device", "meta"], ["--device meta: device type 'meta' is not one the port"]),
    (["run", "--device", "xpu"], ["--device xpu: device type 'xpu'"]),
    (["run", "--model", "attn_v41", "--device", "meta"], ["--device meta"]),
    (["run", "--params", ""], ["--params '': empty path"]),
    (["run", "--cact", " "], ["--cact ' ': empty path"]),
    (["run", "--fixture", ""], ["--fixture '': empty path"]),
    (["run", "--rules", ""], ["--rules '': empty path"]),
    (["run", "--model", "attn_v41", "--fixture", ""], ["--fixture '': empty path"]),
])
def test_ladder_device_and_empty_paths_refused_up_front(capsys, argv, parts):
    _one_line_exit_2(ladder_main(argv), capsys, *parts)


@pytest.mark.parametrize("argv, parts", [
    (["--seed", str(2 ** 64)], ["--seed 18446744073709551616: outside -2**63..2**64-1"]),
    (["--seed", str(-2 ** 63 - 1)], ["--seed -9223372036854775809: outside"]),
    (["--params", ""], ["--params '': empty path"]),
    (["--save", ""], ["--save '': empty path"]),
    (["--save", "/nonexistent-dir/p.safetensors"], ["directory /nonexistent-dir does not exist"]),
    (["--save", "{tmp}"], ["is a directory"]),
    (["--window", str(10 ** 23)], ["--window 100000000000000000000000: must lie in 0..max_seq_len"
                                   "=64"]),
])
def test_reference_run_refuses_bad_arguments_with_exit_2(tmp_path, capsys, argv, parts):
    from reference.__main__ import main
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    _one_line_exit_2(main(["run", "--steps", "1", "--prompt-len", "1", *argv]), capsys, *parts)


def test_reference_save_failing_is_exit_2_not_a_library_error(tmp_path, capsys):
    from reference.__main__ import main
    os.chmod(tmp_path, 0o500)
    try:
        if os.access(tmp_path, os.W_OK):          # root: the directory stays writable
            os.symlink("/proc/version", tmp_path / "p.safetensors")   # unwritable file
    except OSError:
        pass
    try:
        rc = main(["run", "--steps", "1", "--prompt-len", "1", "--save",
                   str(tmp_path / "p.safetensors")])
    finally:
        os.chmod(tmp_path, 0o700)
    _one_line_exit_2(rc, capsys, "p.safetensors")


def _params_with_config(tmp_path, text):
    from safetensors.torch import save_file
    from reference.config import V2Config
    from reference.params import init_params
    path = str(tmp_path / "p.safetensors")
    save_file(init_params(V2Config.preset("tiny"), 0), path, metadata={"needle_config": text})
    return path


def test_confusable_and_duplicate_config_keys_are_refused(tmp_path):
    from reference.config import ConfigError, V2Config
    from reference.params import load_params
    good = V2Config.preset("tiny").to_json()
    assert good.startswith('{"act_bits"')
    assert '"kv_window": 8' in good                 # a windowed model; without it, full causal
    lookalike = good.replace('"kv_window": 8', '"kv_w\u0456ndow": 8')       # Cyrillic i
    with pytest.raises(ConfigError, match=r"needle_config: unknown field 'kv_w\u0456ndow' \(did "
                                          r"you mean 'kv_window'\?\)"):
        load_params(_params_with_config(tmp_path, lookalike))
    dup = good.replace('"kv_window": 8', '"kv_window": 8, "kv_window": 0')
    with pytest.raises(ConfigError, match=r"key 'kv_window' appears twice in one object"):
        load_params(_params_with_config(tmp_path, dup))
    with pytest.raises(ConfigError, match=r"unknown field 'kv_window '"):
        V2Config.from_json(good.replace('"kv_window"', '"kv_window "'))


def test_fixture_config_with_a_lookalike_key_is_refused(tmp_path):
    from ladder.sides import fixtures
    m = json.load(open(os.path.join(FIXTURES, "v2_forward_vectors.json")))
    m["config"]["kv_windows"] = m["config"].pop("kv_window")
    (tmp_path / "fx.json").write_text(json.dumps(m))
    os.symlink(os.path.join(FIXTURES, "v2_forward_vectors.safetensors"),
               tmp_path / "fx.safetensors")
    with pytest.raises(fixtures.FixtureError, match=r"field config: unknown field 'kv_windows' "
                                                    r"\(did you mean 'kv_window'\?\)"):
        fixtures.load(tmp_path / "fx")


@pytest.mark.parametrize("theta", [1e-30, 0.5, 1e31])
def test_tiny_or_huge_rope_theta_is_a_config_error(tmp_path, theta, capsys):
    from reference.__main__ import main
    from reference.config import ConfigError, V2Config
    with pytest.raises(ConfigError, match=re.escape(f"rope_theta={theta!r} outside 1..1e30")):
        V2Config.preset("tiny").replace(rope_theta=theta)
    text = json.dumps(dict(V2Config.preset("tiny").to_dict(), rope_theta=theta))
    rc = main(["run", "--steps", "1", "--prompt-len", "1", "--params",
               _params_with_config(tmp_path, text)])
    _one_line_exit_2(rc, capsys, f"rope_theta={theta!r} outside 1..1e30")


# ---------------------------------------------------------------- 8. the tokenizer API
def _no_byte_pieces(byte_fallback=True):
    from reference.tokenizer import Tokenizer
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "\u2581a", "a", "b"]
    return Tokenizer(pieces, [0.0] * 7, [2, 2, 2, 1, 0, 0, 0], byte_fallback=byte_fallback)


def test_byte_fallback_without_byte_pieces_is_the_tokenizer_error():
    from reference.tokenizer import Tokenizer, TokenizerFormatError
    tok = _no_byte_pieces()
    assert tok.encode("ab") == [4, 6]
    with pytest.raises(TokenizerFormatError, match=r"byte_fallback: byte 0x7A of 'z' has no "
                                                   r"<0x7A> piece") as e:
        tok.encode("az")
    assert e.value.field == "byte_fallback"
    # at load: a blob that claims byte fallback without the 256 BYTE pieces is refused
    with pytest.raises(TokenizerFormatError, match=r"byte_fallback=1 but 256 of the 256 <0xHH> "
                                                   r"BYTE pieces are missing") as e:
        Tokenizer.from_blob(tok.to_blob())
    assert (e.value.field, e.value.offset) == ("byte_fallback", 21)
    assert Tokenizer.from_blob(_no_byte_pieces(False).to_blob()).encode("az") == [4, 3]


def test_v41_report_writes_its_six_files_together(tmp_path, monkeypatch):
    """The V4.1 report is two reports (port vs reference, reference vs official): a failure
    on the second leaves neither, where the first used to be written already."""
    import argparse
    import ladder.v41.cli as v41_cli
    from ladder.engine.atomic import OutputError
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import Rule, RuleSet
    from ladder.engine.trace import Ladder, schedule
    steps = schedule([1, 2, 3], 1)
    values = {f"{st.name}/L00.x": torch.ones(len(st.tokens), 4) for st in steps}
    cmp = compare_ladders(Ladder(steps, values, "port"), Ladder(steps, values, "ref"),
                          RuleSet(rules={"port/*": Rule(1e-3)}))
    monkeypatch.setattr(v41_cli, "compare_run", lambda args, out: (cmp, cmp, {}, {}))
    monkeypatch.setattr(v41_cli, "_locate", lambda cmp, ctx: None)
    args = argparse.Namespace(out=str(tmp_path), stem="v41", plot="svg")
    os.mkdir(tmp_path / "v41-official.html")
    with pytest.raises(OutputError, match=r"v41-official\.html: it is a directory"):
        v41_cli.cmd_report(args, out=lambda *a: None)
    assert os.listdir(tmp_path) == ["v41-official.html"]
    os.rmdir(tmp_path / "v41-official.html")
    assert v41_cli.cmd_report(args, out=lambda *a: None) == 0
    assert len(os.listdir(tmp_path)) == 6
