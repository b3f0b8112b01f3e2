"""Injection, the ladder's local-vs-propagated split: one layer re-run alone on given lanes at
a position already stepped, through the implementation under test (the C layer for
backend="native", the fused layer for backend="triton", the graph body's layer for
decode="graph", else V2Model.layer)."""
from __future__ import annotations

from .model import StepError
from .state import V2State


def step_layer(model, i: int, lanes, state: V2State, pos: int, *, engram=None, trace=None,
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
    if model.backend == "native":
        from .native import run_layer
        return run_layer(model, model._native, i, lanes, state, pos, engram, trace)
    if engram is None:
        engram = model.engram(state.clone(), pos, 1)
    eng = [(k.reshape(1, -1).to(state.k), v.reshape(1, -1).to(state.k)) for k, v in engram]
    X = lanes.reshape(1, model.cfg.mhc_lanes, model.cfg.d_model).to(state.k)
    if model.backend == "triton" and pos and not prefill and model.uses_body(state):
        rt = state.attn_runtime(model)        # as the fused body runs a decode layer
        rt.invalidate_decode_uploads()
        rt.decode_prep(i, pos)
        return model.fused.layer(i, X[0], [(k[0], v[0]) for k, v in eng], state, rt,
                                 trace=trace)
    if model.decode == "graph" and pos and not prefill and state.window and not state.pad_aware:
        rt = state.attn_runtime(model)        # as DecodeGraph.body runs a layer
        rt.invalidate_decode_uploads()
        rt.decode_prep(i, pos)
        cos = model.cos.index_select(0, rt.pos)[:, None, :]
        sin = model.sin.index_select(0, rt.pos)[:, None, :]
        return model.layer(i, X, eng, state, 0, cos, sin, trace=trace,
                           attention=rt.decode_body)[0]
    cos, sin = model.cos[pos:pos + 1, None, :], model.sin[pos:pos + 1, None, :]
    return model.layer(i, X, eng, state, pos, cos, sin, trace=trace)[0]
