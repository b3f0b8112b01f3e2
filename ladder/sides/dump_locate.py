"""Local vs propagated error for a port known only by what it recorded (a dump, or an
in-process port without `step_layer`).

Our own ports are split by injection: the port's layer re-run on the reference's inputs
(ladder/engine/locate.py). A port in another language cannot be re-run from here, so the split goes the
other way: the *reference's* layer is re-run from the port's own recorded inputs at the failing
position: its lanes entering the layer (the previous layer's `x`, or `embed` for layer 0), its
Engram rows (`engram_k{s}`, `engram_v{s}`), and for attention its keys and values at the
earlier positions of the window (`L{i}.k`, `L{i}.v`). If the reference, fed the port's inputs,
computes what the port recorded, the port's layer arithmetic is right and the error came in
with its inputs ("inherited"); if not, the layer itself is wrong ("own").

Whatever the dump lacks is taken from the reference's own run and named: the verdict then
says which points would make it exact, and how far the substituted inputs could move it.

A side below float32 is split at its own precision (docs/precision.md): the reference's layer
runs twice on the port's inputs, in float32 (what the port is compared with) and at the port's
precision (the local noise floor), and the port's local error is counted in units of the
distance between the two.
"""
from __future__ import annotations

import torch

from ladder.engine.compare import Comparison, as_ruleset
from ladder.engine.locate import Injected, Location, whole_forward_verdict, layer_scan
from ladder.engine.systematic_verdict import is_systematic, systematic_verdict
from ladder.model.names import point_name
from ladder.model.points import LAYER, POINTS


def _pick(dump, ref, point, pos, used: list, lacking: list):
    if dump.has_at(point, pos):
        used.append(f"{point}@{pos}")
        return dump.at(point, pos)
    lacking.append(f"{point}@{pos}")
    return ref.at(point, pos)


def rerun_reference_layer(params, cfg, layer: int, pos: int, dump, ref, window: int,
                          kv_store=None) -> tuple:
    """({point: value} of the reference's `layer` at `pos` on the dump's inputs, used, lacking).
    `params` at a lower precision with its `kv_store`: the same layer at that precision (the
    dump's inputs rounded to it, its keys and values stored in the cache's format)."""
    from reference.decode import init_kv_cache, layer_cached
    from reference.ops import mhc_lane_offsets, rope_tables
    dtype = params["embedding/embedding"].dtype
    used, lacking = [], []
    if layer:
        lanes = _pick(dump, ref, point_name("x", layer - 1), pos, used, lacking)
    else:
        lanes = _pick(dump, ref, "embed", pos, used, lacking).expand(cfg.mhc_lanes, cfg.d_model)
    site = cfg.site_of_layer(layer)
    eng = None
    if site is not None:
        ek = _pick(dump, ref, f"engram_k{site}", pos, used, lacking)
        ev = _pick(dump, ref, f"engram_v{site}", pos, used, lacking)
        eng = (ek.to(dtype).reshape(1, 1, -1), ev.to(dtype).reshape(1, 1, -1))
    kc, vc = init_kv_cache(cfg, 1, pos + 1, dtype)
    lo = max(0, pos - window + 1) if window else 0
    store = (lambda t: t) if kv_store is None else kv_store
    for p in range(lo, pos):                  # the keys this position can attend to
        kc[layer, 0, :, p] = store(_pick(dump, ref, point_name("k", layer), p, used,
                                         lacking).to(dtype))
        vc[layer, 0, :, p] = store(_pick(dump, ref, point_name("v", layer), p, used,
                                         lacking).to(dtype))
    cos, sin = rope_tables(cfg.head_dim, pos + 1, cfg.rope_theta, dtype)
    pre_off, post_off = mhc_lane_offsets(cfg.num_layers, cfg.mhc_lanes, dtype)
    got = {}

    def trace(name, i, v):
        v = v[0]
        if name in ("q", "k", "v"):
            v = v.transpose(0, 1)             # [H, S, hd] -> [S, H, hd]
        got[point_name(name, i)] = v[0].detach().clone()
    x = lanes.to(dtype).reshape(1, 1, cfg.mhc_lanes, cfg.d_model)
    layer_cached(params, cfg, layer, x, eng, kc[layer], vc[layer], pos, cos[pos:pos + 1],
                 sin[pos:pos + 1], window, None, None, trace, (pre_off[layer], post_off[layer]),
                 kv_store=kv_store)
    return got, used, lacking


