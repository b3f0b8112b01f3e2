"""Issue 24 §2, kind 1: the harness's own numbers and decisions, each against a value worked
out by hand on a tiny input (so a wrong formula, not only a wrong direction, fails a test).

Every rule here is constructed in the test as a *probe* of the formula (rtol 0.1 and so on):
no project tolerance is restated or loosened; those live in ladder/engine/rules.py.
"""
import math

import pytest
import torch

from ladder.engine.compare import compare_ladders, compare_logits, compare_point, metrics
from ladder.engine.locate import locate
from ladder.engine.rules import LogitsRule, Rule, RuleSet
from ladder.engine.trace import Ladder, schedule

# b and a, all exact binary fractions: d = |a - b| = [0.5, 0, 2^-7, 1], |b| = [1, 2, 0, 4]
B = torch.tensor([[1.0, -2.0, 0.0, 4.0]])
A = torch.tensor([[1.5, -2.0, 2.0 ** -7, 3.0]])


def _bits(x: float) -> int:
    import struct
    return struct.unpack("<i", struct.pack("<f", x))[0]


def test_max_abs_max_rel_and_its_floor_by_hand():
    m = metrics(A, B, 1e-3)
    assert m["max_abs"] == 1.0
    # denominators max(|b|, 1e-3 * max|b| = 4e-3): [1, 2, 4e-3, 4] -> the zero element rules
    assert m["max_rel"] == pytest.approx(2.0 ** -7 / 4e-3, rel=1e-12)
    # a floor of 0.5 * max|b| = 2 lifts the first and third denominators to 2
    assert metrics(A, B, 0.5)["max_rel"] == pytest.approx(0.25, rel=1e-12)
    # the floor is max(|b|, floor), not |b| + floor: an element above the floor keeps |b|
    assert metrics(A, B, 0.1)["max_rel"] == pytest.approx(0.5, rel=1e-12)


def test_ulp_by_hand_in_float32_float64_and_across_zero():
    m = metrics(A, B, 1e-3)
    # the worst is 0 -> 2^-7: its float32 bit pattern counts every ULP above zero
    assert m["ulp"] == _bits(2.0 ** -7) == 120 << 23
    # the smallest normal either side of zero (the suite flushes subnormals): its bit
    # pattern 1 << 23 counted on each side, not 2^31 apart
    tiny = torch.tensor([[2.0 ** -126]])
    assert metrics(tiny, -tiny, 1e-3)["ulp"] == 2 << 23
    assert metrics(-tiny, tiny, 1e-3)["ulp"] == 2 << 23
    # float64 pairs count float64 ULPs
    x = torch.tensor([[1.0]], dtype=torch.float64)
    y = torch.nextafter(x, torch.tensor(2.0, dtype=torch.float64))
    assert metrics(y, x, 1e-3)["ulp"] == 1
    seven = torch.from_numpy(x.numpy().view("int64") + 7).view(torch.float64)
    assert metrics(seven, x, 1e-3)["ulp"] == 7 and metrics(x, seven, 1e-3)["ulp"] == 7
    small = torch.tensor([[2.0 ** -1022]], dtype=torch.float64)      # bits 1 << 52
    assert metrics(small, -small, 1e-3)["ulp"] == 2.0 ** 53
    # one float64 side: compared in float32 (1 + 2^-52 rounds to 1)
    assert metrics(y, x.float(), 1e-3)["ulp"] == 0


def test_cosine_and_sqnr_by_hand():
    m = metrics(A, B, 1e-3)
    dot = 1.5 + 4.0 + 12.0
    na2, nb2 = 1.5 ** 2 + 4.0 + 2.0 ** -14 + 9.0, 21.0
    assert m["cosine"] == pytest.approx(dot / math.sqrt(na2 * nb2), rel=1e-12)
    noise = 0.25 + 2.0 ** -14 + 1.0
    assert m["sqnr_db"] == pytest.approx(10 * math.log10(nb2 / noise), rel=1e-12)
    # zero signal with noise: -inf dB; anti-parallel: cosine -1
    z = torch.zeros(1, 4)
    assert metrics(B, z, 1e-3)["sqnr_db"] == -math.inf
    assert metrics(-B, B, 1e-3)["cosine"] == pytest.approx(-1.0, abs=1e-15)


