import re

import pytest
import torch

from ladder.sides.capture import capture_port, capture_reference
from ladder.engine.trace import (Ladder, PortRecorder, ReferenceRecorder, TraceError, is_coarse,
                                 layer_of, schedule)
from reference.decode import COARSE
from tests.captures import clean_port_ladder, reference_ladder, setup


def test_schedule_names_and_positions():
    steps = schedule(range(1, 15), 4)
    assert [s.name for s in steps] == ["prefill"] + [f"decode{i:02d}" for i in range(10)]
    assert [s.pos for s in steps] == [0] + list(range(4, 14))
    assert steps[0].tokens == (1, 2, 3, 4) and steps[3].tokens == (7,)
    assert schedule(range(130), 3)[-1].name == "decode126"
    with pytest.raises(TraceError, match="prompt_len=0 must lie in 1..5"):
        schedule(range(5), 0)


def test_both_sides_trace_the_same_points_in_forward_order():
    cfg = setup()[0]
    ref, port = reference_ladder(), clean_port_ladder()
    assert ref.keys() == port.keys()
    assert all(ref[k].shape == port[k].shape for k in ref.keys())
    for st in ref.steps:
        pts = ref.points(st.name)
        assert pts[:5] == ["embed", "engram_k0", "engram_v0", "engram_k1", "engram_v1"]
        assert pts[-3:] == ["lane_mean", "final_norm", "logits"]
        for i in range(cfg.num_layers):
            coarse = [p[4:] for p in pts if layer_of(p) == i and is_coarse(p)]
            assert coarse == [c for c in COARSE if c != "alpha" or i in cfg.engram_layers]
        assert all(ref[f"{st.name}/{p}"].shape[0] == len(st.tokens) for p in pts)


def test_ladder_at_maps_absolute_positions():
    ref = reference_ladder()
    prompt = setup()[4]
    assert torch.equal(ref.at("L02.x", 1), ref["prefill/L02.x"][1])
    assert torch.equal(ref.at("L02.x", prompt + 2), ref["decode02/L02.x"][0])
    with pytest.raises(KeyError, match="position 99"):
        ref.at("embed", 99)


def test_recorders_refuse_protocol_violations():
    st = schedule([1, 2, 3], 2)[0]
    lad = Ladder([st])
    rec = ReferenceRecorder(lad, st)
    rec("embed", None, torch.zeros(1, 2, 4))
    with pytest.raises(TraceError, match="prefill/embed traced twice"):
        rec("embed", None, torch.zeros(1, 2, 4))
    with pytest.raises(TraceError, match="no leading axis"):
        rec("u", 0, torch.zeros(1, 3, 4))
    prec = PortRecorder(Ladder([st]), st)
    with pytest.raises(TraceError, match="next_position"):
        prec("embed", None, torch.zeros(4))
    prec.next_position()
    prec("embed", None, torch.zeros(4))
    prec("u", 0, torch.zeros(4))
    prec.next_position()
    prec("embed", None, torch.zeros(4))
    with pytest.raises(TraceError, match="position 1 traced 1 points, position 0 traced 2"):
        prec.finish()


def _port_recorder_after_position_0(points):
    st = schedule([1, 2, 3], 3)[0]
    rec = PortRecorder(Ladder([st]), st)
    rec.next_position()
    for name, layer in points:
        rec(name, layer, torch.zeros(4))
    rec.next_position()
    return rec


POSITION_0 = [("embed", None), ("u", 0), ("y", 0), ("u", 1)]


@pytest.mark.parametrize("later, error", [
    (POSITION_0, None),
    (POSITION_0[:2] + [("u", 1), ("y", 0)], "position 1 traced 4 points, position 0 traced 4 "
                                            "(or another order)"),
    (POSITION_0 + [("y", 1)], "position 1 traced 5 points, position 0 traced 4"),
    (POSITION_0[:3], "position 1 traced 3 points, position 0 traced 4"),
    (POSITION_0[:2] + [("u", 0)], "prefill/L00.u traced twice at position 1"),
    (POSITION_0[:1] + [("y", 0), ("y", 0)], "prefill/L00.y traced twice at position 1"),
    ([("u", 0), ("embed", None), ("u", 0)], "prefill/L00.u traced twice at position 1"),
], ids=["same", "swapped", "one more", "one fewer", "repeat in order", "repeat off order",
        "repeat from the start"])
