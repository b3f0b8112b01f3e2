"""The port at a lower precision: bfloat16 or float16 activations, a 16-bit or int8 KV cache.

How a fused kernel at that precision computes, and so how this port does (the torch backend,
eager decode): every tensor the step *stores* between its sublayers (each ladder point: the
lanes, the norms' outputs, q/k/v, the attention output, the MLP's, the logits) is a value of
the activation dtype; the arithmetic producing it runs in float32 on values of that dtype and
rounds once, on the store. Weights are rounded once at load to their storage dtype. Keys and
values are stored in the KV format on the ring write (int8: the scheme below), and attention
reads what the ring holds.

This is the port's own code (docs/design.md, "Layout"): the reference's noise-floor run
(reference/precision.py) rounds at every torch op instead, so the two place their roundings
differently, as two honest implementations at one precision do.

int8 KV (the same named scheme as the reference's "int8", written here independently):
symmetric, one float32 scale per (position, head) row of head_dim, scale = max|x| / 127,
code = round-half-even(x / scale), the ring holding code * scale.
"""
from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHT_STORES = ("float32", "bfloat16", "float16", "cq")
KV_FORMATS = ("float32", "bfloat16", "float16", "int8")


class PrecisionError(ValueError):
    """A precision the port cannot run at (names the field, the value and the choices)."""


def _identity(x):
    return x


def _rounder(dtype):
    def store(x):
        return x.to(dtype).to(torch.float32)
    return store


def _int8_rows(x):
    """int8 symmetric per row of the last axis; returns the dequantised float32 values."""
    top = x.abs().amax(-1, keepdim=True)
    scale = top / 127.0
    safe = torch.where(top > 0, scale, torch.ones_like(scale))
    code = torch.round(x / safe).clamp(-127.0, 127.0)
    return torch.where(top > 0, code * scale, torch.zeros_like(x))


class PortPrecision:
    """activations, weights (storage) and kv, each a name from the tuples above."""

    def __init__(self, activations="float32", weights=None, kv=None):
        if activations not in DTYPES:
            raise PrecisionError(f"activations={activations!r}: one of {sorted(DTYPES)}")
        weights = activations if weights is None else weights
        kv = activations if kv is None else kv
        if weights not in WEIGHT_STORES:
            raise PrecisionError(f"weights={weights!r}: one of {list(WEIGHT_STORES)}")
        if kv not in KV_FORMATS:
            raise PrecisionError(f"kv={kv!r}: one of {list(KV_FORMATS)}")
        if kv in DTYPES and DTYPES[kv].itemsize > DTYPES[activations].itemsize:
            raise PrecisionError(f"kv={kv} is wider than activations={activations}")
        self.activations, self.weights, self.kv = activations, weights, kv
        act = DTYPES[activations]
        self.store = _identity if act == torch.float32 else _rounder(act)
        if kv == "int8":
            self.kv_store = (lambda x: self.store(_int8_rows(x)))
        elif kv == activations:
            self.kv_store = _identity          # already rounded on the store before the write
        else:
            self.kv_store = _rounder(DTYPES[kv])

    @classmethod
    def of(cls, spec) -> "PortPrecision":
        """A PortPrecision, None (float32), a dtype name, or a dict of the three fields."""
        if spec is None:
            return cls()
        if isinstance(spec, PortPrecision):
            return spec
        if isinstance(spec, str):
            return cls(spec)
        if isinstance(spec, dict):
            extra = set(spec) - {"activations", "weights", "kv"}
            if extra:
                raise PrecisionError(f"unknown precision field {sorted(extra)[0]!r}")
            return cls(**spec)
        raise PrecisionError(f"precision={spec!r}: a dtype name or a dict of activations, "
                             f"weights, kv")

    @property
    def is_float32(self) -> bool:
        """Nothing rounded anywhere (CQ codes are the weights as given)."""
        return self.activations == "float32" and self.kv == "float32" \
            and self.weights in ("float32", "cq")

    def round_weights(self, params: dict) -> dict:
        """Dense parameters as stored at `weights` (every floating tensor rounded once)."""
        if self.weights in ("float32", "cq"):
            return params
        dt = DTYPES[self.weights]
        return {k: (v.to(dt).to(torch.float32) if v.dtype.is_floating_point else v)
                for k, v in params.items()}

    def to_dict(self) -> dict:
        return {"activations": self.activations, "weights": self.weights, "kv": self.kv}

    def __repr__(self):
        return f"PortPrecision({self.activations}, weights={self.weights}, kv={self.kv})"