def test_nan_inf_counts_each_way_and_finite_part_statistics():
    a = torch.tensor([[float("nan"), float("inf"), -float("inf"), 1.0, 5.0]])
    b = torch.tensor([[0.0, 1.0, 2.0, float("-inf"), 3.0]])
    m = metrics(a, b, 1e-3)
    assert (m["nan_a"], m["nan_b"], m["inf_a"], m["inf_b"]) == (1, 0, 2, 1)
    assert m["max_abs"] == 2.0                     # only 5 vs 3 is finite on both sides
    assert math.isnan(m["cosine"]) and math.isnan(m["sqnr_db"])
    r = compare_point("s", "L00.x", a, b, "t/*", Rule(1e3), 1e-3)
    assert not r.passed and r.error == math.inf and (r.nan_a, r.inf_a, r.inf_b) == (1, 2, 1)


def test_rule_error_mismatch_and_allowance_maxabs_by_hand():
    # allowance 0.1 * max|b| = 0.4: ratios [1.25, 0, 2^-7/0.4, 2.5]
    r = compare_point("s", "L00.x", A, B, "t/*", Rule(0.1), 1e-3)
    assert r.error == pytest.approx(2.5, rel=1e-12) and r.mismatch == 0.5 and not r.passed
    assert Rule(0.1).error(A, B) == pytest.approx(2.5, rel=1e-12)
    # atol adds to the allowance: 0.1 + 0.1 * 4 = 0.5 -> 1 / 0.5
    assert Rule(0.1, atol=0.1).error(A, B) == pytest.approx(2.0, rel=1e-12)
    # exactly at the allowance passes (<= 1), just past it fails
    assert Rule(0.25).check(A, B) and not Rule(0.2499).check(A, B)
    at = compare_point("s", "L00.x", A, B, "t/*", Rule(0.25), 1e-3)   # ratios [.5, 0, ~0, 1]
    assert at.passed and at.error == 1.0 and at.mismatch == 0.0


def test_rule_error_elementwise_and_the_floor_by_hand():
    # allowance per element 0.01 + 0.1 |b| = [0.11, 0.21, 0.01, 0.41]
    rule = Rule(0.1, atol=0.01, scale="elementwise")
    assert rule.error(A, B) == pytest.approx(0.5 / 0.11, rel=1e-12)
    errs = rule.position_errors(A, B)
    assert errs == pytest.approx([0.5 / 0.11], rel=1e-12)
    r = compare_point("s", "L00.x", A, B, "t/*", rule, 1e-3)
    assert r.mismatch == 0.5                       # elements 0 (4.5) and 3 (2.44) fail
    # no atol: the zero element has no allowance; the floor gives it 0.02
    bare = Rule(0.2, scale="elementwise")
    assert bare.error(A, B) == math.inf
    floored = Rule(0.2, scale="elementwise", floor=0.02)
    # ratios [0.5/0.2, 0, 2^-7/0.02, 1/0.8]
    assert floored.error(A, B) == pytest.approx(2.5, rel=1e-12)
    assert floored.ratios(A, B)[0, 2] == pytest.approx(2.0 ** -7 / 0.02, rel=1e-12)
    # maxabs: the floor decides an all-zero reference slice only
    z = torch.zeros(1, 3)
    assert Rule(0.1, floor=1e-3).error(z + 2.0 ** -11, z) == \
        pytest.approx(2.0 ** -11 / 1e-3, rel=1e-12)
    assert Rule(0.1, floor=1e-3).position_errors(z + 2.0 ** -11, z) == \
        pytest.approx([2.0 ** -11 / 1e-3], rel=1e-12)
    assert Rule(0.1).allowance(1.0) == 0.1 and Rule(0.1, floor=0.5).allowance(1.0) == 0.5


def test_p99_statistic_by_hand():
    b = torch.ones(1, 101)
    a = b.clone()
    a[0, 3] += 0.5           # ratio 4 (allowance 0.125)
    a[0, 50] += 0.25         # ratio 2
    rule = Rule(0.125, stat="p99")
    # sorted ratios: 99 zeros, 2, 4; torch's 0.99 quantile of 101 values is element 99
    assert rule.error(a, b) == 2.0
    assert rule.position_errors(a, b) == [2.0]
    a[0, 50] = 1.0
    assert rule.error(a, b) == 0.0 and rule.check(a, b)     # one bad element in 101 passes
    assert not Rule(0.125).check(a, b)                        # under "max" it fails


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


