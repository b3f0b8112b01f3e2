"""decode="graph" for the V4.1 runtime: capturable one-token steps as host prep + device body,
captured into CUDA graphs and replayed (port/graph.py's body recorder).

Two granularities. `step` serves forward(layer, ...): one graph per capturable layer (the
caller runs whatever sits between layers). `segment_step` serves forward_segment(layers, ...):
a run of consecutive capturable layers of one decode step in ONE graph, holding both selection
classes (ratio-0 layers read the window-only buffer, ratio > 0 layers the window + shared
selection buffer; decode_prep_role prepares each class present once, as the seed's
multi-layer capture does). Source layers between runs decide on the host, so runs end there.

Per step: the prep uploads position and padded selections (only what changed) and returns the
compressed rows the bodies read; the inputs are copied into static buffers; the graph for
(layers, the served sequence's ring pointers, rows pointer) is captured on first use (after a
warm-up run on a side stream, which writes the same ring slots with the same rows the replay
will) and replayed. Off CUDA the bodies run directly on the same static buffers, and
`record_body_ops` / `record_segment_ops` check they are capturable: no host synchronisation,
and the same op sequence at every position.
"""
from __future__ import annotations

import torch

from ..graph import BodyRecorder, HostSyncError, cuda_capture  # noqa: F401  (HostSyncError: re-exported)
from .ops import emit


class DecodeGraphsV41:
    def __init__(self, stack):
        self.s = stack
        self.x = {}                  # layer -> static input [1, dim]
        self.graphs = {}             # (layer(s), ring, rows_b pointers) -> (CUDAGraph, outputs)
        self.seg_x, self.seg_out = {}, {}   # layers -> static inputs / outputs [n, dim]
        self.captures = 0

    def step(self, layer, x, start_pos, tr):
        s = self.s
        rows_b = s.decode_prep(layer, start_pos)
        xs = self.x.get(layer)
        if xs is None:
            xs = self.x[layer] = torch.empty_like(x)
        xs.copy_(x)
        if s.dev.type == "cuda":
            res = self._replay(layer, xs, rows_b)
        else:
            res = s.decode_body(layer, xs, rows_b)
        if tr is not None:                      # tracing off costs nothing
            role = s.args.role(layer)
            clen = (start_pos + 1) // role.ratio if role.ratio else 0
            sel = s.last_selection.to(s.dev)
            emit(tr, layer, {k: v.clone() for k, v in res.items()}, sel[:, :s.args.window_size],
                 sel, rows_b[:clen].clone() if role.ratio else None)
        return res["out"]                  # the runtime's static output rows, no copy

    def _replay(self, layer, xs, rows_b):
        # a graph bakes the served sequence's ring and the compressed rows it reads
        key = (layer, self.s.ring[layer].data_ptr(),
               None if rows_b is None else rows_b.data_ptr())
        return self._graph(key, lambda: self.s.decode_body(layer, xs, rows_b))

    def _graph(self, key, body):
        if key not in self.graphs:
            # the warm-up writes what the replay will write (same ring slots, same rows), so
            # unlike the v2 graph nothing needs restoring afterwards
            self.graphs[key] = cuda_capture(body)
            self.captures += 1
        g, outs = self.graphs[key]
        g.replay()
        return outs

    # ---- consecutive capturable layers, one graph ----
    def segment_step(self, layers: tuple, xs, start_pos: int):
        """xs [n, dim] (the inputs of `layers`, vetted by the runtime) -> [n, dim], the
        segment's static output rows."""
        rows_b = self.segment_prep(layers, start_pos)
        buf = self.seg_x.get(layers)
        if buf is None:
            buf = self.seg_x[layers] = torch.empty_like(xs)
            self.seg_out[layers] = torch.empty_like(xs)
        buf.copy_(xs)
        if self.s.dev.type != "cuda":
            return self.segment_body(layers, rows_b)
        key = (layers, tuple(self.s.ring[i].data_ptr() for i in layers),
               None if rows_b is None else rows_b.data_ptr())
        return self._graph(key, lambda: self.segment_body(layers, rows_b))

    def segment_prep(self, layers, start_pos):
        """Host half for a segment: each selection class present, prepared once."""
        s, rows_b = self.s, None
        for ratio_positive in sorted({s.args.role(i).ratio > 0 for i in layers}):
            got = s.decode_prep_role(ratio_positive, start_pos)
            rows_b = got if ratio_positive else rows_b
        return rows_b

    def segment_body(self, layers, rows_b):
        """Device half: every layer's body in order, each output row kept in the segment's
        static output (the runtime's `out` holds one layer's rows at a time)."""
        s, xs, out = self.s, self.seg_x[layers], self.seg_out[layers]
        for j, layer in enumerate(layers):
            res = s.decode_body(layer, xs[j:j + 1],
                                rows_b if s.args.role(layer).ratio else None)
            out[j:j + 1].copy_(res["out"])
        return out


def record_body_ops(stack, layer, x, start_pos):
    """decode_prep on the host, then decode_body under a dispatch mode that refuses host syncs
    and records every op with its argument shapes: (ops, body outputs). Equal op lists at two
    positions mean one capture serves both."""
    rows_b = stack.decode_prep(layer, start_pos)
    with BodyRecorder("V4.1 decode body") as rec:
        res = stack.decode_body(layer, x, rows_b)
    return rec.ops, res


def record_segment_ops(stack, layers, xs, start_pos):
    """record_body_ops for a segment: (ops, the segment's output rows)."""
    g = stack.graphs
    layers = stack.check_segment(layers, xs, start_pos)
    rows_b = g.segment_prep(layers, start_pos)
    if layers not in g.seg_x:
        g.seg_x[layers], g.seg_out[layers] = torch.empty_like(xs), torch.empty_like(xs)
    g.seg_x[layers].copy_(xs)
    with BodyRecorder("V4.1 decode segment") as rec:
        out = g.segment_body(layers, rows_b)
    return rec.ops, out