def _err(rules, prefix, point, a, b, floor=None, unit_eps=0.0, prior=0.0) -> float:
    """The rule error of `a` against `b` at one position; a noise-unit rule counts it in units
    of |floor - b| there, never below `prior` (the chained comparison's noise unit at the
    position: its running maximum, docs/precision.md)."""
    from ladder.engine.rule import noise_units
    pattern = rules.pattern_for(f"{prefix}/{point}")
    units = None if floor is None else noise_units(floor[None], b[None], unit_eps, prior)
    return float(rules.rules[pattern].position_errors(a[None].to(b.dtype), b[None],
                                                      units=units)[0])


class _AtPrecision:
    """The pieces of a split at a side's precision: the floor ladder, the reference's
    parameters at that precision and its cache format, the dtype's least noise unit."""

    def __init__(self, floor, precision, params):
        from ladder.engine.rules import UNIT_EPS
        from ladder.sides.noise_floor import floor_kv_store, floor_params
        self.floor, self.unit_eps = floor, UNIT_EPS[precision.activations]
        self.params, self.kv_store = floor_params(params, precision), floor_kv_store(precision)

    def rerun(self, cfg, layer, pos, dump, ref, window):
        return rerun_reference_layer(self.params, cfg, layer, pos, dump, ref, window,
                                     self.kv_store)[0]


def _summarise(names: list) -> str:
    by_point = {}
    for n in names:
        point, pos = n.split("@")
        by_point.setdefault(point, []).append(int(pos))
    return ", ".join(f"{p} at {len(v)} position(s) ({min(v)}..{max(v)})" if len(v) > 1
                     else f"{p} at position {v[0]}" for p, v in by_point.items())


_ORDER = [p.name for p in POINTS if p.scope == LAYER]


def relevant_stand_ins(point: str, lacking: list) -> list:
    """The stood-in inputs (`name@pos`) that can reach `point` inside its layer: the lanes
    reach every point; the Engram rows only from `alpha` on (the gate reads them after `u`);
    the keys and values of earlier positions only from `attn` on. A stand-in that cannot reach
    the point cannot explain its error."""
    base = point.split(".", 1)[1] if "." in point else point
    at = _ORDER.index(base) if base in _ORDER else len(_ORDER)
    out = []
    for n in lacking:
        name = n.split("@")[0]
        if name.startswith("engram_"):
            reach = _ORDER.index("alpha")
        elif name.endswith((".k", ".v")):
            reach = _ORDER.index("attn")
        else:
            reach = 0
        if at >= reach:
            out.append(n)
    return out


