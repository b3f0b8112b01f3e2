"""`python -m ladder locate --model attn_v41`: the first divergence of the V4.1 port, bisected
inside its layer, with local error split from propagated error.

Each layer of the fixture runs from the official input `x`, so an error cannot reach a layer
through its input; it arrives through state: what an earlier layer published in this call
(compressed cache, index keys, selection, candidate filter) and what earlier calls left behind
(the window ring, the compressor's waiting tokens, the cache rows). So the injection here runs
the port's layer from the reference's *state*: both sides are driven in step up to the failing
call; at each of that call's layers the port's state is set aside, the reference's state (as
the reference is about to run that layer) is copied into the port, the port's layer runs
(local), then the port's own state is put back and both chains go on (propagated). A point
that still fails locally is the layer's own error; one that passes locally was inherited.

The scan of the layer's points and the report are ladder/engine/locate.py's (Location, Injected).
"""
from __future__ import annotations

from ladder.engine.compare import Comparison, as_ruleset, compare_point
from ladder.engine.locate import Injected, Location, layer_scan
from ladder.engine.trace import point_name
from ladder.v41.sides import INDEX_POINTS, POINTS

STATE_DICTS = ("cache", "kcache", "kv_state", "score_state")


def snapshot(stack) -> dict:
    """A copy of every per-sequence buffer of a V4.1 stack (reference or port) and what it has
    published (published tensors that alias a cache are recorded as that cache's layer)."""
    snap = {"ring": [t.clone() for t in stack.ring]}
    for name in STATE_DICTS:
        snap[name] = {i: t.clone() for i, t in getattr(stack, name).items()}
    snap["shared"] = {k: _published(stack, k, v) for k, v in stack.shared.items()}
    return snap


def _published(stack, key, v):
    if v is None:
        return None
    for name in ("cache", "kcache"):
        for i, t in getattr(stack, name).items():
            if v is t:
                return (name, i)
    return v.clone()


def restore(stack, snap) -> None:
    """Write `snap` (from this stack or the other side's) into `stack`'s own buffers in place
    (captured pointers stay valid); published caches point at this stack's caches."""
    dev = stack.ring[0].device
    for t, s in zip(stack.ring, snap["ring"]):
        t.copy_(s.to(dev))
    for name in STATE_DICTS:
        own = getattr(stack, name)
        for i, s in snap[name].items():
            own[i].copy_(s.to(dev))
    stack.shared = {k: (None if v is None else getattr(stack, v[0])[v[1]] if isinstance(v, tuple)
                        else v.to(dev).clone()) for k, v in snap["shared"].items()}
    if hasattr(stack, "invalidate_decode_uploads"):
        stack.invalidate_decode_uploads()


def _trace_into(got):
    return lambda name, layer, v: got.__setitem__(name, v.detach().to("cpu", copy=True))


def injection_run(port, ref, man, rec, target: str) -> tuple:
    """Drive `ref` and `port` (fresh stacks) in step through the calls up to `target`; at
    `target`, every layer also runs on the port from the reference's state. Returns
    ({layer: {point: local value}}, {layer: {point: chained port value}},
     {layer: {point: reference value}}) for the target call."""
    n_layers = ref.args.n_layers
    local, chained, want = {}, {}, {}
    for c in man["calls"]:
        at_target = c["key"] == target
        for layer in range(n_layers):
            x, pos = rec[c["key"]][layer]["x"], c["start_pos"]
            if at_target:
                own = snapshot(port)
                restore(port, snapshot(ref))
                got = local[layer] = {}
                port.forward(layer, x, pos, trace=_trace_into(got))
                restore(port, own)
            p_got, r_got = {}, {}
            port.forward(layer, x, pos, trace=_trace_into(p_got) if at_target else None)
            ref.forward(layer, x, pos, trace=_trace_into(r_got) if at_target else None)
            if at_target:
                chained[layer], want[layer] = p_got, r_got
        if at_target:
            return local, chained, want
    raise KeyError(f"no call {target!r} in the fixture")


def _err(rules, prefix, step, pos0, layer, name, a, b):
    point = point_name(name, layer)
    pattern = rules.pattern_for(f"{prefix}/{point}")
    a = a.long() if name in INDEX_POINTS else a.float()
    b = b.long() if name in INDEX_POINTS else b.float()
    row = compare_point(step, point, a, b, pattern, rules.rules[pattern], rules.rel_floor, pos0)
    return pattern, row.error


def locate_v41(cmp: Comparison, make_port, make_ref, man, rec) -> Location | None:
    """The first divergence of `cmp` (port vs reference over the fixture): its call, layer and
    point, the layer's points in forward order up to it, and local vs propagated error at
    that call for the layer's points and every layer's output."""
    first = cmp.first
    if first is None:
        return None
    pos = first.first_bad_pos if first.first_bad_pos is not None else first.worst_pos
    loc = Location(first, pos, None, [],
                   rerun_on="the reference's state: ring, compressor, published cache, keys, "
                            "selection and candidates",
                   layers_title=f"every layer's out at call {first.step}")
    loc.bisection = layer_scan(cmp, first, point_name("", first.layer))
    rules = as_ruleset(cmp.rules)
    call = next(c for c in man["calls"] if c["key"] == first.step)
    local, chained, want = injection_run(make_port(), make_ref(), man, rec, first.step)
    err = lambda layer, name, got: _err(rules, cmp.prefix, first.step, call["start_pos"],
                                        layer, name, got, want[layer][name])
    for name in POINTS:
        if name in want[first.layer] and name in local[first.layer]:
            pat, le = err(first.layer, name, local[first.layer][name])
            _, pe = err(first.layer, name, chained[first.layer][name])
            loc.injection.append(Injected(point_name(name, first.layer), pat, pe, le))
    for layer in sorted(want):
        pat, le = err(layer, "out", local[layer]["out"])
        _, pe = err(layer, "out", chained[layer]["out"])
        loc.layers.append(Injected(point_name("out", layer), pat, pe, le))
    at = next((r for r in loc.injection if r.point == first.point), None)
    name = first.point.split(".", 1)[1]
    if at is None:
        loc.verdict = f"{name} was not traced on the re-run; no local error"
    elif at.own:
        loc.verdict = (f"the layer's own error: re-run from the reference's state, "
                       f"L{first.layer:02d} still fails at {name} in call {first.step} (local "
                       f"err {at.local:.3g} of allowance)")
    else:
        loc.verdict = (f"inherited: from the reference's state L{first.layer:02d} passes at "
                       f"{name} in call {first.step} (local err {at.local:.3g}); the error "
                       f"arrives through state an earlier layer published or an earlier call "
                       f"left behind")
    return loc
