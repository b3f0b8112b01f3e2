"""Locate the first divergence, scan inside its layer, split local from propagated error.

1. The coarse ladder (docs/design.md) is scanned in order: its first failing point names the step
   and layer where the error becomes visible at layer granularity.
2. Inside that layer the fine points are scanned in forward order. Every point is already
   captured, so this is a linear scan rather than a binary search: the graph inside a layer
   branches (hpost and hres depend on nx alone, not on the block), so "fails from here on"
   is not monotone and a binary search could skip the first failing point.
3. The located point is the earliest failing point of the whole ladder (a fine point can fail
   below the coarse ladder's notice, e.g. q fails but y stays inside its bound).
4. Injection: the port's layer is re-run at the failing position from the reference's inputs
   to that layer (its lanes, its Engram keys/values, and the layer's KV history in the ring).
   The local error isolates the layer; the propagated error is what the chained run carries.
   The re-run is the implementation under test (`V2Model.step_layer`): the C layer for
   backend="native" (nat_layer, dense or packed), the Python layer with the backend's
   attention kernel otherwise, so a bug in C code is blamed on its own layer.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ladder.engine.compare import Comparison, PointResult, as_ruleset, error_text
from ladder.engine.systematic_verdict import is_systematic, systematic_verdict
from ladder.engine.trace import Ladder, point_name


@dataclass(frozen=True)
class Injected:
    point: str
    pattern: str
    propagated: float          # rule error / allowance at the position, chained run
    local: float               # the same after re-running the layer on the reference's inputs

    @property
    def own(self) -> bool:
        return self.local > 1.0


@dataclass
class Location:
    first: PointResult
    position: int
    coarse: PointResult | None
    bisection: list                      # the layer's points at the step, up to the first fail
    injection: list = field(default_factory=list)     # Injected per point of the layer
    layers: list = field(default_factory=list)        # Injected for every layer's x
    verdict: str = ""
    # what the injection re-runs the layer on, and what `layers` holds (V4.1 says its own)
    rerun_on: str = "the reference's lanes, Engram and KV history"
    layers_title: str = ""
    # the stood-in inputs that could explain an "own" error (a dump that lacks them): the
    # split is then undecided, never "own"
    undecided: str = ""
    layers_note: str = ""                # why some of `layers`' local errors are not trusted
    unsure: frozenset = frozenset()      # injection points a stood-in input could reach

    @property
    def step(self) -> str:
        return self.first.step

    @property
    def point(self) -> str:
        return self.first.point

    @property
    def layer(self):
        return self.first.layer

    @property
    def split(self):
        """"own" or "inherited": the injection's verdict on the first divergent point itself,
        None where nothing re-ran it (a whole-forward point, no injection)."""
        at = next((r for r in self.injection if r.point == self.first.point), None)
        if at is not None and at.own and self.undecided:
            return "undecided"
        return None if at is None else "own" if at.own else "inherited"

    def __str__(self):
        f = self.first
        out = [f"first divergence: {f.key}  (position {self.position}"
               + (f", layer {f.layer})" if f.layer is not None else ")"),
               f"  {f}"]
        if self.coarse is not None and self.coarse.key != f.key:
            at = "" if self.coarse.first_bad_pos is None else \
                f" at position {self.coarse.first_bad_pos}"
            out.append(f"  coarse ladder first fails at {self.coarse.key} "
                       f"(err {error_text(self.coarse.first_bad_error)} of allowance{at})")
        if self.bisection:
            out.append(f"  inside L{f.layer:02d} at {f.step}, forward order, err of allowance "
                       f"at position {self.position}:")
            for r in self.bisection:
                mark = "  <- first failing" if r.key == f.key else ""
                bad = r.error_at(self.position) > 1.0
                out.append(f"    {r.point.split('.', 1)[1]:11s} {'FAIL' if bad else 'pass'}"
                           f"  err {error_text(r.error_at(self.position)):>10s}{mark}")
        if self.injection:
            out.append(f"  injection at position {self.position} (L{f.layer:02d} re-run on "
                       f"{self.rerun_on}); err of allowance:")
            out.append(f"    {'point':11s} {'propagated':>12s} {'local':>12s}")
            for r in self.injection:
                kind = ("own?" if r.point in self.unsure else "own") if r.own \
                    else "inherited"
                flag = "  <- " + kind if r.propagated > 1.0 else ""
                out.append(f"    {r.point.split('.', 1)[1]:11s} {error_text(r.propagated):>12s} "
                           f"{error_text(r.local):>12s}{flag}")
        if self.layers:
            title = self.layers_title or f"every layer's output x at position {self.position}"
            out.append(f"  {title}: propagated / local err of allowance")
            out.append("    " + "  ".join(f"{r.point[:3]} {error_text(r.propagated)}/"
                                          f"{error_text(r.local)}" for r in self.layers))
            if self.layers_note:
                out.append(f"    ({self.layers_note})")
        if self.verdict:
            out.append(f"  verdict: {self.verdict}")
        return "\n".join(out)


def _layer_state(model, tokens, pos: int, window):
    state = model.make_state()
    if window is not None:
        state.set_kv_window(window, model)
    for t in tokens[:pos + 1]:
        model.step_prefill(int(t), state)
    return state


def inject(model, ref: Ladder, layer: int, pos: int, base_state) -> dict:
    """Re-run the port's `layer` at `pos` from the reference's inputs; {point: value}.

    `base_state` is the port's own state after stepping through `pos`; it is cloned, and the
    layer's ring rows for earlier positions are replaced by the reference's k/v there. The
    layer runs through `model.step_layer`, i.e. the implementation under test (the C layer
    for backend="native", whose packed form holds no float32 matrices to read a dtype from:
    the state's dtype is the one the port computes in)."""
    cfg = model.cfg
    dtype = base_state.k.dtype
    st = base_state.clone()
    tag = lambda name: point_name(name, layer)
    for p in range(max(0, pos - st.ring + 1), pos):
        st.k[layer, :, p % st.ring] = ref.at(tag("k"), p).to(dtype)
        st.v[layer, :, p % st.ring] = ref.at(tag("v"), p).to(dtype)
    if layer:
        lanes = ref.at(point_name("x", layer - 1), pos)
    else:
        lanes = ref.at("embed", pos).expand(cfg.mhc_lanes, cfg.d_model)
    eng = [(ref.at(f"engram_k{s}", pos).to(dtype), ref.at(f"engram_v{s}", pos).to(dtype))
           for s in range(cfg.num_sites)]
    got = {}

    def trace(name, i, v):
        got[point_name(name, i)] = v.detach().clone()
    prefill = ref.steps[0].name == "prefill" and pos in ref.steps[0].positions
    model.step_layer(layer, lanes.to(dtype), st, pos, engram=eng, trace=trace, prefill=prefill)
    return got


def layer_scan(cmp: Comparison, first: PointResult, prefix: str | None = None) -> list:
    """The rows of `first`'s layer at its step in forward order, up to and including it:
    the in-layer scan every locate prints (a linear scan: see this module's docstring)."""
    prefix = f"L{first.layer:02d}." if prefix is None else prefix
    out = []
    for r in cmp.rows:
        if r.step == first.step and r.point.startswith(prefix):
            out.append(r)
            if r.key == first.key:
                break
    return out


def _err(rules, prefix, point, a, b):
    pattern = rules.pattern_for(f"{prefix}/{point}")
    rule = rules.rules[pattern]
    return pattern, rule.position_errors(a[None].to(b.dtype), b[None])[0]


def locate(cmp: Comparison, *, port: Ladder = None, ref: Ladder = None, model=None,
           window=None) -> Location | None:
    """The first divergence of `cmp`; with the ladders and the port model, also injection."""
    first = cmp.first
    if first is None:
        return None
    pos = first.first_bad_pos if first.first_bad_pos is not None else first.worst_pos
    loc = Location(first, pos, cmp.first_coarse, [])
    if first.layer is None:
        loc.verdict = whole_forward_verdict(first)
        return loc
    loc.bisection = layer_scan(cmp, first)
    if is_systematic(first):
        loc.verdict = systematic_verdict(cmp, first)
        return loc
    if model is None or port is None or ref is None:
        loc.verdict = "no injection (needs the port model and both ladders)"
        return loc
    rules = as_ruleset(cmp.rules)
    base = _layer_state(model, ref.tokens, pos, window)
    for i in range(model.cfg.num_layers):
        local = inject(model, ref, i, pos, base)
        if i == first.layer:
            for point, val in local.items():
                pat, le = _err(rules, cmp.prefix, point, val, ref.at(point, pos))
                _, pe = _err(rules, cmp.prefix, point, port.at(point, pos), ref.at(point, pos))
                loc.injection.append(Injected(point, pat, pe, le))
        x = point_name("x", i)
        pat, le = _err(rules, cmp.prefix, x, local[x], ref.at(x, pos))
        _, pe = _err(rules, cmp.prefix, x, port.at(x, pos), ref.at(x, pos))
        loc.layers.append(Injected(x, pat, pe, le))
    at = next((r for r in loc.injection if r.point == first.point), None)
    if at is None:
        loc.verdict = f"{first.point} was not traced by step_layer; no local error"
    elif at.own:
        loc.verdict = (f"the layer's own error: re-run on the reference's inputs, "
                       f"L{first.layer:02d} still fails at {first.point[4:]} (local err "
                       f"{at.local:.3g} of allowance)")
    else:
        loc.verdict = (f"inherited: on the reference's inputs L{first.layer:02d} passes at "
                       f"{first.point[4:]} (local err {at.local:.3g}); the error arrives with its "
                       f"inputs (earlier positions via the KV/Engram rings, or rounding "
                       f"accumulated upstream)")
    return loc


def whole_forward_verdict(first: PointResult) -> str:
    if first.point == "embed" or first.point.startswith("engram_"):
        return (f"{first.point} is computed before layer 0 from the token ids alone: the "
                f"embedding / Engram path itself is wrong (no injection needed)")
    return (f"{first.point} follows the last layer, whose outputs all pass: the output head "
            f"(lane mean, final norm, unembedding) is wrong")
