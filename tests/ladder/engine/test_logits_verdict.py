"""The logits verdict (compare_logits): each branch (argmax, near-tie margin, top-k, KL)
decides alone, against values worked by hand.
"""
import pytest
import torch
from ladder.engine.compare import compare_ladders, compare_logits
from ladder.engine.rules import LogitsRule, Rule, RuleSet
from ladder.engine.trace import Ladder, schedule
# ---------------------------------------------------------------- the registry's shape check
# ---------------------------------------------------------------- fixture bounds, edge and past


# ---------------------------------------------------------------- logits verdict branches
V = torch.linspace(0, 1, 10, dtype=torch.float64)          # max|b| = 1: allowance = rtol


def _rs(tie=2.0, topk=5):
    return RuleSet(rules={"port/*": Rule(1e-3)}, logits=LogitsRule(topk=topk, tie_factor=tie))


def test_logits_argmax_branch_decides_alone():
    b = V.clone()
    b[8] = 1.0 - 1e-4                                  # runner-up 0.1 allowance below the top
    a = b.clone()
    a[8], a[9] = b[9], b[8]
    near = compare_logits("s", 0, a, b, Rule(1e-3), _rs(2.0))
    assert near.passed and near.near_tie and near.topk_agree and near.kl <= near.kl_bound
    far = compare_logits("s", 0, a, b, Rule(1e-3), _rs(0.0))
    assert not far.passed and not far.near_tie and far.topk_agree and far.kl <= far.kl_bound


def test_logits_near_tie_margin_by_hand():
    # margin: tie_factor/2 * (allow_a + allow_b) = tie_factor * 1e-3 for a maxabs rule
    for gap, tie in ((1.9e-3, True), (2.1e-3, False)):
        b = V.clone()
        b[8] = 1.0 - gap
        a = b.clone()
        a[8], a[9] = b[9], b[8]
        assert compare_logits("s", 0, a, b, Rule(1e-3), _rs()).near_tie is tie
    # elementwise: each id's allowance is its own |b| (about 1e-3 here), not max|b| = 10
    e, m = Rule(1e-3, scale="elementwise"), Rule(1e-3)
    for gap, tie_e, tie_m in ((1.5e-3, True, True), (5e-3, False, True)):
        b = torch.tensor([-10.0, 1.0 - gap, 1.0], dtype=torch.float64)
        a = torch.tensor([-10.0, 1.0, 1.0 - gap], dtype=torch.float64)
        for rule, tie in ((e, tie_e), (m, tie_m)):
            rs = RuleSet(rules={"port/*": rule}, logits=LogitsRule(topk=1))
            assert compare_logits("s", 0, a, b, rule, rs).near_tie is tie, (gap, rule)


def test_logits_topk_branch_decides_alone():
    b = torch.tensor([9.0, 8, 7, 6, 5, 5 - 1e-4, 1, 0, 0, 0], dtype=torch.float64) / 9
    a = b.clone()
    a[4], a[5] = b[5], b[4]                            # 5th and 6th swap, argmax stays
    ok = compare_logits("s", 0, a, b, Rule(1e-3), _rs(2.0))
    assert ok.passed and ok.argmax_agree and ok.topk_agree
    bad = compare_logits("s", 0, a, b, Rule(1e-3), _rs(0.0))
    assert not bad.passed and bad.argmax_agree and not bad.topk_agree \
        and bad.kl <= bad.kl_bound
    # top-k of a vocabulary smaller than k: k is the vocabulary
    assert compare_logits("s", 0, b[:3], b[:3], Rule(1e-3), _rs(0.0, topk=5)).passed


def test_logits_kl_branch_decides_alone_and_its_bound_by_hand():
    b = V.clone() * 4
    a = b * 1.5                                        # same order, sharper distribution
    r = compare_logits("s", 0, a, b, Rule(1e-3), _rs())
    assert r.argmax_agree and r.topk_agree and not r.passed
    lp, lq = torch.log_softmax(b, -1), torch.log_softmax(a, -1)
    assert r.kl == pytest.approx(float((lp.exp() * (lp - lq)).sum()), rel=1e-12)
    assert r.kl_bound == pytest.approx((1e-3 * 4) ** 2 / 2, rel=1e-12)
    loose = compare_logits("s", 0, a, b, Rule(1.0), _rs())
    assert loose.passed and loose.kl_bound == pytest.approx(8.0, rel=1e-12)
    # NaN logits fail without an exception
    a[3] = float("nan")
    assert not compare_logits("s", 0, a, b, Rule(1.0), _rs()).passed


def test_a_logits_verdict_fails_a_row_its_rule_passes():
    """compare_ladders: a p99 logits rule passes the row, the argmax check fails it."""
    steps = schedule([1, 2], 1)
    b = torch.linspace(0, 1, 201)          # two ids of 201 swap: the 0.99 quantile is 0
    b[199] = 1.0 - 5e-2
    a = b.clone()
    a[199], a[200] = b[200], b[199]
    vals = lambda x: {f"{s.name}/logits": x[None].clone() for s in steps}
    rs = RuleSet(rules={"port/*": Rule(1e-3, stat="p99")}, logits=LogitsRule(tie_factor=0.0))
    assert Rule(1e-3, stat="p99").check(a[None], b[None])
    cmp = compare_ladders(Ladder(steps, vals(a), "port"), Ladder(steps, vals(b), "ref"), rs)
    row = cmp.row("prefill", "logits")
    assert not row.passed and "argmax/top-k/KL" in row.note and row.first_bad_pos == 0
