"""The step batch (ladder/engine/batch.py) gives the rows the point-by-point path gives, bit for
bit: same metrics, rule errors per position, mismatch counts, verdicts; and the lazy archive's
numpy views hold the bytes its tensors hold."""
import dataclasses

import numpy as np
import pytest
import torch

from ladder.engine import compare as compare_mod
from ladder.engine.compare import compare_ladders
from ladder.engine.rules import DEFAULT_RULES, Rule, RuleSet
from ladder.engine.trace import Ladder, schedule


def _fields(cmp):
    """Every row and logits row as text (repr keeps NaN equal to NaN, -0.0 apart from 0.0)."""
    rows = [tuple((f.name, repr(getattr(r, f.name))) for f in dataclasses.fields(r))
            for r in cmp.rows]
    return rows, [repr(r) for r in cmp.logits], str(cmp), cmp.total_rows, cmp.fail_counts


def _per_point(monkeypatch, *args, **kw):
    """The comparison with the batch switched off: every point through compare_point."""
    with monkeypatch.context() as m:
        m.setattr(compare_mod, "batchable", lambda rule: False)
        return compare_ladders(*args, **kw)


def _values(g, S, shape, dtype, kind):
    b = torch.randn(S, *shape, generator=g, dtype=torch.float64)
    scale = torch.tensor(10.0, dtype=torch.float64) ** torch.randint(-30, 30, (S, *shape),
                                                                     generator=g)
    b = (b * scale if kind == "wide" else b).to(dtype)
    noise = torch.randn(S, *shape, generator=g, dtype=torch.float64) * 1e-6
    a = (b.double() * (1 + noise)).to(dtype)
    if kind == "fail":
        a = a + 0.5 * (torch.rand(S, *shape, generator=g) < 0.3).to(dtype)
    if kind == "signs":                  # pairs across zero: the ULP count's hard case
        a = torch.where(torch.rand(S, *shape, generator=g) < 0.5, -a, a)
    if kind == "zero_ref":
        b = torch.zeros_like(b)
    if kind == "equal":
        a = b.clone()
    if kind in ("nan", "inf") and a.numel():
        a.view(-1)[int(torch.randint(a.numel(), (1,), generator=g))] = \
            float("nan") if kind == "nan" else float("inf")
    return a, b


KINDS = ("near", "fail", "signs", "zero_ref", "equal", "nan", "inf", "wide")
SHAPES = ((8,), (2, 3), (0,), (5, 0), (1,), (3, 4, 2))


def _ladders(seed, dtype_b=None):
    """A ladder pair over prefill (3 positions) + 3 decode steps, with points of every kind,
    shape and dtype (float32, float64, one side of another dtype, bfloat16)."""
    g = torch.Generator().manual_seed(seed)
    steps = schedule([1, 2, 3, 4, 5, 6], 3)
    va, vb = {}, {}
    for st in steps:
        S = len(st.tokens)
        for i, kind in enumerate(KINDS):
            for j, shape in enumerate(SHAPES):
                for dt in (torch.float32, torch.float64):
                    a, b = _values(g, S, shape, dt, kind)
                    p = f"L{i:02d}.p{j}{'d' if dt == torch.float64 else 'f'}"
                    va[f"{st.name}/{p}"], vb[f"{st.name}/{p}"] = a, b
        a, b = _values(g, S, (4,), torch.float32, "near")
        va[f"{st.name}/mixed"], vb[f"{st.name}/mixed"] = a, b.double()
        va[f"{st.name}/half"], vb[f"{st.name}/half"] = a.bfloat16(), b.bfloat16()
        va[f"{st.name}/logits"], vb[f"{st.name}/logits"] = _values(g, S, (16,), torch.float32,
                                                                   "near")
    return Ladder(steps, va, "a"), Ladder(steps, vb, "b")


