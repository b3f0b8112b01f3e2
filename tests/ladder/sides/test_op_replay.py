"""The reference's ops re-run on a recording's own inputs (ladder/sides/op_replay.py) and the
own-op statistics built on them (ladder/sides/own_error.py)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

import ladder.sides.own_error as own_error
from ladder.engine.rules import DEFAULT_RULES
from ladder.engine.systematic import own_key
from ladder.model.names import point_name
from ladder.model.points import LAYER, POINTS
from ladder.sides.judge import ModelUnderTest, judge
from tests.ladder.sides.test_systematic_judge import scaled

SCHEDULE = dict(prompt_len=6, steps=12)


@pytest.fixture(scope="module")
def model():
    return ModelUnderTest.build(preset="tiny", seed=0)


def _replays(monkeypatch, ladder, model, precision=None, chunk=1):
    """{point: [(recorded, replayed) per chunk]} of every op own_sums replays."""
    seen = {}

    def keep(sysm, layer, got, replayed, *_):
        for name, b in replayed.items():
            if got.get(name) is not None:
                seen.setdefault(point_name(name, layer), []).append((got[name], b))
    monkeypatch.setattr(own_error, "_add", keep)
    own_error.own_sums(ladder, model.ref_params, model.cfg, precision, ladder.meta.get(
        "kv_window", model.cfg.kv_window), chunk=chunk)
    return seen


def test_every_op_replayed_on_the_references_recording_gives_its_values(monkeypatch, model):
    """The wiring is the reference's: each op, fed the reference's own recorded inputs one
    step at a time as the reference ran them, computes its recorded values bit for bit, and
    `attn` (its sum runs over the window, not the whole cache) within the float32 rule."""
    cfg = model.cfg
    ref = model.reference(model.tokens(18), 6, cfg.kv_window)
    seen = _replays(monkeypatch, ref, model)
    layer_points = [p.name for p in POINTS if p.scope == LAYER]
    expected = {point_name(n, i) for i in range(cfg.num_layers) for n in layer_points
                if n != "alpha" or cfg.site_of_layer(i) is not None}
    assert set(seen) == expected | {"lane_mean", "final_norm", "logits"}
    for point, pairs in seen.items():
        for a, b in pairs:
            if point.endswith(".attn"):
                rule = DEFAULT_RULES.rules[DEFAULT_RULES.pattern_for(f"port/{point}")]
                assert max(rule.position_errors(b.float(), a.float())) <= 1.0, point
            else:
                assert torch.equal(a, b.to(a.dtype)), point


def test_an_input_the_recording_lacks_skips_only_the_ops_that_read_it(monkeypatch, model):
    ref = model.reference(model.tokens(18), 6, model.cfg.kv_window)
    ref = replace(ref, values=dict(ref.values))          # the model's cached copy stays whole
    for step in ref.steps:
        del ref.values[f"{step.name}/L02.mlp_in"]
    seen = _replays(monkeypatch, ref, model, chunk=64)
    assert "L02.mlp_out" not in seen and "L02.attn_post" in seen and "L02.block_out" in seen
    last = _replays(monkeypatch, model.reference(model.tokens(18), 6, 8).last_only(), model)
    assert "L02.attn" not in last and "L02.mlp_out" in last   # no window of keys to read


def test_a_scale_below_the_margin_is_a_finding_at_its_own_op(model):
    """1 + 0.003 on L02.mlp_out at bfloat16 (0.77 of the margin) over 18 positions: the
    chained statistics cannot resolve it; the op's own can, and name the op."""
    port = scaled(model.our_port(precision="bfloat16"), "mlp_out", 2, 1.003)
    v = judge(port, model, locate=False, **SCHEDULE)
    assert v.passed
    flagged = [r for r in v.cmp.systematic if r.failed or r.finding]
    assert [r.point for r in flagged] == [own_key("L02.mlp_out")], [r.text() for r in flagged]
    (res,) = flagged
    assert abs(res.scale.value - 0.003) < 4 * res.scale.se and res.scale.se < 3e-4
    assert "systematic scale at L02.mlp_out (own op): 1.003" in str(v.cmp)