# ---------------------------------------------------------------- locate's printed findings
ORDER = ["embed", "L00.hpre", "L00.u", "L00.nx", "L00.h_in", "L00.q", "L00.k", "L00.bx",
         "L00.y", "L00.x", "L01.hpre", "L01.y", "L01.x", "logits"]


def _ladders(bad: dict):
    """prefill of 2 positions + decode00; `bad`: {(step, point): {row: delta}}."""
    steps = schedule([1, 2, 3], 2)
    ref, port = {}, {}
    for st in steps:
        for p in ORDER:
            v = torch.ones(len(st.tokens), 4)
            ref[f"{st.name}/{p}"] = v
            w = v.clone()
            for j, delta in bad.get((st.name, p), {}).items():
                w[j, 0] += delta
            port[f"{st.name}/{p}"] = w
    return Ladder(steps, port, "port"), Ladder(steps, ref, "ref")


def test_locate_prints_the_coarse_ladder_and_the_bisection_in_order():
    rule = Rule(0.1)              # allowance 0.1: a delta d reads d / 0.1
    port, ref = _ladders({("decode00", "L00.q"): {0: 0.3},
                          ("decode00", "L00.y"): {0: 0.5},
                          ("decode00", "L00.hpre"): {0: 0.05},
                          ("decode00", "L01.y"): {0: 0.9}})
    cmp = compare_ladders(port, ref, RuleSet(rules={"port/*": rule}))
    loc = locate(cmp)
    text = str(loc)
    assert (loc.step, loc.point, loc.position, loc.layer) == ("decode00", "L00.q", 2, 0)
    assert loc.coarse.key == "decode00/L00.y"
    assert "coarse ladder first fails at decode00/L00.y (err 5 of allowance at position 2)" \
        in text, text
    assert [r.point for r in loc.bisection] == ["L00.hpre", "L00.u", "L00.nx", "L00.h_in",
                                                "L00.q"]
    lines = [ln.split() for ln in text.splitlines() if ln.startswith("    ")]
    assert [ln[:3] for ln in lines] == [["hpre", "pass", "err"], ["u", "pass", "err"],
                                        ["nx", "pass", "err"], ["h_in", "pass", "err"],
                                        ["q", "FAIL", "err"]]
    assert lines[0][3] == "0.5" and lines[4][3:] == ["3", "<-", "first", "failing"]
    assert "inside L00 at decode00" in text
    assert loc.verdict.startswith("no injection")


def test_locate_bisection_reads_the_failing_position_not_the_worst():
    # prefill: hpre is worse at position 0 (0.9) than at 1 (0.2); nx fails at position 1
    port, ref = _ladders({("prefill", "L00.hpre"): {0: 0.09, 1: 0.02},
                          ("prefill", "L00.nx"): {1: 0.4}})
    loc = locate(compare_ladders(port, ref, RuleSet(rules={"port/*": Rule(0.1)})))
    assert (loc.point, loc.position) == ("L00.nx", 1)
    text = str(loc)
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.startswith("    ")}
    assert rows["hpre"][3] == "0.2" and rows["nx"][1] == "FAIL"
    assert "coarse ladder" not in text                  # no coarse point fails
    assert "first failing position 1" in text


def test_locate_prints_the_coarse_points_first_failing_position_not_its_worst():
    port, ref = _ladders({("prefill", "L00.q"): {0: 0.3},
                          ("prefill", "L00.y"): {0: 0.2, 1: 0.5}})
    text = str(locate(compare_ladders(port, ref, RuleSet(rules={"port/*": Rule(0.1)}))))
    assert "coarse ladder first fails at prefill/L00.y (err 2 of allowance at position 0)" \
        in text, text


def test_locate_when_the_first_divergence_is_coarse_or_outside_the_layers():
    port, ref = _ladders({("prefill", "L00.u"): {0: 1.0}})
    loc = locate(compare_ladders(port, ref, RuleSet(rules={"port/*": Rule(0.1)})))
    assert loc.point == "L00.u" and loc.coarse.key == loc.first.key
    assert "coarse ladder" not in str(loc)
    assert [r.point for r in loc.bisection] == ["L00.hpre", "L00.u"]
    for point, says in (("embed", "embedding / Engram path"), ("logits", "output head")):
        port, ref = _ladders({("decode00", point): {0: 1.0}})
        loc = locate(compare_ladders(port, ref, RuleSet(rules={"port/*": Rule(0.1)})))
        assert loc.point == point and loc.bisection == [] and says in loc.verdict
    port, ref = _ladders({})
    assert locate(compare_ladders(port, ref, RuleSet(rules={"port/*": Rule(0.1)}))) is None