RULESETS = [
    RuleSet(rules={"t/L00*": Rule(1e-4, floor=1e-8), "t/L01*": Rule(1e-3, atol=1e-6),
                   "t/L02*": Rule(1e-5, scale="elementwise"), "t/L03*": Rule(1e-2, stat="p99"),
                   "t/L04*": Rule(0.0, exact=True), "t/L05*": Rule(0.0),
                   "t/*": Rule(1e-5, floor=1e-8)}),
    RuleSet(rules={"t/*": Rule(0.5, atol=1e-3)}),
]


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("rs", range(len(RULESETS)))
@pytest.mark.parametrize("keep", ["all", "summary"])
def test_the_batch_gives_the_per_point_rows(monkeypatch, seed, rs, keep):
    a, b = _ladders(seed)
    rules = RULESETS[rs]
    seen, real = [], compare_mod.measure
    with monkeypatch.context() as m:
        m.setattr(compare_mod, "measure", lambda pairs, *r: seen.append(len(pairs)) or
                  real(pairs, *r))
        got = compare_ladders(a, b, rules, prefix="t", keep=keep)
    assert sum(seen) > 100                     # most points went through the batch
    want = _per_point(monkeypatch, a, b, rules, prefix="t", keep=keep)
    assert _fields(got) == _fields(want)
    assert any(not r.passed for r in want.rows)       # the cases reach failing rows too


@pytest.mark.parametrize("chunk", [1, 7, 40])
def test_a_step_measured_in_chunks_gives_the_same_rows(monkeypatch, chunk):
    """The batch's memory is bounded by measuring a step in chunks of points (batch.CHUNK
    elements): however the points are cut, the rows are the per-point path's."""
    from ladder.engine import batch
    a, b = _ladders(4)
    want = _per_point(monkeypatch, a, b, RULESETS[0], prefix="t", keep="summary")
    monkeypatch.setattr(batch, "CHUNK", chunk)
    assert list(batch.chunks([3, 3, 50, 1, 1], 6)) == [(0, 2), (2, 3), (3, 5)]
    assert _fields(compare_ladders(a, b, RULESETS[0], prefix="t", keep="summary")) == \
        _fields(want)


def test_a_point_the_batch_cannot_take_is_measured_point_by_point(monkeypatch):
    """NaN/Inf, mixed and 16-bit dtypes, empty shapes, exact/p99/elementwise rules: still rows,
    the same as before, beside batched points in the same step."""
    a, b = _ladders(5)
    got = compare_ladders(a, b, RULESETS[0], prefix="t")
    nan = got.row("prefill", "L05.p0f")
    assert nan.nan_a == 1 and not nan.passed and "NaN/Inf" in nan.note
    assert "compared as float32" in got.row("decode00", "half").note
    assert _fields(got) == _fields(_per_point(monkeypatch, a, b, RULESETS[0], prefix="t"))


def test_the_lazy_archive_reads_the_same_rows_and_holds_one_step(monkeypatch, tmp_path):
    a, b = _ladders(3)
    paths = []
    for lad, name in ((a, "a"), (b, "b")):
        paths.append(lad.save(tmp_path / f"{name}.safetensors", producer={"name": name},
                              geometry={}, kv_window=0, weights={}, prompt_len=3))
    la, lb = (Ladder.load(p, lazy=True) for p in paths)
    for st in la.steps:
        arrays = la.values.step_arrays(st.name)
        for p in la.points(st.name):
            t = la[f"{st.name}/{p}"]
            if arrays[p] is None:                  # 16-bit: numpy holds no bfloat16
                assert t.dtype == torch.float32 and p == "half"
            else:
                assert np.array_equal(arrays[p], t.numpy(), equal_nan=True)
                assert arrays[p].dtype == t.numpy().dtype
        last = la.values.last_only().step_arrays(st.name)
        assert all(last[p] is None or last[p].shape[0] == 1 for p in last)
    for keep in ("all", "summary"):
        la, lb = (Ladder.load(p, lazy=True) for p in paths)
        got = compare_ladders(la, lb, RULESETS[0], prefix="t", keep=keep)
        # the archive reads bfloat16 back as float32: the reference is the archives compared
        # point by point
        ra, rb = (Ladder.load(p, lazy=True) for p in paths)
        want = _per_point(monkeypatch, ra, rb, RULESETS[0], prefix="t", keep=keep)
        assert _fields(got) == _fields(want)
        assert la.values.peak_held == ra.values.peak_held
        step_bytes = max(sum(la.values._infos[f"{st.name}/{p}"][3] -
                             la.values._infos[f"{st.name}/{p}"][2]
                             for p in la.points(st.name)) for st in la.steps)
        # one step's span at most (a writer that interleaves steps leaves gaps, read along)
        assert la.values.peak_held <= 2 * step_bytes


