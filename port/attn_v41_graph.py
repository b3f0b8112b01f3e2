"""decode="graph" for the V4.1 runtime: capturable one-token steps as host prep + device body,
the body captured once per layer into a CUDA graph and replayed (port/graph.py's machinery,
per layer because source layers between them decide on the host).

Per step and capturable layer: `decode_prep` uploads position and padded selection (only what
changed) and returns the compressed rows the body reads; the layer input is copied into a static
buffer; the graph for (layer, rows pointer) is captured on first use (after a warm-up run on a
side stream, which writes the same ring slot with the same row the replay will) and replayed.
Off CUDA the body runs directly on the same static buffers, and `record_body_ops` checks it is
capturable: no host synchronisation, and the same op sequence at every position.
"""
from __future__ import annotations

import torch

from .graph import BodyRecorder, HostSyncError  # noqa: F401  (HostSyncError: re-exported)


class DecodeGraphsV41:
    def __init__(self, stack):
        self.s = stack
        self.x = {}                  # layer -> static input [1, dim]
        self.graphs = {}             # (layer, ring, rows_b pointers) -> (CUDAGraph, outputs)
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
            from .attn_v41 import emit
            emit(tr, layer, {k: v.clone() for k, v in res.items()}, sel[:, :s.args.window_size],
                 sel, rows_b[:clen].clone() if role.ratio else None)
        return res["out"]                  # the runtime's static output rows, no copy

    def _replay(self, layer, xs, rows_b):
        # a graph bakes the served sequence's ring and the compressed rows it reads
        key = (layer, self.s.ring[layer].data_ptr(),
               None if rows_b is None else rows_b.data_ptr())
        if key not in self.graphs:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.s.decode_body(layer, xs, rows_b)
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                outs = self.s.decode_body(layer, xs, rows_b)
            self.graphs[key] = (g, outs)
            self.captures += 1
        g, outs = self.graphs[key]
        g.replay()
        return outs


def record_body_ops(stack, layer, x, start_pos):
    """decode_prep on the host, then decode_body under a dispatch mode that refuses host syncs
    and records every op with its argument shapes: (ops, body outputs). Equal op lists at two
    positions mean one capture serves both."""
    rows_b = stack.decode_prep(layer, start_pos)
    with BodyRecorder("V4.1 decode body") as rec:
        res = stack.decode_body(layer, x, rows_b)
    return rec.ops, res