# ---------------------------------------------------------------- the registry's shape check
from ladder.sides import fixtures                                       # noqa: E402
from ladder.model.names import TraceError                               # noqa: E402
from ladder.model.points import check_ladder, expected                  # noqa: E402


@pytest.fixture(scope="module")
def registry_ladder(tiny_cfg):
    """A ladder holding exactly the registry's points (zeros), prefill of 2 + one decode."""
    steps = schedule([1, 2, 3], 2)
    vals = {f"{st.name}/{n}": torch.zeros(len(st.tokens), *shape)
            for st in steps for n, shape in expected(tiny_cfg)}
    return steps, vals


def _check(tiny_cfg, registry_ladder, edit):
    steps, vals = registry_ladder
    vals = dict(vals)
    edit(vals)
    check_ladder(Ladder(steps, vals, "probe"), tiny_cfg)


def test_check_ladder_passes_the_registry_itself(tiny_cfg, registry_ladder):
    _check(tiny_cfg, registry_ladder, lambda v: None)


def test_check_ladder_refuses_a_wrong_positions_axis(tiny_cfg, registry_ladder):
    def edit(v):
        v["prefill/L00.q"] = torch.zeros(1, *v["prefill/L00.q"].shape[1:])
    with pytest.raises(TraceError, match=r"prefill/L00.q: shape \[1, .*registry says \[2, "):
        _check(tiny_cfg, registry_ladder, edit)


def test_check_ladder_refuses_each_trailing_dim(tiny_cfg, registry_ladder):
    """Every trailing axis of every multi-axis point, one larger, is refused by name."""
    n = 0
    for name, shape in expected(tiny_cfg):
        for ax in range(len(shape)):
            def edit(v, ax=ax, name=name, shape=shape):
                bad = list(shape)
                bad[ax] += 1
                v[f"decode00/{name}"] = torch.zeros(1, *bad)
            with pytest.raises(TraceError, match=f"decode00/{name}: shape"):
                _check(tiny_cfg, registry_ladder, edit)
            n += 1
    assert n > len(expected(tiny_cfg))              # some points have two trailing axes


def test_check_ladder_refuses_missing_extra_and_reordered_points(tiny_cfg, registry_ladder):
    with pytest.raises(TraceError, match=r"missing \['L01.v'\]"):
        _check(tiny_cfg, registry_ladder, lambda v: v.pop("decode00/L01.v"))
    with pytest.raises(TraceError, match=r"not in it \['L01.extra'\]"):
        _check(tiny_cfg, registry_ladder,
               lambda v: v.update({"decode00/L01.extra": torch.zeros(1, 3)}))

    def swap(v):                              # q and k exchange places in the dict's order
        items = list(v.items())
        i = next(j for j, (k, _) in enumerate(items) if k == "prefill/L00.q")
        items[i], items[i + 1] = items[i + 1], items[i]
        assert items[i][0] == "prefill/L00.k"
        v.clear()
        v.update(items)
    with pytest.raises(TraceError, match="out of forward order"):
        _check(tiny_cfg, registry_ladder, swap)


# ---------------------------------------------------------------- fixture bounds, edge and past
from ladder_common import FIXTURE                                 # noqa: E402


def _fixture_copy(tmp_path, edit):
    import json
    import shutil
    stem = str(tmp_path / "fx")
    for ext in (".safetensors", ".json"):
        shutil.copyfile(FIXTURE + ext, stem + ext)
    m = json.load(open(stem + ".json"))
    edit(m)
    json.dump(m, open(stem + ".json", "w"))
    return stem


@pytest.mark.parametrize("field, edge, past, msg", [
    ("seed", 2 ** 63 - 1, 2 ** 63, "field seed="),     # torch.Generator.manual_seed's int64
    ("seed", 0, -1, "field seed=-1 outside"),
])
def test_manifest_seed_at_its_bounds(tmp_path, field, edge, past, msg):
    fixtures.read_manifest(_fixture_copy(tmp_path, lambda m: m.update({field: edge})) + ".json")
    with pytest.raises(fixtures.FixtureError, match=msg):
        fixtures.read_manifest(_fixture_copy(tmp_path, lambda m: m.update({field: past}))
                               + ".json")