def test_the_default_rules_on_a_captured_pair_agree(monkeypatch):
    """The shipped rule table over the committed small fixture's style of ladder."""
    from tests.captures import clean_port_ladder, reference_ladder
    a, b = clean_port_ladder(), reference_ladder()
    for keep in ("all", "summary"):
        assert _fields(compare_ladders(a, b, DEFAULT_RULES, keep=keep)) == \
            _fields(_per_point(monkeypatch, a, b, DEFAULT_RULES, keep=keep))


def _floor(a, b, seed, dtype=torch.bfloat16):
    """A noise floor beside ladders a, b: the reference rounded to `dtype` and perturbed, with
    a NaN at one point, one point it lacks and one of another shape."""
    g = torch.Generator().manual_seed(100 + seed)
    vf = {}
    for st in b.steps:
        for p in b.points(st.name):
            key = f"{st.name}/{p}"
            v, dt = b[key].double(), b[key].dtype
            f = v * (1 + 1e-3 * torch.randn(v.shape, generator=g, dtype=torch.float64))
            if p == "L01.p0f":
                continue                                  # the floor lacks it
            if p == "L02.p1f":
                f = f[..., :1]                            # another shape
            if p == "L03.p2f" and st.name == "decode01" and f.numel():
                f.view(-1)[0] = float("nan")
            vf[key] = f.to(torch.float64 if dt == torch.float64 else dtype)
    return Ladder(list(b.steps), vf, "floor")


THREE_WAY = RuleSet(rules={"t/L01*": Rule(1e-4), "t/L02*": Rule(1e-4),
                           "t/L07*": Rule(1e-6, noise=4.0, floor=1e-9),
                           "t/*": Rule(0.0, noise=2.0, floor=1e-12)})


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("keep", ["all", "summary"])
@pytest.mark.parametrize("floor_dtype", [torch.bfloat16, torch.float32])
def test_three_way_rows_in_the_batch_are_the_per_point_rows(monkeypatch, seed, keep,
                                                             floor_dtype):
    """With a noise floor beside the reference: the floor's error, the noise ratio, the unit
    at each position (running over prefill's positions and across steps) and the verdicts
    the batch gives are compare_point's and three_way's, field for field."""
    from ladder.engine import three_way
    a, b = _ladders(seed)
    fl = _floor(a, b, seed, floor_dtype)
    calls, real = [], three_way.three_way
    with monkeypatch.context() as m:
        m.setattr(compare_mod, "three_way", lambda *x: calls.append(x[0].point) or real(*x))
        got = compare_ladders(a, b, THREE_WAY, prefix="t", keep=keep, floor=fl, unit_eps=1e-3)
    want = _per_point(monkeypatch, a, b, THREE_WAY, prefix="t", keep=keep, floor=fl,
                      unit_eps=1e-3)
    assert _fields(got) == _fields(want)
    three = [r for r in got.rows if r.units]
    assert len(three) > 50 and any(not r.passed for r in three)
    assert any(len(r.units) == 3 and r.units[0] < r.units[-1] for r in three)  # running max
    # what the batch left point by point: the logits, a point whose floor holds a NaN
    assert "logits" in calls and "L03.p2f" in calls
    # and took the rest: finite points of float32/float64 with rows to compare
    assert not {"L00.p0f", "L00.p5d", "L04.p4d", "L07.p1f", "half"} & set(calls)
    assert len(calls) < 0.6 * (got.total_rows if got.folded else len(got.rows))


def test_a_noise_rule_without_the_floor_still_names_the_point(monkeypatch):
    """A point the floor lacks under a noise-unit rule is an error whether or not the batch
    could have taken it."""
    a, b = _ladders(0)
    fl = _floor(a, b, 0)
    rules = RuleSet(rules={"t/*": Rule(0.0, noise=2.0, floor=1e-12)})
    with pytest.raises(compare_mod.CompareError, match="L01.p0f"):
        compare_ladders(a, b, rules, prefix="t", floor=fl)
