"""locate's local-vs-propagated split must be able to say "inherited": an error that arrives
with a layer's inputs (from an earlier layer, or through the KV ring from earlier positions)
is not blamed on the layer where it first shows. And the numbers locate prints agree with the
comparison's first divergence (same position, same error)."""
import contextlib

from ladder.sides.capture import capture_port
from ladder.engine.compare import compare_ladders, error_text
from ladder.sides.faults import planted
from ladder.engine.locate import locate
from ladder.engine.rules import DEFAULT_RULES, Rule, RuleSet
from tests.captures import port_model, reference_ladder, setup
import torch
from ladder.engine.trace import Ladder, schedule
import importlib


def _locate(fault_ctx, rules=DEFAULT_RULES):
    cfg, params, _, tokens, prompt = setup()
    ref = reference_ladder()
    model = port_model()
    with fault_ctx:
        bad = capture_port(model, tokens, prompt)
        cmp = compare_ladders(bad, ref, rules)
        loc = locate(cmp, port=bad, ref=ref, model=model)
    return cmp, loc


def test_an_earlier_layers_error_is_inherited_by_the_next():
    """The attention gate is skipped in every layer; with layer 0's points under a loose rule
    the first divergence shows in layer 1, which re-run on the reference's inputs passes at
    that point: its error is inherited from layer 0."""
    loose_l00 = RuleSet(rules={"port/L00.*": Rule(10.0), **DEFAULT_RULES.rules})
    cmp, loc = _locate(planted("attn_gate_skipped"), loose_l00)
    assert (loc.layer, loc.point, loc.position) == (1, "L01.nx", 0), str(loc)
    at = {r.point: r for r in loc.injection}["L01.nx"]
    assert at.propagated > 1.0 >= at.local and not at.own, str(loc)
    assert loc.verdict.startswith("inherited"), str(loc)
    assert "L01.nx" in str(loc) and "<- inherited" in str(loc)


@contextlib.contextmanager
def corrupted_ring_key(layer: int, pos: int, delta: float = 1.0):
    """After the step at `pos`, the key `layer` stored in the ring is off by `delta`: every
    captured value at `pos` is right, the next positions attend to a wrong key."""
    from port.model import V2Model
    orig = V2Model.run_step

    def run_step(self, token, state, **kw):
        out = orig(self, token, state, **kw)
        if state.pos - 1 == pos:
            state.k[layer, :, pos % state.ring] += delta
        return out
    V2Model.run_step = run_step
    try:
        yield
    finally:
        V2Model.run_step = orig


def test_a_wrong_kv_history_is_inherited_through_the_ring():
    """Injection replaces the layer's earlier K/V rows with the reference's, so the layer
    re-run at the failing position passes: the error came from earlier positions."""
    cmp, loc = _locate(corrupted_ring_key(2, 2))
    assert (loc.step, loc.point, loc.position) == ("prefill", "L02.attn", 3), str(loc)
    at = {r.point: r for r in loc.injection}["L02.attn"]
    assert at.propagated > 1.0 >= at.local and not at.own, str(loc)
    assert loc.verdict.startswith("inherited"), str(loc)
    layers = {r.point: r for r in loc.layers}
    assert layers["L02.x"].propagated > 1.0 >= layers["L02.x"].local, str(loc)


def test_locate_reports_the_first_failing_position_and_its_error():
    """RoPE at pos+1 in layer 3 fails q at position 0 already (and worst at position 1):
    locate re-runs position 0, and the first-divergence row, the bisection and the
    injection table all print the same error there."""
    cmp, loc = _locate(planted("rope_pos_plus_1"))
    first = cmp.first
    assert first.key == "prefill/L03.q" and first.first_bad_pos == 0 != first.worst_pos
    assert loc.position == 0
    at = {r.point: r for r in loc.injection}["L03.q"]
    assert at.propagated == first.first_bad_error == first.error_at(0)
    shown = error_text(first.first_bad_error)
    assert f"err {shown:>9s} of allowance" in str(first)
    text = str(loc)
    assert f"q           FAIL  err {shown:>10s}  <- first failing" in text, text


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


def test_ladder_locate_is_the_function_and_its_module_stays_importable():
    mod = importlib.import_module("ladder.engine.locate")
    from ladder import locate
    assert callable(locate) and locate is mod.locate
    import ladder.locate  # noqa: F401  (binding the submodule must not replace the function)
    import ladder
    assert ladder.locate is mod.locate
    from ladder.locate import Location, locate as again       # the flat layout's path
    assert again is mod.locate and Location is mod.Location
    assert importlib.import_module("ladder.locate") is mod      # one module, two paths
