"""The one registry of ladder points: name, scope (once per forward, per Engram site, or per
layer), shape as a function of the config, coarse or fine. Every implementation is checked
against it:

- the reference's emits and the torch port's (eager; the graph body shares its `layer`) and
  the native step's: `check_ladder` on every ladder `capture_reference` / `capture_port`
  record, so a point renamed, dropped, added, reordered or reshaped on either side stops the
  capture with a TraceError naming it;
- the C step's capture table: `check_native_captures` against the names the library exports
  (kernels/native checks its ctypes mirror against the C table and the struct sizes at load;
  this checks the mirror against the registry);
- the reference's coarse ladder (`reference.decode.COARSE`).

Why here, on the ladder side, and checked rather than generated: the reference restates
upstream and must know nothing of the harness, and port/ may read from reference/ only the
model's description (config, params, cact). The ladder is the one package allowed to import
both sides, so the registry lives here and every side is held to it where the ladder meets it
(at capture and at library load), which catches a drift the first time it runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ladder.model.names import TraceError, point_name

WHOLE, SITE, LAYER = "whole", "site", "layer"


@dataclass(frozen=True)
class Point:
    name: str
    scope: str                      # WHOLE: once per forward; SITE: per Engram site; LAYER
    shape: Callable                 # cfg -> one position's shape
    coarse: bool = False            # on the coarse ladder (per-layer points only; WHOLE always)
    engram_only: bool = False       # per-layer, only on layers with an Engram site


_d = lambda c: (c.d_model,)
_attn = lambda c: (c.attn_dim_eff,)
_n = lambda c: (c.mhc_lanes,)
_nn = lambda c: (c.mhc_lanes, c.mhc_lanes)

POINTS = (
    Point("embed", WHOLE, _d),
    Point("engram_k", SITE, _d),
    Point("engram_v", SITE, _d),
    Point("nx", LAYER, lambda c: (c.mhc_lanes * c.d_model,)),
    Point("hpre", LAYER, _n, coarse=True),
    Point("u", LAYER, _d, coarse=True),
    Point("alpha", LAYER, lambda c: (), coarse=True, engram_only=True),
    Point("bx", LAYER, _d, coarse=True),
    Point("h_in", LAYER, _d),
    Point("q", LAYER, lambda c: (c.num_heads, c.head_dim)),
    Point("k", LAYER, lambda c: (c.num_kv_heads, c.head_dim)),
    Point("v", LAYER, lambda c: (c.num_kv_heads, c.head_dim)),
    Point("attn", LAYER, _attn),
    Point("gate", LAYER, _attn),
    Point("attn_out", LAYER, _d),
    Point("attn_post", LAYER, _d),
    Point("mlp_in", LAYER, _d),
    Point("mlp_out", LAYER, _d),
    Point("block_out", LAYER, _d),
    Point("y", LAYER, _d, coarse=True),
    Point("hpost", LAYER, _n, coarse=True),
    Point("res_logits", LAYER, _nn),
    Point("hres", LAYER, _nn, coarse=True),
    Point("x", LAYER, lambda c: (c.mhc_lanes, c.d_model), coarse=True),
    Point("lane_mean", WHOLE, _d),
    Point("final_norm", WHOLE, _d),
    Point("logits", WHOLE, lambda c: (c.vocab_size,)),
)
BY_NAME = {p.name: p for p in POINTS}
# The coarse per-layer points in forward order (reference.decode.COARSE is held to it).
COARSE = tuple(p.name for p in POINTS if p.scope == LAYER and p.coarse)


def expected(cfg, logits: bool = True) -> list:
    """[(point name, shape)] of one forward in forward order: the whole-forward head, each
    site's key then value, every layer's points, then the tail."""
    out = []
    layer_points = [p for p in POINTS if p.scope == LAYER]
    for p in POINTS:
        if p.scope == WHOLE and p.name == "embed":
            out.append((p.name, p.shape(cfg)))
            for s in range(cfg.num_sites):
                out += [(f"{q.name}{s}", q.shape(cfg)) for q in POINTS if q.scope == SITE]
            for i in range(cfg.num_layers):
                out += [(point_name(q.name, i), q.shape(cfg)) for q in layer_points
                        if not q.engram_only or cfg.site_of_layer(i) is not None]
        elif p.scope == WHOLE and (logits or p.name != "logits"):
            out.append((p.name, p.shape(cfg)))
    return out


def check_ladder(ladder, cfg, keep=None) -> None:
    """Every step of `ladder` holds exactly the registry's points (those `keep` admits, less
    those it names hidden by fusion), in its order, each [S, *shape]; TraceError names the
    first that does not."""
    every = [(n, s) for n, s in expected(cfg) if keep is None or keep(n)]
    for st in ladder.steps:
        want = [(n, s) for n, s in every if f"{st.name}/{n}" not in ladder.hidden]
        got = ladder.points(st.name)
        names = [n for n, _ in want]
        if got != names:
            extra = [p for p in got if p not in names]
            missing = [p for p in names if p not in got]
            # name only what is wrong; a long list is cut, with its count, not silently
            said = [f"{label} {xs[:5]}" + (f" and {len(xs) - 5} more" if len(xs) > 5 else "")
                    for label, xs in (("not in it", extra), ("missing", missing)) if xs]
            raise TraceError(f"{ladder.label or 'ladder'} step {st.name}: points differ from "
                             f"the registry (ladder/model/points.py): "
                             + (", ".join(said) or "the same names, out of forward order"))
        S = len(st.tokens)
        for name, shape in want:
            v = ladder[f"{st.name}/{name}"]
            if tuple(v.shape) != (S, *shape):
                raise TraceError(f"{ladder.label or 'ladder'} {st.name}/{name}: shape "
                                 f"{list(v.shape)}, the registry says {[S, *shape]}")


def native_table() -> tuple:
    """The C step's capture table as the registry orders it: every per-layer point, then the
    whole-forward points the C side captures (the final norm and logits are the state's
    hidden vector and the logits buffer), then the per-site ones."""
    return tuple([p.name for p in POINTS if p.scope == LAYER] + ["lane_mean", "embed"]
                 + [p.name for p in POINTS if p.scope == SITE])


def check_native_captures(names: tuple) -> None:
    """The native mirror's capture table (kernels.native.CAPTURES, itself checked against the
    library's at load) against the registry."""
    want = native_table()
    if tuple(names) != want:
        raise TraceError(f"the native capture table {tuple(names)} differs from the registry's "
                         f"{want} (ladder/model/points.py)")


def check_coarse(coarse: tuple) -> None:
    """The reference's coarse ladder names against the registry's coarse per-layer points."""
    want = COARSE
    if tuple(coarse) != want:
        raise TraceError(f"reference.decode.COARSE {tuple(coarse)} differs from the "
                         f"registry's coarse points {want} (ladder/model/points.py)")