def test_manifest_prompt_len_at_its_bounds(tmp_path):
    m = fixtures.read_manifest(_fixture_copy(
        tmp_path, lambda m: m["schedule"].update(prompt_len=1)) + ".json")
    assert m["schedule"]["prompt_len"] == 1
    with pytest.raises(fixtures.FixtureError, match="prompt_len=0 outside 1"):
        fixtures.read_manifest(_fixture_copy(
            tmp_path, lambda m: m["schedule"].update(prompt_len=0)) + ".json")


def test_fixture_length_and_window_at_max_seq_len(tmp_path):
    """schedule.tokens may hold max_seq_len positions and kv_window may equal max_seq_len;
    one more of either is refused by name."""
    n = len(fixtures.read_manifest(FIXTURE + ".json")["schedule"]["tokens"])
    fx = fixtures.load(_fixture_copy(tmp_path, lambda m: m["config"].update(max_seq_len=n)))
    assert fx.cfg.max_seq_len == n == len(fx.tokens)
    with pytest.raises(fixtures.FixtureError, match=f"holds {n} positions, more than "
                                                    f"max_seq_len={n - 1}"):
        fixtures.load(_fixture_copy(tmp_path, lambda m: m["config"].update(max_seq_len=n - 1)))
    msl = fixtures.read_manifest(FIXTURE + ".json")["config"]["max_seq_len"]
    fx = fixtures.load(_fixture_copy(tmp_path, lambda m: m["schedule"].update(kv_window=msl)))
    assert fx.window == msl
    with pytest.raises(fixtures.FixtureError, match=f"kv_window={msl + 1} exceeds"):
        fixtures.load(_fixture_copy(tmp_path,
                                    lambda m: m["schedule"].update(kv_window=msl + 1)))


def test_fixture_token_ids_at_the_vocabulary_edge(tmp_path):
    v = fixtures.read_manifest(FIXTURE + ".json")["config"]["vocab_size"]

    def tok(t):
        return lambda m: m["schedule"]["tokens"].__setitem__(0, t)
    # the largest id passes the bound and is caught by the tokens tensor's digest instead
    with pytest.raises(fixtures.FixtureError, match="tensor 'tokens' differs"):
        fixtures.load(_fixture_copy(tmp_path, tok(v - 1)))
    with pytest.raises(fixtures.FixtureError, match=f"id {v} outside 0..vocab_size-1"):
        fixtures.load(_fixture_copy(tmp_path, tok(v)))
    with pytest.raises(fixtures.FixtureError, match="id -1 outside"):
        fixtures.load(_fixture_copy(tmp_path, tok(-1)))


def test_locate_prints_the_injection_table_and_every_layers_split():
    """The injection part of the printout, from a Location built by hand: each point's
    propagated and local error, flagged own / inherited only where the chained run fails."""
    from ladder.engine.locate import Injected, Location
    port, ref = _ladders({("decode00", "L00.q"): {0: 0.3}})
    cmp = compare_ladders(port, ref, RuleSet(rules={"port/*": Rule(0.1)}))
    loc = Location(cmp.first, 2, cmp.first_coarse, [],
                   injection=[Injected("L00.nx", "port/*", 0.5, 0.25),
                              Injected("L00.q", "port/*", 3.0, 2.5),
                              Injected("L00.k", "port/*", 2.0, 1.0)],
                   layers=[Injected("L00.x", "port/*", 4.0, 0.5),
                           Injected("L01.x", "port/*", 0.125, 0.0625)],
                   verdict="by hand")
    lines = str(loc).splitlines()
    i = next(j for j, ln in enumerate(lines) if ln.startswith("  injection at position 2"))
    assert "L00 re-run on the reference's lanes, Engram and KV history" in lines[i]
    assert lines[i + 1].split() == ["point", "propagated", "local"]
    assert lines[i + 2].split() == ["nx", "0.5", "0.25"]                 # passes: no flag
    assert lines[i + 3].split() == ["q", "3", "2.5", "<-", "own"]
    assert lines[i + 4].split() == ["k", "2", "1", "<-", "inherited"]    # local 1.0: at bound
    assert lines[i + 5] == "  every layer's output x at position 2: propagated / local err " \
                           "of allowance"
    assert lines[i + 6].split() == ["L00", "4/0.5", "L01", "0.125/0.0625"]
    assert lines[-1] == "  verdict: by hand"
