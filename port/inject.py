"""Injection, the ladder's local-vs-propagated split: one layer re-run alone on given lanes at
a position already stepped, through the implementation under test: the backend's `step_layer` (port/backend.py: the C
layer for backend="native", the fused layer for backend="triton", the graph body's layer for
decode="graph", else V2Model.layer)."""
from __future__ import annotations

from .errors import StepError


def step_layer(model, i: int, lanes, state, pos: int, *, engram=None, trace=None,
               prefill: bool = False):
    """Run only layer `i` at position `pos` (already stepped into `state`) on the given lanes
    [n, d], with `engram` = [(k [d], v [d]) per site] (default: recomputed from the state's
    tokens). Runs the implementation under test: the C layer for backend="native"
    (port/native.py run_layer), the graph body's layer (attention from the runtime's static
    buffers, `decode_body`) where decode="graph" steps run it, else V2Model.layer (whose
    attention goes through the backend's kernel). Overwrites that layer's K/V at `pos`: pass
    `state.clone()`. prefill=True: the position was computed as a prefill (`rows`), so it
    re-runs that arithmetic even where a decode step would take a body. Returns the lanes
    after the layer."""
    if not 0 <= i < model.cfg.num_layers or not 0 <= pos < state.pos:
        raise StepError(f"layer {i} / position {pos} outside 0..{model.cfg.num_layers - 1}"
                        f" / 0..{state.pos - 1}")
    return model.impl.step_layer(i, lanes, state, pos, engram, trace, prefill)
