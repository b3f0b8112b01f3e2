"""A sweep pools its cases' systematic statistics (ladder/sweep/pooled.py), one cluster per
model: a 0.3 % scale that no single tiny run can tell from the model's own rounding (its margin
is u = 0.39 % at bfloat16) fails the sweep over 16 seeds, at its point, while every case passes
on its own; the honest port's pool does not fail; a row's `systematic`
field is checked like every other field."""
from tests import paths  # noqa: F401  (the checkout on sys.path)
import json
import sys

import pytest

from ladder.cli.main import main
from ladder.sweep.grid import SweepError
from ladder.sweep.pooled import CASE_CLUSTERS, check_field, pool

needs_toml = pytest.mark.skipif(sys.version_info < (3, 11), reason="tomllib is Python 3.11+")


def _sweep(tmp_path, factory: str, seeds: int = 16):
    grid = tmp_path / "g.toml"
    grid.write_text(f"""[sweep]
name = "pool"
[grid]
seed = {list(range(seeds))}
[fixed]
preset = "tiny"
prompt_len = 6
steps = 12
port = "tests.ports.scaled_port:{factory}"
port_precision = "bfloat16"
""")
    out = tmp_path / "o"
    rc = main(["sweep", str(grid), "--out", str(out), "--threads", "1"])
    return rc, json.loads((out / "report.json").read_text()), out


@needs_toml
def test_a_scale_below_one_runs_noise_fails_the_pooled_sweep(tmp_path, capsys):
    rc, rep, out = _sweep(tmp_path, "mlp_1003")
    printed = capsys.readouterr().out
    assert rep["counts"] == {"pass": 16, "fail": 0, "error": 0}     # no case sees it alone
    assert rc == 1
    (group,) = rep["systematic_pooled"]
    assert group["cases"] == group["models"] == 16
    # its chained statistics and its own op's (ladder/sides/own_error.py), nothing else
    assert [(f["point"], f["basis"]) for f in group["failing"]] == [
        ("L02.mlp_out", "chained"), ("L02.mlp_out", "own op")]
    for f in group["failing"]:
        scale = f["scale"]
        assert abs(scale["value"] - 0.003) < 3 * scale["se"]             # the planted size
        assert scale["p_adjusted"] < 1e-3 and scale["value"] > scale["margin"]
    assert "pooled systematic FAIL (16 cases): systematic scale at L02.mlp_out" in printed
    md = (out / "report.md").read_text()
    assert "## Systematic errors, pooled over cases" in md and "FAIL systematic scale" in md
    assert all("systematic" not in r for r in rep["rows"])          # the sums stay per case
    one = json.loads(next((out / "cases").glob("*/result.json")).read_text())
    pts = one["systematic"]["points"]
    assert "L02.mlp_out" in pts and 1 <= len(pts["L02.mlp_out"]["sums"]) <= CASE_CLUSTERS


@needs_toml
def test_the_honest_ports_pool_does_not_fail(tmp_path, capsys):
    rc, rep, _ = _sweep(tmp_path, "honest")
    capsys.readouterr()
    assert rc == 0 and rep["counts"]["pass"] == 16
    (group,) = rep["systematic_pooled"]
    assert group["failing"] == [] and group["tested"] > 100


def _row(settings, sums, margins=(0.002, 0.002)):
    return {"id": str(settings), "index": settings.get("seed", 0), "settings": settings,
            "systematic": {"unit": 2.0 ** -8,
                           "points": {"p": {"margins": list(margins), "sums": sums}}}}


def test_only_cases_that_differ_in_their_schedule_pool():
    c = [[1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 10.0]] * 4
    rows = [_row({"seed": 0, "weights": "dense"}, c), _row({"seed": 1, "weights": "dense"}, c),
            _row({"seed": 2, "weights": "cq"}, c)]
    groups = pool(rows)
    assert [g["cases"] for g in groups] == [["{'seed': 0, 'weights': 'dense'}",
                                             "{'seed': 1, 'weights': 'dense'}"]]
    assert groups[0]["settings"] == {"weights": "dense"}            # the lone cq case: no pool


@pytest.mark.parametrize("field, why", [
    ({"unit": 0.1}, "an object {unit, points}"),
    ({"unit": float("nan"), "points": {}}, "unit must be"),
    ({"unit": 0.01, "points": {"p": {"margins": [-1, 0], "sums": []}}}, "margins must be"),
    ({"unit": 0.01, "points": {"p": {"margins": [0, 0], "sums": [[0.0] * 7]}}}, "sums must be"),
    ({"unit": 0.01, "points": {"p": {"margins": [0, 0], "sums": [[float("inf")] * 8]}}},
     "sums must be"),
    ({"unit": 0.01, "points": {"p": {"margins": [0, 0],
                                     "sums": [[0.0] * 8] * (CASE_CLUSTERS + 1)}}}, "sums must be"),
    ({"unit": 0.01, "points": {"p": {"margins": [0, 0], "sums": [[True] + [0.0] * 7]}}},
     "sums must be"),
])
def test_a_malformed_systematic_field_is_named(field, why):
    assert why in check_field(field)


def test_a_result_row_with_a_tampered_field_is_refused(tmp_path):
    from ladder.sweep.row import check_row, empty_row
    from ladder.sweep.grid import Case
    row = empty_row(Case(0, "c0000-00000000", {"seed": 0}), "python -m ladder run")
    check_row(row, "r.json")                                        # null: no statistics
    row["systematic"] = {"unit": 0.01, "points": {"L00.x": {"margins": [0, 0],
                                                            "sums": [["x"] * 8]}}}
    with pytest.raises(SweepError, match=r"r.json: field 'systematic' is malformed: "
                                         r"points.L00.x.sums must be"):
        check_row(row, "r.json")
