"""`python -m ladder sweep`: shards merge to the unsharded sweep row for row, a SIGKILLed sweep
resumes running only its missing cases (both through real subprocesses), a planted fault shows
in the report, and bad grids, shard specs and merges exit 2 naming the value. Tiny preset, 2-3
positions, no plain check."""
from tests import paths
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from ladder.cli.main import main

ROOT = paths.ROOT
ENV = dict(os.environ, PYTHONPATH=ROOT)        # the subprocesses import this checkout
# 3 seeds x 2 prompt lengths x 2 weight forms x 2 faults = 24 cases, half of them failing
GRID = """[sweep]
name = "t24"
[grid]
seed = [0, 1, 2]
prompt_len = [2, 3]
weights = ["dense", "cq"]
plant = ["none", "rope_pos_plus_1"]
[fixed]
preset = "tiny"
steps = 1
no_check_plain = true
"""
N_CASES = 24
# TOML grids need tomllib (3.11+); the JSON form of a grid runs anywhere
needs_toml = pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")


def _sweep_cmd(*argv):
    return [sys.executable, "-m", "ladder", "sweep", *map(str, argv)]


def _rows(d):
    with open(os.path.join(d, "report.json"), encoding="utf-8") as f:
        return json.load(f)["rows"]


def _stable(rows):
    return [{k: v for k, v in r.items() if k != "timing"} for r in rows]


def _results(d):
    root = os.path.join(d, "cases")
    return {c: os.path.join(root, c, "result.json") for c in sorted(os.listdir(root))
            if os.path.isfile(os.path.join(root, c, "result.json"))}


