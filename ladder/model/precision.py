"""What a side computes in: its declared precision, as data (docs/precision.md).

A declaration has three parts: `activations` (float32 | bfloat16 | float16), `weights` as
stored (float32 | bfloat16 | float16, or cq: the Cactus-Quants codes) and the KV cache
(float32 | bfloat16 | float16 | int8, int8 naming reference/precision.py's KV_SCHEMES entry).
Written on the CLI (`--port-precision`), in a trace archive's producer block, as a protocol
port's `precision` attribute and in a name map, in one syntax:

    bfloat16                          activations bfloat16; weights and KV cache the same
    bfloat16,kv=int8                  ... with an int8 KV cache
    act=float16,weights=cq,kv=int8    every part named

`bf16`, `fp16`, `f32` and `fp32` are accepted for the dtype names.
"""
from __future__ import annotations

from dataclasses import dataclass

ACTIVATIONS = ("float32", "bfloat16", "float16")
WEIGHTS = ("float32", "bfloat16", "float16", "cq")
KV = ("float32", "bfloat16", "float16", "int8")
ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "f32": "float32",
           "fp32": "float32", "f16": "float16"}
WIDTH = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
MAX_SPEC = 200           # characters: a declaration is a few dozen


class PrecisionError(ValueError):
    """A precision declaration that cannot be used (names the field, its value, the choices)."""


def _dtype(word: str, field: str, allowed: tuple, where: str) -> str:
    name = ALIASES.get(word, word)
    if name not in allowed:
        raise PrecisionError(f"{where}: {field}={word!r} is not one of {', '.join(allowed)}")
    return name


@dataclass(frozen=True)
class Precision:
    activations: str = "float32"
    weights: str = "float32"
    kv: str = "float32"

    def __post_init__(self):
        where = "precision"
        _dtype(self.activations, "activations", ACTIVATIONS, where)
        _dtype(self.weights, "weights", WEIGHTS, where)
        _dtype(self.kv, "kv", KV, where)
        if WIDTH[self.kv] > WIDTH[self.activations]:
            raise PrecisionError(f"{where}: kv={self.kv} is wider than activations="
                                 f"{self.activations}: a cache holds what is written to it")

    @classmethod
    def parse(cls, spec, where: str = "precision") -> "Precision":
        """A declaration string (module docstring), a dict of its parts, or a Precision."""
        if isinstance(spec, Precision):
            return spec
        if isinstance(spec, dict):
            extra = set(spec) - {"activations", "weights", "kv"}
            if extra:
                raise PrecisionError(f"{where}: unknown field {sorted(extra)[0]!r}; fields "
                                     f"are activations, weights, kv")
            if not all(isinstance(v, str) for v in spec.values()):
                raise PrecisionError(f"{where}: every field is a string, got {spec!r:.80}")
            spec = ",".join(f"{k}={v}" for k, v in spec.items())
        if not isinstance(spec, str):
            raise PrecisionError(f"{where}: a precision is a string such as 'bfloat16,kv=int8',"
                                 f" got {type(spec).__name__}")
        if not spec.strip() or len(spec) > MAX_SPEC or not spec.isascii():
            raise PrecisionError(f"{where}: {spec[:40]!r} must be 1..{MAX_SPEC} ASCII "
                                 f"characters, e.g. 'bfloat16' or 'float32,kv=int8'")
        parts = {}
        for i, item in enumerate(p.strip() for p in spec.split(",")):
            key, eq, value = item.partition("=")
            if not eq:
                if i:
                    raise PrecisionError(f"{where}: {item!r} at item {i}: after the first "
                                         f"item, write key=value (act, weights, kv)")
                key, value = "activations", item
            key = {"act": "activations", "activation": "activations",
                   "weight": "weights"}.get(key.strip(), key.strip())
            if key not in ("activations", "weights", "kv"):
                raise PrecisionError(f"{where}: unknown field {key!r} at item {i}; fields are "
                                     f"act(ivations), weights, kv")
            if key in parts:
                raise PrecisionError(f"{where}: field {key} given twice")
            allowed = {"activations": ACTIVATIONS, "weights": WEIGHTS, "kv": KV}[key]
            parts[key] = _dtype(value.strip(), key, allowed, where)
        act = parts.get("activations", "float32")
        kv_default = act
        return cls(act, parts.get("weights", act), parts.get("kv", kv_default))

    @property
    def is_float32(self) -> bool:
        """The precision the float32 rules are written for (weights as CQ codes included: the
        reference runs on the same dequantised values)."""
        return self.activations == "float32" and self.kv == "float32" \
            and self.weights in ("float32", "cq")

    def text(self) -> str:
        """The declaration in its canonical form (parse(text()) == self)."""
        return f"act={self.activations},weights={self.weights},kv={self.kv}"

    def short(self) -> str:
        """For tables and labels: 'bfloat16', 'bfloat16 (kv int8)', 'float32 (weights cq)'."""
        extra = [f"{k} {v}" for k, v in (("weights", self.weights), ("kv", self.kv))
                 if v != self.activations]
        return self.activations + (f" ({', '.join(extra)})" if extra else "")

    def to_json(self) -> dict:
        return {"activations": self.activations, "weights": self.weights, "kv": self.kv}


FLOAT32 = Precision()


def weights_contradiction(spec, prec: "Precision", form: str, weights_flag: str):
    """Why a declaration `spec` (parsed: `prec`) contradicts a run whose weights are `form`
    ("dense" or "cq", set by `weights_flag`), or None. The CLI and the plugin say it alike."""
    if prec.weights == "cq" and form != "cq":
        return (f"weights=cq declares CQ codes, and this run's weights are {form} (give "
                f"{weights_flag} cq, or drop weights=cq)")
    if form == "cq" and prec.weights != "cq" and names_weights(spec):
        return (f"weights={prec.weights} contradicts {weights_flag} cq (a CQ model's weights "
                f"are its codes); drop weights= or give {weights_flag} dense")
    return None


def names_weights(spec) -> bool:
    """Does the declaration name its weights (weights=..., a dict's weights key), rather than
    take them from the activations? A CQ model's weights are its codes whatever an implicit
    part says; only a named one can contradict them."""
    if isinstance(spec, Precision):
        return True
    if isinstance(spec, dict):
        return "weights" in spec
    return any(eq and key.strip() in ("weights", "weight")
               for key, eq, _ in (item.partition("=") for item in str(spec).split(",")))

