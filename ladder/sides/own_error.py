"""The systematic sums of every op's own error: the port's recorded value of each point against
the reference's op re-run on the port's recorded inputs (op_replay.py), in float32 arithmetic
on what the port declares it stores (truth_replayer).

What the chained statistics (ladder/engine/systematic.py) test as d = a - f against the
reference x = b over the whole run, these test with both b and f replaced by the op's replay
(d = a - replay, against the replay): no floor, since a round-to-nearest port departs from an
exact op without a direction. The same estimators, the same clusters (positions), the same
margins, one Holm family with the chained tests (ladder/engine/systematic_verdict.py). Their
spread is one op's rounding, not everything upstream of it, so the same positions resolve a
scale several times smaller (docs/precision.md, "Own-op statistics").

The recording is read a chunk of positions at a time (consecutive steps, CHUNK positions at
most): memory stays one chunk plus the attention's window of recorded keys and values.
"""
from __future__ import annotations

import torch

from ladder.engine.systematic import Systematic
from ladder.engine.systematic_verdict import point_sums
from ladder.model.names import point_name
from ladder.model.points import LAYER, POINTS
from ladder.sides.op_replay import Replayer

CHUNK = 64               # positions replayed together (one batched op call per chunk)
LAYER_POINTS = tuple(p.name for p in POINTS if p.scope == LAYER)


def truth_replayer(params, cfg, precision) -> Replayer:
    """The reference's ops in float32 arithmetic on what a port at `precision` stores: its
    parameters rounded to the weights' dtype, its keys and values in the cache's format. What
    an op computes exactly (to float32) from the port's own inputs and weights: a port that
    rounds to nearest departs from it without a direction, however often or in whatever order
    it rounds, so the test needs no floor (docs/precision.md, "Own-op statistics")."""
    if precision is None or precision.is_float32:
        return Replayer(params, cfg, torch.float32)
    from reference.precision import kv_store, params_at
    return Replayer(params_at(params, "float32", precision.weights), cfg, torch.float32,
                    kv_store(precision.kv, "float32"))


class _Window:
    """The recorded keys and values of one layer at the positions its next queries can see."""

    def __init__(self, window: int):
        self.window, self.k, self.v = window, {}, {}

    def add(self, positions, k, v):
        for j, p in enumerate(positions):
            self.k[p], self.v[p] = k[j], v[j]

    def span(self, p: int) -> range:
        return range(max(0, p - self.window + 1) if self.window else 0, p + 1)

    def gather(self, positions, rep: Replayer):
        """([S, M, KV, hd] keys, values, [S, M] allowed) or None when a key is missing."""
        spans = [self.span(p) for p in positions]
        if any(q not in self.k for s in spans for q in s):
            return None
        lo, hi = min(s.start for s in spans), max(positions)
        cols = list(range(lo, hi + 1))
        zero = torch.zeros_like(next(iter(self.k.values())))
        K = torch.stack([self.k.get(q, zero) for q in cols])
        V = torch.stack([self.v.get(q, zero) for q in cols])
        K, V = rep.stored(K), rep.stored(V)
        c = torch.tensor(cols)
        lo_hi = torch.tensor([[s.start, s.stop - 1] for s in spans])
        allowed = (c[None] >= lo_hi[:, :1]) & (c[None] <= lo_hi[:, 1:])
        S = len(positions)
        return (K[None].expand(S, *K.shape), V[None].expand(S, *V.shape), allowed)

    def forget_before(self, p: int):
        if self.window:
            for q in [q for q in self.k if q < p - self.window + 1]:
                del self.k[q], self.v[q]


def own_sums(port, params, cfg, precision, window: int, chunk: int = CHUNK) -> Systematic:
    """Systematic sums of every replayable op of `port` (a Ladder), keyed by point name;
    `chunk`: positions per batched replay (1: each step alone, as the reference ran it)."""
    truth = truth_replayer(params, cfg, precision)
    store = torch.float32 if precision is None else getattr(torch, precision.activations)
    sysm = Systematic()
    wins = [_Window(window) for _ in range(cfg.num_layers)]
    last = port.captured == "last"
    buf, held = [], 0
    for step in port.steps:
        buf.append(step)
        held += 1 if last else len(step.positions)
        if held >= chunk:
            _replay(port, buf, last, truth, cfg, wins, sysm, store)
            buf, held = [], 0
    if buf:
        _replay(port, buf, last, truth, cfg, wins, sysm, store)
    return sysm


def _replay(port, steps, last, truth, cfg, wins, sysm, store):
    positions = [p for s in steps for p in ([s.positions[-1]] if last else s.positions)]

    seen = {}

    def rec(point):                  # each point's chunk joined once (x is read twice)
        if point not in seen:
            seen[point] = _joined(point)
        return seen[point]

    def _joined(point):
        parts = []
        for s in steps:
            k = f"{s.name}/{point}"
            if k not in port.values:
                return None
            parts.append(port.values[k])
        t = torch.cat(parts) if len(parts) > 1 else parts[0]
        return t if t.is_floating_point() and t.shape[0] == len(positions) else None
    S = len(positions)
    items = []                       # (point, recorded, replayed, direction) of the chunk
    for i in range(cfg.num_layers):
        site = cfg.site_of_layer(i)
        prev = rec(point_name("x", i - 1)) if i else rec("embed")
        if prev is not None and not i:
            prev = prev[:, None, :].expand(S, cfg.mhc_lanes, cfg.d_model)
        got = {name: rec(point_name(name, i)) for name in LAYER_POINTS}
        got["x_in"] = prev
        if site is not None:
            got["engram_k"], got["engram_v"] = rec(f"engram_k{site}"), rec(f"engram_v{site}")
        win = wins[i]
        if got["k"] is not None and got["v"] is not None and not last:
            win.add(positions, got["k"].float(), got["v"].float())
        kv = None if last else win.gather(positions, truth)
        dirs = {}
        _add(items, i, got, truth.layer(i, got.get, positions, kv, dirs), dirs, store)
        win.forget_before(max(positions) + 1)
    tail_got = {n: rec(n) for n in ("lane_mean", "final_norm", "logits")}
    tail_got[point_name("x", cfg.num_layers - 1)] = rec(point_name("x", cfg.num_layers - 1))
    _add(items, None, tail_got, truth.tail(tail_got.get))
    for point, a, b, direction in items:     # one point at a time: each fits in the cache
        point_sums(sysm, point, a, b, None, direction)


def _add(items, layer, got, replayed, dirs=None, store=torch.float32):
    """The port's recorded values against its ops' replays: d = a - b against b; an
    iterative op's also along its one-iteration-short direction, from the replay as a
    record at the declared dtype stores it."""
    for name, b in replayed.items():
        a = got.get(name)
        if a is not None:
            g = (dirs or {}).get(name)
            direction = None if g is None else (b.to(store).float(), g.float())
            items.append((point_name(name, layer), a, b, direction))
