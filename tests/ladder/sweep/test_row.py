"""A sweep directory read back as hostile input: a result.json or sweep.json that is partial,
mistyped, another case's or not a regular file never crashes `sweep` (resume) or `--merge`
with a traceback. On resume a bad row is a case not done (run again, said on stderr); on
--merge, and for a bad sweep.json everywhere, exit 2 naming the file and the field."""
import json
import os
import shutil
import sys

import pytest

from ladder.cli.main import main

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")
GRID = """[grid]
plant = ["none", "rope_pos_plus_1"]
[fixed]
preset = "tiny"
prompt_len = 2
steps = 1
no_check_plain = true
"""


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """A finished 2-case sweep (one pass, one fail) and its grid; tests work on copies."""
    tmp = tmp_path_factory.mktemp("files")
    grid = tmp / "g.toml"
    grid.write_text(GRID)
    assert main(["sweep", str(grid), "--out", str(tmp / "sweep"), "--threads", "1"]) == 1
    return tmp, str(grid)


@pytest.fixture
def copy(done, tmp_path, capsys):
    tmp, grid = done
    shutil.copytree(tmp / "sweep", tmp_path / "s", symlinks=True)
    capsys.readouterr()
    d = tmp_path / "s"
    cases = sorted(os.listdir(d / "cases"))
    return d, grid, [d / "cases" / c / "result.json" for c in cases]


def _row(path):
    return json.loads(path.read_text())


def _merge(d, capsys):
    rc = main(["sweep", "--merge", str(d), "--out", str(d.parent / "m")])
    return rc, capsys.readouterr().err


FAIL = 1                      # the second case (the planted fault): worst/first/logits set
BAD_ROWS = [                  # (case, change to its row, the field the error must name)
    (0, lambda r: {"id": r["id"]}, "field 'index' is missing"),
    (0, lambda r: dict(r, settings=5), "field 'settings' = 5: must be an object"),
    (FAIL, lambda r: dict(r, worst=dict(r["worst"], error="x")),
     "field 'worst.error' = \"x\": must be a number >= 0 or \"unbounded\""),
    (FAIL, lambda r: dict(r, worst={"error": 1.0}), "field 'worst.step' is missing"),
    (0, lambda r: dict(r, status="maybe"), "field 'status' = \"maybe\""),
    (0, lambda r: dict(r, points=True), "field 'points' = true: must be an integer >= 0"),
    (0, lambda r: dict(r, failing="3"), "field 'failing' = \"3\""),
    (0, lambda r: dict(r, layers={"L00": "big"}), "field 'layers.L00' = \"big\""),
    (0, lambda r: dict(r, layers=[1.0]), "field 'layers' = [1.0]: must be an object"),
    (0, lambda r: dict(r, settings=dict(r["settings"], nope=1)), "not a grid key"),
    (FAIL, lambda r: dict(r, first_divergence=dict(r["first_divergence"], kind=5)),
     "field 'first_divergence.kind' = 5: must be a string"),
    (FAIL, lambda r: dict(r, logits=[]), "field 'logits' = []: must be an object"),
    (FAIL, lambda r: dict(r, logits=dict(r["logits"], extra=1)),
     "field 'logits.extra' is not a row field"),
    (0, lambda r: dict(r, timing={"seconds": "fast", "started": None}),
     "field 'timing.seconds' = \"fast\""),
    (0, lambda r: dict(r, archive=dict(r["archive"], path=5)), "field 'archive.path' = 5"),
    (0, lambda r: dict(r, message=[]), "field 'message' = []"),
    (0, lambda r: dict(r, extra=1), "field 'extra' is not a row field"),
    (0, lambda r: [r], "must be a JSON object"),
]


@pytest.mark.parametrize("case, change, msg", BAD_ROWS)
def test_a_bad_row_is_refused_by_merge_and_not_done_on_resume(copy, capsys, case, change, msg):
    from ladder.sweep.grid import load_grid
    from ladder.sweep.row import read_row
    d, grid, results = copy
    results[case].write_text(json.dumps(change(_row(results[case]))))
    rc, err = _merge(d, capsys)
    assert rc == 2 and f"{results[case]}: " in err and msg in err, err
    assert "Traceback" not in err
    row, why = read_row(str(d), load_grid(grid).cases[case])
    assert row is None and str(results[case]) in why and msg in why