def test_port_recorder_holds_every_position_to_position_0s_points(later, error):
    rec = _port_recorder_after_position_0(POSITION_0)
    if error is None:
        for name, layer in later:
            rec(name, layer, torch.zeros(4))
        rec.next_position()
        for name, layer in later:
            rec(name, layer, torch.ones(4))
        rec.finish()
        assert rec.ladder.keys() == [f"prefill/{p}" for p in ("embed", "L00.u", "L00.y",
                                                              "L01.u")]
        assert torch.equal(rec.ladder["prefill/L00.y"][:, 0], torch.tensor([0.0, 0.0, 1.0]))
        return
    with pytest.raises(TraceError, match=re.escape(error)):
        for name, layer in later:
            rec(name, layer, torch.zeros(4))
        rec.next_position()


def test_port_recorder_refuses_a_point_twice_at_position_0():
    with pytest.raises(TraceError, match="prefill/L00.y traced twice at position 0"):
        _port_recorder_after_position_0(POSITION_0 + [("y", 0)])


def test_traced_values_are_copies():
    st = schedule([1, 2], 2)[0]
    rec = PortRecorder(Ladder([st]), st)
    live = torch.zeros(3)
    for j in range(2):
        rec.next_position()
        live.fill_(j + 1)
        rec("embed", None, live)
    rec.finish()
    assert torch.equal(rec.ladder["prefill/embed"], torch.tensor([[1.0] * 3, [2.0] * 3]))
    grad = torch.ones(2, requires_grad=True)
    rec2 = PortRecorder(Ladder([st]), st)
    for _ in range(2):
        rec2.next_position()
        rec2("embed", None, grad * 2)
    rec2.finish()
    assert not rec2.ladder["prefill/embed"].requires_grad


def test_capture_keeps_only_selected_points():
    cfg, params, model, tokens, prompt = setup()
    lad = capture_port(model, tokens[:prompt + 1], prompt, keep=is_coarse)
    assert lad.keys() == [k for k in clean_port_ladder().keys()
                          if is_coarse(k.split("/", 1)[1]) and k.split("/")[0] in
                          ("prefill", "decode00")]


def test_tracing_changes_no_bit_and_the_check_can_fail(monkeypatch):
    cfg, params, model, tokens, prompt = setup()
    toks = tokens[:prompt + 3]
    capture_port(model, toks, prompt, check_plain=True)           # passes: no exception
    capture_reference(params, cfg, toks, prompt, check_plain=True)
    orig = type(model).step_traced

    def nudged(self, token, state, logits, trace, **kw):          # tracing that perturbs
        out = orig(self, token, state, logits, trace, **kw)
        out.add_(1e-7)
        return out
    monkeypatch.setattr(type(model), "step_traced", nudged)
    with pytest.raises(TraceError, match="step_traced logits differ from the plain "
                                         "prefill_batch at step prefill"):
        capture_port(model, toks, prompt, check_plain=True)
    monkeypatch.undo()
    rcall = ReferenceRecorder.__call__

    def writes_back(self, name, layer, values):                   # a trace that writes
        rcall(self, name, layer, values)
        if name == "u":
            values.mul_(1.0 + 1e-6)
    monkeypatch.setattr(ReferenceRecorder, "__call__", writes_back)
    with pytest.raises(TraceError, match="traced run differs from the plain run at step "
                                         "prefill"):
        capture_reference(params, cfg, toks, prompt, check_plain=True)


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")
def test_copy_values_keeps_values_only():
    """A captured value carries no autograd of either kind (a forward-mode tangent neither)."""
    import torch.autograd.forward_ad as fwAD
    from ladder.engine.trace import copy_values
    with fwAD.dual_level():
        dual = fwAD.make_dual(torch.ones(3), torch.full((3,), 2.0))
        got = copy_values(dual, None)
        assert fwAD.unpack_dual(got).tangent is None
    assert torch.equal(got, torch.ones(3))
    half = copy_values(torch.tensor([1.5], dtype=torch.bfloat16), None)
    assert half.dtype == torch.float32 and torch.equal(half, torch.tensor([1.5]))
    with pytest.raises(AttributeError, match="detach"):
        copy_values([1.0, 2.0], None)
