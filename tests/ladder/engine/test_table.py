"""The coarse tolerance table: failing fine points shown, the hidden ones counted and said
in words.
"""
from ladder.cli.main import main


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def test_coarse_table_shows_failing_fine_points_and_counts_what_it_hides():
    rc, text = run("run", "--plant", "rope_pos_plus_1", "--no-check-plain")
    assert rc == 1
    rows = [ln.split() for ln in text.splitlines() if ln.startswith(("L0", "embed", "logits"))]
    assert {r[0] for r in rows if r[-2] == "FAIL"} == {"L03.q", "L03.k"}, text
    assert "(coarse ladder, with 2 failing points off it: 54 of 130 points shown; the other 76 " \
           "pass; --fine shows every point, --per-step every step)" in text
    rc, text = run("run", "--plant", "rope_pos_plus_1", "--no-check-plain", "--per-step")
    assert sum(ln.split()[-1] == "FAIL" for ln in text.splitlines() if ln.startswith("L03.")) \
        == 26                       # every failing (step, point) row, though none is coarse
    assert "702 of 1690 rows shown; the other 988 pass; --fine shows every point)" in text
    rc, text = run("run", "--no-check-plain")
    assert rc == 0 and "(coarse ladder: 52 of 130 points shown; the other 78 pass" in text


def test_a_coarse_table_hiding_nothing_says_so_in_english():
    import argparse
    import torch
    from ladder.cli.show import print_table
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import DEFAULT_RULES
    from ladder.engine.trace import Ladder, schedule
    steps = schedule([1, 2, 3], 2)
    vals = {f"{s.name}/{p}": torch.ones(len(s.tokens), 4) for s in steps for p in ("L00.u", "L00.x")}
    cmp = compare_ladders(Ladder(steps, vals, "port"), Ladder(steps, vals, "reference"),
                          DEFAULT_RULES)
    lines = []
    print_table(cmp, argparse.Namespace(fine=False, per_step=False), lines.append)
    assert lines[-1] == "(coarse ladder: all 2 points shown)", lines