def test_a_row_of_another_case_is_refused(copy, capsys):
    from ladder.sweep.row import ROW_FIELDS
    d, grid, (a, b) = copy
    assert tuple(_row(a)) == tuple(_row(b)) == ROW_FIELDS      # what check_row insists on
    b.write_text(json.dumps(dict(_row(b), index=0)))
    rc, err = _merge(d, capsys)
    assert rc == 2 and f"{b}: field 'id'/'index'" in err, err


def test_resume_runs_bad_and_linked_rows_again(copy, capsys):
    """One row mistyped, the other a link to a good row elsewhere: both cases run again,
    each named on stderr, and their results are regular files again."""
    d, grid, (a, b) = copy
    a.write_text(json.dumps(dict(_row(a), settings=5)))
    elsewhere = d.parent / "b.json"
    shutil.move(b, elsewhere)
    os.symlink(elsewhere, b)
    assert main(["sweep", grid, "--out", str(d), "--threads", "1"]) == 1
    err = capsys.readouterr().err
    assert f"{a}: field 'settings' = 5: must be an object; case " in err, err
    assert f"{b}: result file: a symbolic link; refused; case " in err, err
    assert err.count("is not done, running it again") == 2 and "0 done before" in err
    assert not a.is_symlink() and not b.is_symlink() and _row(a)["settings"]["plant"] == "none"


@pytest.mark.parametrize("make, msg", [
    (lambda p, other: (p.unlink(), os.symlink(other, p)), "a symbolic link"),
    (lambda p, other: (p.unlink(), p.mkdir()), "not a regular file"),
    (lambda p, other: (shutil.rmtree(p.parent), os.symlink(other.parent, p.parent)),
     "a case directory that is a symbolic link"),
])
def test_merge_refuses_results_that_are_not_regular_files(copy, capsys, make, msg):
    d, grid, (a, b) = copy
    other = d.parent / "x" / a.parent.name / "result.json"
    other.parent.mkdir(parents=True)
    shutil.copy(a, other)
    make(a, other)
    rc, err = _merge(d, capsys)
    assert rc == 2 and msg in err and "Traceback" not in err, err


BAD_MANIFESTS = [             # (change to sweep.json, what the error must say)
    (lambda m: m.pop("name"), "field 'name' is missing"),
    (lambda m: m.update(name=5), "field 'name' = 5: must be a string"),
    (lambda m: m.update(case_ids=[1, 2]), "field 'case_ids' = [1, 2]: must be a list of 2"),
    (lambda m: m.update(case_ids=["../../etc", "x"]), "field 'case_ids'"),
    (lambda m: m.update(case_ids=m["case_ids"][:1]), "field 'case_ids'"),
    (lambda m: m.update(cases="2"), "field 'cases' = \"2\": must be an integer"),
    (lambda m: m.pop("cases"), "field 'cases' is missing"),
    (lambda m: m.update(grid_file=None), "field 'grid_file' = null"),
    (lambda m: m.update(grid_sha256=5), "field 'grid_sha256' = 5: must be 64 hex digits"),
    (lambda m: m.update(shard="0/2"), "field 'shard' = \"0/2\": must be K/N"),
    (lambda m: m.update(shard=1), "field 'shard' = 1"),
    (lambda m: m.update(grid=[]), "field 'grid' = []"),
    (lambda m: m.update(files={"a": 1}), "field 'files'"),
    (lambda m: m.update(format="other"), "field 'format' = \"other\""),
    (lambda m: m.update(schema_version=True), "field 'schema_version' = true"),
]


@pytest.mark.parametrize("change, msg", BAD_MANIFESTS)
def test_a_bad_sweep_json_exits_2_naming_the_field(copy, capsys, change, msg):
    d, grid, _ = copy
    p = d / "sweep.json"
    m = json.loads(p.read_text())
    change(m)
    p.write_text(json.dumps(m))
    for argv in (["--merge", str(d), "--out", str(d.parent / "m")],
                 [grid, "--out", str(d), "--threads", "1"]):
        assert main(["sweep", *argv]) == 2
        err = capsys.readouterr().err
        assert f"{p}: sweep manifest {msg}" in err and "Traceback" not in err, err
