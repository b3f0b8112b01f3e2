"""Building a V2Model: from float32 parameters, from a .cact file (Cactus-Quants codes or
their dequantised rows), every part prepared once (port/weights.py, port/parts.py). The
model's classmethods (`V2Model.from_params`, `from_cact`, `from_cactfile`) call these; the
model class itself keeps the description and the arithmetic. Which form a cq model keeps
(packed codes for the C step, rows plus codes otherwise) is the backend's (`reads_codes`)."""
from __future__ import annotations

from reference import cact
from .backend import backend_class
from .cq import CqWeight
from .precision import PortPrecision, PrecisionError
from .parts import attach_codes, pack_parts, parts_from_weights
from .weights import prepare_weights

WEIGHT_FORMS = ("dense", "cq")


def from_params(cls, params: dict, cfg, weights: str = "dense", device="cpu",
                bits_map: str = "embedding=4,mhc=4,default=2", backend: str = "torch",
                decode: str = "eager", precision=None):
    """weights="dense": float32 as given; "cq": quantised as the .cact writer does
    (`bits_map`), then computed from the codes (see from_cactfile)."""
    if weights not in WEIGHT_FORMS:
        raise ValueError(f"weights={weights!r} is not one of {WEIGHT_FORMS}")
    if weights == "cq":
        return cls.from_cactfile(cact.build_cact(params, cfg, bits_map), "cq", device,
                                 backend, decode, precision)
    prec = PortPrecision.of(precision)
    model = cls._build(prec.round_weights(params), cfg, None, device, backend, decode,
                       precision=prec)
    return model


def from_cactfile(cls, f, weights: str = "cq", device="cpu", backend: str = "torch",
                  decode: str = "eager", precision=None):
    """A model over a read .cact file. "cq": every matrix stays in its codes (CqWeight,
    pre-rotation rows at load; the C step reads them packed as stored); "dense": the
    dequantised float32 matrices."""
    if weights not in WEIGHT_FORMS:
        raise ValueError(f"weights={weights!r} is not one of {WEIGHT_FORMS}")
    prec = PortPrecision.of(precision)
    if weights == "cq" and prec.weights not in ("cq", "float32"):
        raise PrecisionError(f"weights={prec.weights}: a cq model computes from its codes; "
                             f"declare weights=cq")
    cqw = None
    if weights == "cq":
        form = "packed" if backend_class(backend).reads_codes else "dense"
        cqw = {s.name: CqWeight.from_slot(s, form) for s in f.slots
               if s.dtype == cact.DTYPE_CQ}
    if cqw is not None and form == "packed":    # the C step reads the codes as stored
        w = prepare_weights(f.params, f.config, None, device)
        parts = pack_parts(parts_from_weights(w, f.config), cqw, f.config)
        model = cls.new(f.config, *parts, heads=w["heads"], device=device,
                        backend=backend, decode=decode, precision=prec)
    else:
        params = f.params if cqw is not None else prec.round_weights(f.params)
        w = prepare_weights(params, f.config, cqw, device)
        parts = parts_from_weights(w, f.config)
        if cqw is not None:             # the codes stay beside the rows (fused body)
            parts = attach_codes(parts, cqw, device)
        model = cls.new(f.config, *parts, heads=w["heads"], device=device,
                        backend=backend, decode=decode, precision=prec)
    model.tokenizer = f.tokenizer
    return model


def build(cls, params: dict, cfg, cqw, device, backend="torch", decode="eager",
          precision=None):
    w = prepare_weights(params, cfg, cqw, device)
    return cls.new(cfg, *parts_from_weights(w, cfg), heads=w["heads"], device=device,
                   backend=backend, decode=decode, precision=precision)
