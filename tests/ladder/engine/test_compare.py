import math

import pytest
import torch
from hypothesis import given, strategies as st

from ladder.engine.compare import (CompareError, compare_ladders, compare_logits, compare_point,
                                   first_bit_difference, metrics)
from ladder.engine.rules import Rule, RuleSet
from ladder.engine.trace import Ladder, schedule

RS = RuleSet(rules={"t/*": Rule(0.1)})


def _ladder(values: dict, tokens=(1, 2, 3), prompt=2, label="x") -> Ladder:
    steps = schedule(list(tokens), prompt)
    return Ladder(steps, {k: v.clone() for k, v in values.items()}, label)


def _pair():
    """Two equal ladders: prefill (2 positions) and decode00, points embed, L00.x, logits."""
    g = torch.Generator().manual_seed(0)
    vals = {}
    for step, S in (("prefill", 2), ("decode00", 1)):
        vals[f"{step}/embed"] = torch.randn(S, 6, generator=g)
        vals[f"{step}/L00.x"] = torch.randn(S, 2, 6, generator=g)
        vals[f"{step}/logits"] = torch.randn(S, 10, generator=g)
    return _ladder(vals, label="port"), _ladder(vals, label="ref")


def test_metrics_of_known_differences():
    b = torch.linspace(-1, 1, 101)[None]
    a = b.clone()
    a[0, 10] = torch.nextafter(b[0, 10], torch.tensor(2.0))
    m = metrics(a, b, 1e-3)
    assert m["ulp"] == 1 and m["max_abs"] == float((a - b).abs().max()) > 0
    a[0, 20] += 0.5
    r = compare_point("prefill", "L00.x", a, b, "t/*", Rule(0.1), 1e-3, pos0=4)
    assert not r.passed and r.first_bad_pos == 4 and r.mismatch == 1 / 101
    assert math.isclose(r.error, float((a - b).abs().max()) / 0.1, rel_tol=1e-12)
    assert metrics(b, b, 1e-3)["sqnr_db"] == math.inf
    assert math.isclose(metrics(2 * b, b, 1e-3)["sqnr_db"], 0.0, abs_tol=1e-12)
    x, y = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    assert metrics(x, y, 1e-3)["cosine"] == 0.0 and metrics(y, y, 1e-3)["cosine"] == 1.0


def test_relative_error_uses_the_floored_denominator():
    b = torch.tensor([[0.0, 1.0]])
    a = torch.tensor([[1e-3, 1.0]])
    assert math.isclose(metrics(a, b, 1e-3)["max_rel"], 1.0, rel_tol=1e-6)   # not 1e-3 / 0
    assert math.isclose(metrics(a, b, 1e-2)["max_rel"], 0.1, rel_tol=1e-6)


def test_each_position_is_judged_with_its_own_scale():
    b = torch.stack([torch.full((4,), 100.0), torch.ones(4)])     # two positions
    a = b.clone()
    a[1, 0] += 0.01                                              # 1% of position 1's size
    rule = Rule(1e-3)
    assert rule.check(a, b)                    # scaled by the whole tensor it would pass
    r = compare_point("prefill", "embed", a, b, "t/*", rule, 1e-3, pos0=7)
    assert not r.passed and r.first_bad_pos == 8 and r.worst_pos == 8


def test_nan_and_inf_are_failing_points_not_exceptions():
    a, b = _pair()
    a.values["prefill/L00.x"][1, 0, 3] = float("nan")
    a.values["decode00/embed"][0, 2] = float("inf")
    cmp = compare_ladders(a, b, RuleSet(rules={"port/*": Rule(1e-5)}))
    bad = {r.key: r for r in cmp.failures}
    assert set(bad) == {"prefill/L00.x", "decode00/embed"}
    assert bad["prefill/L00.x"].nan_a == 1 and bad["prefill/L00.x"].first_bad_pos == 1
    assert bad["decode00/embed"].inf_a == 1 and "NaN/Inf" in bad["decode00/embed"].note
    assert cmp.first.key == "prefill/L00.x" and not cmp.passed


