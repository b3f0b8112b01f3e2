"""The noise-floor reference: the reference run again at a side's declared precision.

The float32 reference is the truth a port is compared with; this second run, of the same code at
the port's precision (reference/precision.py: weights rounded to their storage dtype, every op
in the activation dtype, the KV cache written in its format), measures how far an honest
implementation at that precision drifts from the truth at every point and step. Rules written
in noise units (ladder/engine/rule.py, `noise`) allow a multiple of that drift.
"""
from __future__ import annotations

from ladder.engine.trace import Ladder
from ladder.model.precision import Precision


def floor_params(params: dict, precision: Precision) -> dict:
    """The reference's parameters as a port at `precision` holds them."""
    from reference.precision import params_at
    return params_at(params, precision.activations, precision.weights)


def floor_kv_store(precision: Precision):
    from reference.precision import kv_store
    return kv_store(precision.kv, precision.activations)


def capture_floor(params, cfg, tokens, prompt_len: int, precision: Precision, *, window=None,
                  keep=None, progress=None) -> Ladder:
    """The reference's ladder at `precision` (its values in the activation dtype)."""
    from ladder.sides.capture import capture_reference
    precision = Precision.parse(precision)
    return capture_reference(floor_params(params, precision), cfg, tokens, prompt_len,
                             window=window, keep=keep, progress=progress,
                             label=f"noise floor (reference at {precision.short()})",
                             kv_store=floor_kv_store(precision))