def locate_dump(cmp: Comparison, dump, ref, params, cfg, window: int, floor=None,
                precision=None) -> Location | None:
    """The first divergence of `cmp` (dump = candidate `a`, ref = yardstick `b`), split into
    the layer's own error and what it inherited, by re-running the reference's layer.
    `floor`, `precision`: a side below float32, split at its precision (module docstring)."""
    first = cmp.first
    if first is None:
        return None
    pos = first.first_bad_pos if first.first_bad_pos is not None else first.worst_pos
    if pos < 0:                              # a point the candidate never traced
        pos = next(s.pos + len(s.tokens) - 1 for s in cmp.steps if s.name == first.step)
    loc = Location(first, pos, cmp.first_coarse, [],
                   rerun_on="the port's recorded inputs (the reference's layer re-run)")
    if first.layer is None:
        loc.verdict = whole_forward_verdict(first)
        return loc
    loc.bisection = layer_scan(cmp, first)
    if is_systematic(first):         # one position's re-run cannot show a repetition
        loc.verdict = systematic_verdict(cmp, first)
        return loc
    rules = as_ruleset(cmp.rules)
    low = None if floor is None else _AtPrecision(floor, precision, params)
    if low is not None:
        loc.rerun_on = (f"the port's recorded inputs (the reference's layer re-run in float32 "
                        f"and at {precision.short()}, the local noise floor)")
    got, used, lacking = rerun_reference_layer(params, cfg, first.layer, pos, dump, ref, window)
    got_low = {} if low is None else low.rerun(cfg, first.layer, pos, dump, ref, window)

    def floor_at(point):             # the chained noise floor's value (None: float32 side)
        return None if low is None or not low.floor.has_at(point, pos) \
            else low.floor.at(point, pos)

    def chained(point):              # (the comparison's row error, its noise unit) at pos
        try:
            row = cmp.row(first.step, point)
        except KeyError:
            return None, 0.0
        j = pos - row.pos0
        return row.error_at(pos), (row.units[j] if 0 <= j < len(row.units) else 0.0)
    eps = 0.0 if low is None else low.unit_eps
    for point, val in got.items():
        if not dump.has_at(point, pos):
            continue
        mine = dump.at(point, pos)
        row_err, unit = chained(point) if low is not None else (None, 0.0)
        pe = row_err if row_err is not None else _err(
            rules, cmp.prefix, point, mine, ref.at(point, pos), floor_at(point), eps)
        # port vs reference on port inputs (at the port's precision: in local noise units,
        # never finer than the chained comparison's at this point)
        le = _err(rules, cmp.prefix, point, mine, val, got_low.get(point), eps, unit)
        loc.injection.append(Injected(point, rules.pattern_for(f"{cmp.prefix}/{point}"), pe, le))
    stood_in_layers = []
    for i in range(cfg.num_layers):          # every layer's output, split the same way
        x = point_name("x", i)
        if not (dump.has_at(x, pos) and (i == 0 or dump.has_at(point_name("x", i - 1), pos))):
            continue
        if i == first.layer:
            val, lack_i, val_low = got[x], lacking, got_low.get(x)
        else:
            run_i = rerun_reference_layer(params, cfg, i, pos, dump, ref, window)
            val, lack_i = run_i[0][x], run_i[2]
            val_low = None if low is None else low.rerun(cfg, i, pos, dump, ref, window)[x]
        mine = dump.at(x, pos)
        row_err, unit = chained(x) if low is not None else (None, 0.0)
        loc.layers.append(Injected(x, rules.pattern_for(f"{cmp.prefix}/{x}"),
                                   row_err if row_err is not None else
                                   _err(rules, cmp.prefix, x, mine, ref.at(x, pos),
                                        floor_at(x), eps),
                                   _err(rules, cmp.prefix, x, mine, val, val_low, eps, unit)))
        if lack_i:
            stood_in_layers.append(f"L{i:02d}")
    loc.layers_title = (f"every layer's output x at position {pos} (local: the reference's "
                        f"layer re-run on the port's inputs)")
    if stood_in_layers:
        # a later layer fed the reference's own keys where the port's earlier layers (or an
        # unrecorded input) differ shows a "local" error that is not the layer's
        loc.layers_note = (f"the re-runs of {', '.join(stood_in_layers)} took the "
                           f"reference's values for inputs the dump lacks: their local error "
                           f"cannot be trusted as the layer's own")
    at = next((r for r in loc.injection if r.point == first.point), None)
    gap = ""
    if lacking:
        # How far the stand-ins could move the verdict: the reference's own values sit where
        # the port's would; their distance is unknown, bounded only by how far the port's
        # values that *were* recorded are from the reference's.
        worst = max((r.error for r in cmp.rows if r.step == first.step and
                     r.layer is not None and r.layer < first.layer), default=0.0)
        gap = (f"; the dump lacks {_summarise(lacking)}: the reference's own values stood in "
               f"(record those points for an exact split; the port's earlier layers at this "
               f"step are within {worst:.3g} of their allowance, so an error of that size "
               f"carried only through them is not seen here)")
    reach = relevant_stand_ins(first.point, lacking)
    loc.unsure = frozenset(r.point for r in loc.injection if relevant_stand_ins(r.point, lacking))
    if at is None:
        loc.verdict = f"{first.point} is not recomputed by a layer re-run; no split" + gap
    elif at.own and reach:
        # the reference ran on its own values where the port's were not recorded: a port
        # whose error came in through those inputs looks the same as a wrong layer
        loc.undecided = _summarise(reach)
        loc.verdict = (f"own, or inherited from an unrecorded input: fed the port's recorded "
                       f"inputs, with the reference's own {_summarise(reach)} standing in for "
                       f"what the dump lacks, the reference's L{first.layer:02d} does not "
                       f"reproduce the port's {first.point[4:]} (port vs re-run err "
                       f"{at.local:.3g} of allowance); record those points to decide" + gap)
    elif at.own:
        loc.verdict = (f"the layer's own error: fed the port's own inputs, the reference's "
                       f"L{first.layer:02d} does not reproduce the port's {first.point[4:]} "
                       f"(port vs re-run err {at.local:.3g} of allowance)" + gap)
    else:
        loc.verdict = (f"inherited: fed the port's own inputs, the reference's L{first.layer:02d} "
                       f"reproduces the port's {first.point[4:]} (err {at.local:.3g} of "
                       f"allowance); the error arrives with the layer's inputs" + gap)
    return loc