def test_missing_extra_and_reshaped_points_fail_in_ladder_order():
    a, b = _pair()
    del a.values["prefill/embed"]
    a.values = {**{k: v for k, v in a.values.items() if k.startswith("prefill")},
                "decode00/embed": a.values["decode00/embed"],
                "decode00/L00.extra": torch.zeros(1, 3),
                "decode00/L00.x": a.values["decode00/L00.x"][:, :1],
                "decode00/logits": a.values["decode00/logits"]}
    cmp = compare_ladders(a, b, RuleSet(rules={"port/*": Rule(1e-5)}))
    assert [r.point for r in cmp.rows if r.step == "decode00"] == \
        ["embed", "L00.extra", "L00.x", "logits"]
    notes = {r.key: r.note for r in cmp.failures}
    assert set(notes) == {"prefill/embed", "decode00/L00.extra", "decode00/L00.x"}
    assert "not traced by port" in notes["prefill/embed"]
    assert "not traced by ref" in notes["decode00/L00.extra"]
    assert "shape [1, 1, 6] vs reference [1, 2, 6]" in notes["decode00/L00.x"]


def test_ladders_of_different_schedules_are_refused():
    a, _ = _pair()
    b = _ladder(dict(a.values), tokens=(1, 2, 4))
    with pytest.raises(CompareError, match="different token schedules"):
        compare_ladders(a, b)


def test_logits_argmax_near_tie():
    b = torch.linspace(0, 1, 10, dtype=torch.float64)   # max|b| = 1: allowance = rtol
    rule, rs = Rule(1e-3), RuleSet(rules={"port/*": Rule(1e-3)})
    for gap, tie in ((1.5e-3, True), (3e-3, False)):
        bb = b.clone()
        bb[8] = 1.0 - gap                               # runner-up `gap` below the top
        a = bb.clone()
        a[8], a[9] = bb[9], bb[8]                        # the port swaps them
        r = compare_logits("s", 0, a, bb, rule, rs)
        assert not r.argmax_agree and r.near_tie is tie
        assert r.topk_agree                              # both ids stay in the top 5


def test_logits_topk_boundary():
    b = torch.tensor([9.0, 8, 7, 6, 5, 4.99, 1, 0, 0, 0]) / 9   # 5th and 6th nearly tied
    a = b.clone()
    a[4], a[5] = b[5], b[4]
    rs = RuleSet(rules={"port/*": Rule(1e-3)})
    assert compare_logits("s", 0, a, b, Rule(1e-3), rs).topk_agree
    a[6] = 0.9                                          # rank 7 jumps far into the top 5
    assert not compare_logits("s", 0, a, b, Rule(1e-3), rs).topk_agree


@given(st.integers(0, 2**31 - 1), st.floats(1e-6, 1e-2))
def test_kl_stays_under_the_hoeffding_bound_whenever_logits_pass(seed, rtol):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(64, generator=g, dtype=torch.float64) * 5
    allow = rtol * float(b.abs().max())
    a = b + (2 * torch.rand(64, generator=g, dtype=torch.float64) - 1) * allow
    r = compare_logits("s", 0, a, b, Rule(rtol), RuleSet(rules={"*": Rule(rtol)}))
    assert r.kl <= r.kl_bound
    shifted = compare_logits("s", 0, b + 3.0, b, Rule(rtol), RuleSet(rules={"*": Rule(rtol)}))
    assert shifted.kl < 1e-12                            # softmax ignores a constant shift


def test_first_bit_difference_names_step_point_and_position():
    a, b = _pair()
    assert first_bit_difference(a, b) is None
    a.values["prefill/L00.x"][1, 1, 0] = torch.nextafter(a.values["prefill/L00.x"][1, 1, 0],
                                                         torch.tensor(9.0))
    assert first_bit_difference(a, b) == ("prefill", "L00.x", 1)


def test_results_print_what_failed():
    a, b = _pair()
    a.values["decode00/logits"][0, 0] += 1.0
    cmp = compare_ladders(a, b, RuleSet(rules={"port/*": Rule(1e-5)}))
    text = str(cmp)
    assert "1 failing (DIVERGENCE)" in text and "first divergence: decode00/logits" in text
    assert "FAIL" in str(cmp.first) and "first failing position 2" in str(cmp.first)
    assert str(compare_ladders(b, b, RuleSet(rules={"port/*": Rule(1e-5)}))).count("PASS") == 1