def _write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """The 24-case grid run unsharded with -j 2 (the pool) and as 3 shards, all 4 sweeps in
    concurrent subprocesses."""
    tmp = tmp_path_factory.mktemp("sweep")
    grid = _write(tmp, "t24.toml", GRID)
    runs = {"all": ["-j", 2]} | {f"s{k}": ["--shard", f"{k}/3"] for k in (1, 2, 3)}
    procs = {name: subprocess.Popen(_sweep_cmd(grid, "--out", tmp / name, "--threads", 1,
                                               *extra), env=ENV, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
             for name, extra in runs.items()}
    done = {name: (p.wait(timeout=300),) + p.communicate() for name, p in procs.items()}
    for name, (rc, out, err) in done.items():
        assert rc == 1, (name, rc, out, err[-3000:])          # the planted cases fail
    return tmp, grid, done


@needs_toml
@pytest.mark.slow         # about 15 s: 4 sweeps and 2 pool workers, each importing torch
def test_three_shards_merged_equal_the_unsharded_sweep_row_for_row(swept, capsys):
    tmp, grid, done = swept
    shard_ids = [set(_results(tmp / f"s{k}")) for k in (1, 2, 3)]
    assert sum(map(len, shard_ids)) == N_CASES and len(set().union(*shard_ids)) == N_CASES
    assert "with -j 2 x 1 thread" in done["all"][2]
    rc = main(["sweep", "--merge", *(str(tmp / f"s{k}") for k in (1, 2, 3)), "--out",
               str(tmp / "merged")])
    assert rc == 1
    merged, whole = _rows(tmp / "merged"), _rows(tmp / "all")
    assert len(whole) == N_CASES and [r["index"] for r in whole] == list(range(N_CASES))
    assert _stable(merged) == _stable(whole)
    assert all(r["archive"]["sha256"] and r["threads"] == 1 for r in whole)
    assert "24 cases" in capsys.readouterr().out


@needs_toml
def test_a_planted_fault_shows_as_fail_with_its_first_divergence(tmp_path, capsys):
    grid = _write(tmp_path, "g.toml", GRID.replace("seed = [0, 1, 2]", "seed = [0]")
                  .replace("prompt_len = [2, 3]", "prompt_len = [2]")
                  .replace('weights = ["dense", "cq"]', 'weights = ["dense"]'))
    out = tmp_path / "o"
    assert main(["sweep", grid, "--out", str(out), "--threads", "1"]) == 1
    assert re.search(r"^  fail: c0001-\w+ prefill/L03\.q \(own\)$", capsys.readouterr().out,
                     re.M)
    rows = _rows(out)
    assert [r["settings"]["plant"] for r in rows] == ["none", "rope_pos_plus_1"]
    clean, planted = rows
    assert clean["status"] == "pass" and clean["first_divergence"] is None
    assert clean["failing"] == 0 and max(clean["layers"].values()) < 1
    assert planted["status"] == "fail" and planted["failing"] > 0
    f = planted["first_divergence"]
    assert (f["step"], f["point"], f["position"], f["kind"]) == ("prefill", "L03.q", 0, "own")
    assert "own error" in f["verdict"]
    assert planted["layers"]["L03"] > 1 > max(v for k, v in planted["layers"].items()
                                              if k != "L03")
    assert os.path.isfile(out / planted["archive"]["path"])
    md = (out / "report.md").read_text()
    assert re.search(r"\| c0001-\w+ \| rope_pos_plus_1 \| fail \| .*"
                     r"prefill/L03\.q pos 0 \(own\)", md), md[:2000]
    assert "1 pass, 1 fail, 0 error, 0 missing" in md
    html = (out / "report.html").read_text()
    assert html.count("<td class='h'") == 2 * 7                     # 6 layers + embed/final
    assert "<td class='fail'>fail</td>" in html
    csv = (out / "report.csv").read_text().splitlines()
    assert len(csv) == 3 and "L03" in csv[0].split(",")


@needs_toml
def test_a_killed_sweep_resumes_running_only_the_missing_cases(tmp_path, capsys):
    grid = _write(tmp_path, "t24.toml", GRID)
    out, third = tmp_path / "killed", N_CASES // 3      # shard 1/3: clean and planted
    p = subprocess.Popen(_sweep_cmd(grid, "--out", out, "--shard", "1/3", "--threads", 1),
                         env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while len(_results(out) if (out / "cases").is_dir() else {}) < 3:
            assert p.poll() is None, "the sweep ended before 3 results"
            time.sleep(0.02)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(timeout=60)
    before = _results(out)
    assert 0 < len(before) < third
    kept = {c: (open(path, "rb").read(), os.stat(path).st_ino, os.stat(path).st_mtime_ns,
                open(os.path.join(os.path.dirname(path), "trace.safetensors"), "rb").read())
            for c, path in before.items()}
    capsys.readouterr()
    assert main(["sweep", grid, "--out", str(out), "--shard", "1/3", "--threads", "1"]) == 1
    err = capsys.readouterr().err
    ran = re.findall(r"^sweep \[\d+/8\] (c\d{4}-[0-9a-f]{8}) ", err, re.M)
    assert sorted(ran) == sorted(set(_results(out)) - set(before)), err
    assert len(ran) == third - len(before) and f"{len(before)} done before" in err
    for c, (body, ino, mtime, archive) in kept.items():
        path = before[c]
        assert open(path, "rb").read() == body and os.stat(path).st_ino == ino
        assert os.stat(path).st_mtime_ns == mtime
        assert open(os.path.join(os.path.dirname(path), "trace.safetensors"), "rb").read() \
            == archive
    rows = _rows(out)
    assert [r["index"] for r in rows] == list(range(0, N_CASES, 3))
    assert [r["status"] for r in rows] == ["pass", "fail"] * 4          # plant alternates


@needs_toml
@pytest.mark.parametrize("grid, argv, msg", [
    (GRID.replace("seed =", "sed ="), [], "unknown key 'sed'"),
    (GRID.replace("seed = [0, 1, 2]", "seed = []"), [], "grid.seed = []"),
    (GRID.replace("seed = [0, 1, 2]", "seed = 3"), [], "grid.seed = 3: must be a list"),
    (GRID.replace("seed = [0, 1, 2]", "seed = [true]"), [], "grid.seed = true"),
    (GRID, ["--shard", "0/3"], "--shard 0/3"),
    (GRID, ["--shard", "4/3"], "--shard 4/3"),
    (GRID, ["--shard", "two/3"], "--shard 'two/3'"),
    (GRID.replace("steps = 1", "steps = 4000"), [], "--prompt-len 2 + --steps 4000"),
    (GRID.replace("rope_pos_plus_1", "no_such_fault"), [], "--plant no_such_fault: unknown"),
    (GRID.replace("[fixed]", "[[exclude]]\nweights = \"qc\"\n[fixed]"), [],
     "exclude #1 {\"weights\": \"qc\"} matches no case"),
    (GRID.replace("[fixed]", "[fixed]\nport = \"no_such_module:build\""), [],
     "cannot import 'no_such_module'"),
    (GRID.replace("[fixed]", "[fixed]\nport = \"tests.ports.toy_port:build\"\nbackend = \"native\""),
     [], "--backend native applies to our port"),
])
def test_bad_grids_and_shards_exit_2_naming_the_value(tmp_path, capsys, grid, argv, msg):
    path = _write(tmp_path, "g.toml", grid)
    assert main(["sweep", path, "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert msg in err, err
    assert not (tmp_path / "o" / "cases").exists()             # refused before any case


@needs_toml
def test_merge_refuses_other_grids_disagreeing_rows_and_missing_cases(tmp_path, capsys):
    one = GRID.replace("seed = [0, 1, 2]", "seed = [5]")
    a = _write(tmp_path, "a.toml", one.replace('plant = ["none", "rope_pos_plus_1"]',
                                               'plant = ["none"]'))
    b = _write(tmp_path, "b.toml", one.replace('plant = ["none", "rope_pos_plus_1"]',
                                               'plant = ["rope_pos_plus_1"]'))
    for g, d, extra in ((a, "a1", ["--shard", "1/2"]), (a, "a2", ["--shard", "2/2"]),
                        (b, "b", [])):
        assert main(["sweep", g, "--out", str(tmp_path / d), "--threads", "1", *extra]) in (0, 1)
    capsys.readouterr()
    a1, a2, bd, m = (str(tmp_path / d) for d in ("a1", "a2", "b", "m"))
    assert main(["sweep", "--merge", a1, bd, "--out", m]) == 2
    err = capsys.readouterr().err
    assert f"{bd} holds grid" in err and f"{a1} holds" in err and "not shards of one grid" in err
    assert main(["sweep", "--merge", a1, "--out", m]) == 2
    assert "2 of 4 cases have no result" in capsys.readouterr().err
    assert main(["sweep", "--merge", a1, "--out", m, "--allow-partial"]) == 0
    assert json.loads((tmp_path / "m" / "report.json").read_text())["missing"]
    # a copy of shard 1 whose row for one case says something else
    import shutil
    shutil.copytree(a1, tmp_path / "a1x")
    case, path = next(iter(_results(tmp_path / "a1x").items()))
    row = json.loads(open(path).read())
    row["failing"] = 7
    open(path, "w").write(json.dumps(row))
    assert main(["sweep", "--merge", a1, a2, str(tmp_path / "a1x"), "--out", m]) == 2
    err = capsys.readouterr().err
    assert f"case {case} differs between {a1} and {tmp_path / 'a1x'}" in err, err
    assert "'failing'" in err
    assert main(["sweep", "--merge", a1, a2, "--out", m]) == 0
    # the same directory given a grid it does not hold is refused, not mixed
    assert main(["sweep", b, "--out", a1]) == 2
    assert "holds a sweep of grid_sha256" in capsys.readouterr().err


@needs_toml
def test_the_documented_grid_expands_and_validates(capsys):
    from ladder.sweep.command import validate_cases
    from ladder.sweep.grid import load_grid, shard_cases
    grid = load_grid(os.path.join(ROOT, "docs", "sweep-tiny.toml"))
    validate_cases(grid)
    assert len(grid.cases) == 28 and len({c.id for c in grid.cases}) == 28
    parts = [shard_cases(grid.cases, k, 3) for k in (1, 2, 3)]
    assert sorted(c.index for p in parts for c in p) == list(range(28))
    assert [len(p) for p in parts] == [10, 9, 9]
    # docs/sweeps.md shows this grid: the same tables, whatever the comments say
    import tomllib
    page = open(os.path.join(ROOT, "docs", "sweeps.md"), encoding="utf-8").read()
    shown = tomllib.loads(re.search(r"```toml\n(.*?)```", page, re.S).group(1))
    with open(os.path.join(ROOT, "docs", "sweep-tiny.toml"), "rb") as f:
        shipped = tomllib.load(f)
    for table in ("grid", "fixed", "exclude"):
        assert shown[table] == shipped[table], table


@needs_toml
def test_dry_run_lists_the_shard_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "o"
    assert main(["sweep", os.path.join(ROOT, "docs", "sweep-tiny.toml"), "--out", str(out),
                 "--shard", "2/3", "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "28 cases" in lines[0] and "shard 2/3: 9" in lines[0]
    assert [ln.split()[0][:5] for ln in lines[1:]] == [f"c{i:04d}" for i in range(1, 28, 3)]
    assert all("python -m ladder run --seed" in ln for ln in lines[1:])
    assert not out.exists()


@needs_toml
def test_a_case_that_fails_to_run_is_an_error_row_and_the_sweep_goes_on(tmp_path, capsys,
                                                                       monkeypatch):
    from ladder.cli import commands as cli
    real = cli.compare_run

    def flaky(args, out=print):
        if args.seed == 1:
            raise cli.LadderInputError("--seed 1: refused for this test")
        return real(args, out)
    monkeypatch.setattr(cli, "compare_run", flaky)
    grid = _write(tmp_path, "g.toml", GRID.replace("seed = [0, 1, 2]", "seed = [0, 1]")
                  .replace('plant = ["none", "rope_pos_plus_1"]', 'plant = ["none"]')
                  .replace("prompt_len = [2, 3]", "prompt_len = [2]"))
    assert main(["sweep", grid, "--out", str(tmp_path / "o"), "--threads", "1"]) == 2
    rows = _rows(tmp_path / "o")
    assert [(r["settings"]["seed"], r["status"]) for r in rows] == \
        [(0, "pass"), (0, "pass"), (1, "error"), (1, "error")]
    assert rows[2]["message"] == "error: --seed 1: refused for this test"
    assert rows[2]["archive"] is None
    assert "error: c0002-" in capsys.readouterr().out



def test_a_json_grid_runs_where_toml_cannot_be_read(tmp_path, capsys):
    grid = {"sweep": {"name": "j"}, "grid": {"plant": ["none", "rope_pos_plus_1"]},
            "fixed": {"preset": "tiny", "prompt_len": 2, "steps": 1, "no_check_plain": True}}
    path = _write(tmp_path, "g.json", json.dumps(grid))
    assert main(["sweep", path, "--out", str(tmp_path / "o"), "--threads", "1"]) == 1
    assert [r["status"] for r in _rows(tmp_path / "o")] == ["pass", "fail"]
    grid["grid"]["seed"] = [0, 0]
    path = _write(tmp_path, "bad.json", json.dumps(grid))
    assert main(["sweep", path, "--out", str(tmp_path / "o2")]) == 2
    assert "grid.seed lists 0 twice" in capsys.readouterr().err


@needs_toml
def test_protocol_ports_sweep_beside_ours(tmp_path, capsys):
    """`port`: any protocol port (ladder/sides/ports.py) is a grid axis; ours is "ours"."""
    grid = _write(tmp_path, "p.toml", """[sweep]
name = "ports"
[grid]
port = ["ours", "tests.ports.toy_port:build", "tests.ports.toy_port:build_buggy"]
[fixed]
prompt_len = 3
steps = 1
""")
    out = tmp_path / "o"
    assert main(["sweep", grid, "--out", str(out), "--threads", "1"]) == 1
    capsys.readouterr()
    ours, toy, buggy = _rows(out)
    assert ours["status"] == toy["status"] == "pass" and buggy["status"] == "fail"
    assert ours["points"] == toy["points"] == buggy["points"] > 0
    assert "ToyPort" in toy["port"] and "torch" in ours["port"]
    f = buggy["first_divergence"]
    assert (f["point"], f["position"], f["kind"]) == ("L02.hpost", 0, "own")
    from ladder.engine.trace import Ladder
    lad = Ladder.load(out / buggy["archive"]["path"])
    assert lad.meta["producer"]["backend"] == "tests.ports.toy_port:build_buggy"
    assert len(lad.tokens) == 4


def _children(pid):
    """The pids whose parent is `pid` (its pool workers and the resource tracker)."""
    kids = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids |= {int(k) for k in f.read().split()}
    return kids


def _alive(pid):
    """Running, not a zombie (an orphan's new parent may never reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


@needs_toml
@pytest.mark.skipif(not os.path.isfile(f"/proc/self/task/{os.getpid()}/children"),
                    reason="finds the workers through /proc/PID/task/TID/children (Linux)")
def test_a_killed_pool_sweep_takes_its_workers_with_it(tmp_path, capsys):
    """SIGKILL runs no cleanup in the sweep: its workers must end with it (the kernel's
    parent-death signal), not go on writing results into cases/ beside a resumed sweep."""
    grid = _write(tmp_path, "g.toml", GRID.replace("seed = [0, 1, 2]", "seed = [0, 1, 2, 3]")
                  .replace("prompt_len = [2, 3]", "prompt_len = [2]")
                  .replace('weights = ["dense", "cq"]', 'weights = ["dense"]'))
    out = tmp_path / "o"
    p = subprocess.Popen(_sweep_cmd(grid, "--out", out, "-j", 2, "--threads", 1), env=ENV,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while len(_results(out) if (out / "cases").is_dir() else {}) < 2:
            assert p.poll() is None, "the sweep ended before 2 results"
            time.sleep(0.01)
        kids = _children(p.pid)
        p.send_signal(signal.SIGKILL)
    finally:
        p.wait(timeout=60)
    at_kill, t0 = set(_results(out)), time.monotonic()
    assert len(kids) >= 2 and 2 <= len(at_kill) < 8
    while any(map(_alive, kids)) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not [k for k in kids if _alive(k)], "a worker outlived its sweep"
    time.sleep(max(0.0, t0 + 1.0 - time.monotonic()))  # an orphan would finish its case by now
    assert set(_results(out)) == at_kill
    capsys.readouterr()
    assert main(["sweep", grid, "--out", str(out), "--threads", "1"]) == 1
    ran = re.findall(r"^sweep \[\d+/8\] (c\d{4}-[0-9a-f]{8}) ", capsys.readouterr().err, re.M)
    assert sorted(ran) == sorted(set(_results(out)) - at_kill) and len(_results(out)) == 8


@needs_toml
@pytest.mark.skipif(__import__("ladder.sweep.command").sweep.command.cpus() < 2, reason="--threads 2")
def test_the_same_grid_at_other_thread_counts_merges(tmp_path, capsys):
    """`threads` and the thread count in `port` follow --threads, not the case: merge leaves
    them out, as `timing` (the tiny preset's numbers do not move with the thread count)."""
    grid = _write(tmp_path, "g.toml", GRID.replace("seed = [0, 1, 2]", "seed = [0]")
                  .replace("prompt_len = [2, 3]", "prompt_len = [2]")
                  .replace('weights = ["dense", "cq"]', 'weights = ["dense"]'))
    for t in (1, 2):
        assert main(["sweep", grid, "--out", str(tmp_path / f"t{t}"), "--threads", str(t)]) == 1
    one, two = _rows(tmp_path / "t1"), _rows(tmp_path / "t2")
    assert [r["threads"] for r in one + two] == [1, 1, 2, 2]
    assert "1 torch thread" in one[0]["port"] and "2 torch threads" in two[0]["port"]
    capsys.readouterr()
    assert main(["sweep", "--merge", str(tmp_path / "t1"), str(tmp_path / "t2"), "--out",
                 str(tmp_path / "m")]) == 1, capsys.readouterr().err
    from ladder.sweep.row import run_env_free
    assert list(map(run_env_free, one)) == list(map(run_env_free, two))
    assert _rows(tmp_path / "m") == one                 # the first directory's rows