def test_a_scale_just_past_the_margin_fails_at_its_own_op(model):
    """1 + 0.006 on L02.mlp_out at bfloat16 (1.5 margins): invisible to the chained
    statistics over 18 positions, failed by the op's own, and the first divergence is there."""
    port = scaled(model.our_port(precision="bfloat16"), "mlp_out", 2, 1.006)
    v = judge(port, model, locate=False, **SCHEDULE)
    assert not v.passed and v.cmp.first.point == "L02.mlp_out", str(v.cmp)
    failing = [r.point for r in v.cmp.systematic if r.failed]
    assert failing == [own_key("L02.mlp_out")], failing
    assert v.cmp.first.note.startswith("systematic: systematic scale at L02.mlp_out (own op)")


def test_a_recorded_only_scale_is_found_at_the_record_not_its_reader(model):
    """An archive whose L02.x alone reads 0.3 % large: the op that recorded it departs by
    +0.003, the ops reading it appear to shrink by as much. Only the first is the fault's
    place, and the readers' shrink is not called a rounding mode (it fails nothing)."""
    from tools.precision.precision_sensitivity import judged
    v = judged(model, "bfloat16", "records", "x", 2, 0.003, 12)
    assert v.passed, str(v.cmp)
    # the first finding from layer 2 on (before it: the float32 weights' own leans against
    # the bfloat16 weights declared, one scalar's rounding at most: L01.hpost, 1.0031)
    first = next(r for r in v.cmp.systematic if r.finding and r.point >= "L02")
    assert first.point == own_key("L02.x") and first.scale.value > 0
    reader = next(r for r in v.cmp.systematic if r.point == own_key("L03.u"))
    assert reader.scale.value < 0 and not reader.failed


def test_a_golden_yardstick_gets_no_own_op_statistics(model):
    """Against a stored golden the port is held to the file (bugs included): the reference's
    ops are not its yardstick."""
    v = judge(model.our_port(), model, locate=False, **SCHEDULE)
    from ladder.sides.judge import capture, verdict_of
    cap = capture(model.our_port(), model, **SCHEDULE)
    golden = verdict_of(cap, model, yardstick=v.obtained, yardstick_label="golden", locate=False)
    assert not any(r.own for r in golden.cmp.systematic)
    assert any(r.own for r in v.cmp.systematic)


@pytest.fixture(scope="module")
def model1():
    return ModelUnderTest.build(preset="tiny", seed=1)


def test_our_bfloat16_plan_is_the_stored_replay_bit_for_bit(monkeypatch, model1):
    """What the iteration statistic stands on: our bfloat16 port computes the Sinkhorn plan
    in float32 from its recorded logits and rounds once, so every recorded hres equals the
    float32 replay stored at bfloat16, and an honest port shows no pull at all."""
    from ladder.model.precision import Precision
    v = judge(model1.our_port(precision="bfloat16"), model1, locate=False, **SCHEDULE)
    assert v.passed
    seen = _replays(monkeypatch, v.obtained, model1, Precision.parse("bfloat16"), chunk=64)
    hres = [p for p in seen if p.endswith(".hres")]
    assert len(hres) == model1.cfg.num_layers
    for point in hres:
        for a, b in seen[point]:
            assert torch.equal(a.to(torch.bfloat16), b.to(torch.bfloat16)), point
    pulls = [r.iterations for r in v.cmp.systematic if r.point.endswith(".hres (own op)")]
    assert pulls and all(e.value == 0 for e in pulls if e.p == e.p)


def test_one_sinkhorn_iteration_fewer_at_bfloat16_fails_as_an_iteration_count(model1):
    """sinkhorn_19 at bfloat16 changes the plan by 2 to 4 % of one rounding; where it crosses a
    rounding it crosses on the short side, every time. Seed 1, 18 positions: located where
    float32 locates it (L00.hres), by its own op."""
    from ladder.sides.faults import planted
    with planted("sinkhorn_19"):
        v = judge(model1.our_port(precision="bfloat16"), model1, **SCHEDULE)
    assert not v.passed and v.cmp.first.key == "prefill/L00.hres", str(v.cmp)
    bad = [r for r in v.cmp.systematic if r.failed]
    assert bad and all(r.kind == "iteration count" and r.own for r in bad), \
        [r.text() for r in bad]
    assert all(r.along == 1.0 and 0 < r.iterations.value for r in bad)
    assert "iteration count at L00.hres (own op)" in v.location.verdict

