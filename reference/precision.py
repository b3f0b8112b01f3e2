"""The reference at a port's declared precision: the noise floor a low-precision port is judged by.

The float32 reference (and its float64 arbiter) stays the truth. Run a second time at the
precision a port declares, the same code measures how far an *honest* implementation at that
precision drifts from the truth, point by point and step by step. A port is then judged by its
error in units of that drift (ladder/engine/rule.py, `noise`).

Where this run rounds (docs/precision.md):

- weights: once, to their declared storage dtype, then held in the activation dtype;
- activations: every torch op of reference/decode.py runs in the activation dtype, so each
  op's inputs and its output are values of that dtype (a reduction or softmax torch computes in
  float32 and rounds once; a product, reference/ops.py `matmul`, multiplies in float32 and rounds
  once: the arithmetic of a kernel that loads 16-bit values, accumulates in float32, stores 16);
- RoPE tables: built in float32 and rounded once (reference/ops.py);
- the KV cache: on write, to the KV format (the activation dtype, or a named int8 scheme).

Upstream defines no int8 KV scheme in Python: the `.cact` header's `kv_bits 8` names the compiled
engine's cache width, whose quantiser is not published (specs: "the compiled engine's int8 KV
cache is not specified in Python"). The scheme here is therefore a named, pluggable choice,
KV_SCHEMES; the port implements the same scheme in its own code (port/precision.py).
"""
from __future__ import annotations

import torch

ACTIVATIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
           "cq": None}      # cq: the exactly dequantised codes, already what the port holds


def int8_absmax_row(x: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per row of head_dim (one key or value of one head at one position):
    scale = max|x| / 127 in float32, code = round-half-even(x / scale) in -127..127, and the
    cache holds code * scale (what a kernel dequantising on read computes). An all-zero row
    keeps scale 0 and reads back as zeros."""
    x32 = x.float()
    scale = x32.abs().amax(-1, keepdim=True) / 127.0
    code = torch.where(scale > 0, torch.round(x32 / torch.where(scale > 0, scale, 1.0)), 0.0)
    return (code.clamp(-127, 127) * scale).to(x.dtype)


# name -> (what the scheme is, the function from K/V values [..., hd] to what the cache holds)
KV_SCHEMES = {
    "int8": ("int8, symmetric, one float32 scale max|x|/127 per (position, head) row of "
             "head_dim, round half to even", int8_absmax_row),
}


class PrecisionError(ValueError):
    """A precision the reference cannot run at (names the field, its value and the choices)."""


def kv_store(kv: str, act: str):
    """What the cache keeps of each new key/value row at this KV format (None: the values in
    the activation dtype as they are)."""
    if kv in KV_SCHEMES:
        return KV_SCHEMES[kv][1]
    if kv not in ACTIVATIONS:
        raise PrecisionError(f"kv={kv!r}: one of {sorted(ACTIVATIONS) + sorted(KV_SCHEMES)}")
    if kv == act:
        return None
    if ACTIVATIONS[kv].itemsize > ACTIVATIONS[act].itemsize:
        raise PrecisionError(f"kv={kv} is wider than activations={act}: a cache cannot hold "
                             f"more than the values written to it")
    narrow = ACTIVATIONS[kv]
    return lambda t: t.to(narrow).to(t.dtype)


def params_at(params: dict, act: str, weights: str) -> dict:
    """The parameters as a port at this precision holds them: floating tensors rounded to the
    weights' storage dtype (cq: as given), then held in the activation dtype."""
    if act not in ACTIVATIONS:
        raise PrecisionError(f"activations={act!r}: one of {sorted(ACTIVATIONS)}")
    if weights not in WEIGHTS:
        raise PrecisionError(f"weights={weights!r}: one of {sorted(WEIGHTS)}")
    store, work = WEIGHTS[weights], ACTIVATIONS[act]
    out = {}
    for name, t in params.items():
        if t.dtype.is_floating_point:
            t = t if store is None else t.to(store)
            t = t.to(work)
        out[name] = t
    return out