def test_a_zero_reference_slice_reads_a_finite_error_and_is_the_worst():
    """Engram keys at position 0 are exact zeros in the reference: the default rules' floor
    keeps the allowance finite, so the error is v / ZERO_FLOOR, never `inf`, and the `worst:`
    line names the same row as the first divergence."""
    from ladder.engine.rules import DEFAULT_RULES, ZERO_FLOOR
    a, b = _pair()
    b.values["prefill/embed"][0].zero_()
    a.values["prefill/embed"][0].zero_()
    assert compare_ladders(a, b, DEFAULT_RULES).passed          # exact zeros both sides
    a.values["prefill/embed"][0, 3] = 1e-3
    a.values["prefill/L00.x"][0, 0, 0] += 1e-2 * float(b.values["prefill/L00.x"][0].abs().max())
    cmp = compare_ladders(a, b, DEFAULT_RULES)
    r = cmp.row("prefill", "embed")
    assert not r.passed and math.isclose(r.error, 1e-3 / ZERO_FLOOR, rel_tol=1e-6)
    assert cmp.first.key == cmp.worst().key == "prefill/embed"
    assert cmp.worst().error >= cmp.row("prefill", "L00.x").error > 1
    assert "inf" not in str(cmp).replace("info", "")
    from ladder.engine.table import summary, to_text
    assert "inf" not in to_text(summary(cmp.to_frame()))


def test_worst_is_never_below_the_first_divergence():
    a, b = _pair()
    a.values["prefill/embed"][1, 0] = float("nan")               # unbounded, earliest
    a.values["decode00/L00.x"][0, 0, 0] += 100.0                 # huge but finite, later
    cmp = compare_ladders(a, b, RuleSet(rules={"port/*": Rule(1e-5)}))
    assert cmp.first.key == cmp.worst().key == "prefill/embed"
    assert "err unbounded of allowance" in str(cmp) and " inf " not in str(cmp)


def test_a_failing_row_shows_its_first_failing_positions_error():
    """The first-divergence row prints the error at its first failing position (the position
    `locate` re-runs), and the step's worst separately."""
    b = torch.ones(3, 4)
    a = b.clone()
    a[1, 0] += 0.2                            # first failing position: pos0 + 1, err 2
    a[2, 0] += 0.5                            # worst: pos0 + 2, err 5
    r = compare_point("prefill", "L00.x", a, b, "t/*", Rule(0.1), 1e-3, pos0=10)
    assert r.first_bad_pos == 11 and r.worst_pos == 12
    assert math.isclose(r.first_bad_error, 2.0, rel_tol=1e-6) and math.isclose(r.error, 5.0,
                                                                                rel_tol=1e-6)
    assert r.error_at(10) == 0.0 and math.isclose(r.error_at(11), 2.0, rel_tol=1e-6)
    text = str(r)
    assert "err         2 of allowance" in text
    assert "first failing position 11 (worst 5 at position 12)" in text


def test_an_argmax_flip_fails_logits_even_under_a_p99_rule():
    """A p99 rule lets one flipped id through the value check; the argmax/top-k check must
    still fail the logits row."""
    g = torch.Generator().manual_seed(3)
    vals = {}
    for step, S in (("prefill", 2), ("decode00", 1)):
        vals[f"{step}/logits"] = torch.randn(S, 400, generator=g)
    a, b = _ladder(vals, label="port"), _ladder(vals, label="ref")
    lg = a.values["decode00/logits"][0]
    top = int(lg.argmax())
    lg[top] = lg.min() - 1.0                    # the reference's argmax sinks to the bottom
    rs = RuleSet(rules={"port/*": Rule(1e-5, stat="p99")})
    assert rs.rules["port/*"].position_errors(a.values["decode00/logits"],
                                              b.values["decode00/logits"])[0] <= 1.0
    cmp = compare_ladders(a, b, rs)
    row = cmp.row("decode00", "logits")
    assert not row.passed and "argmax/top-k/KL check failed at position 2" in row.note
    assert row.first_bad_pos == 2 and cmp.row("prefill", "logits").passed
