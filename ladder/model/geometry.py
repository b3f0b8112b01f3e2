"""A model's geometry as other implementations state it, and the registry's view of it.

needle-rs's fixture and our trace archives carry the same ten geometry fields (plus the
attention window); `V2Config.to_dict()` carries more. A foreign file may state only these ten,
so the registry's shapes (ladder/model/points.py) are computed from `Geometry`, a view built from
either, and two sides are compared on the fields both state.
"""
from __future__ import annotations

from dataclasses import dataclass

GEOMETRY_FIELDS = ("d_model", "num_heads", "num_kv_heads", "num_layers", "head_dim",
                   "mhc_lanes", "engram_layers", "engram_orders", "rope_theta", "vocab_size")
MAX_DIM = 1 << 20               # any one geometry number; the shipped model's largest is 8192
MAX_LAYERS = 99                 # point names carry two layer digits (L07.y)


class GeometryError(ValueError):
    """A geometry that is missing, mistyped or out of range (names the field and value)."""


def geometry_of(cfg) -> dict:
    """The ten fields of a V2Config (or anything with its attributes), JSON-ready."""
    return {"d_model": int(cfg.d_model), "num_heads": int(cfg.num_heads),
            "num_kv_heads": int(cfg.num_kv_heads), "num_layers": int(cfg.num_layers),
            "head_dim": int(cfg.head_dim), "mhc_lanes": int(cfg.mhc_lanes),
            "engram_layers": [int(i) for i in cfg.engram_layers],
            "engram_orders": [int(o) for o in cfg.engram_orders],
            "rope_theta": float(cfg.rope_theta), "vocab_size": int(cfg.vocab_size)}


@dataclass(frozen=True)
class Geometry:
    """What the point registry needs of a model: the shapes of its points."""
    d_model: int
    num_heads: int
    num_kv_heads: int
    num_layers: int
    head_dim: int
    mhc_lanes: int
    engram_layers: tuple
    engram_orders: tuple
    rope_theta: float
    vocab_size: int

    @property
    def attn_dim_eff(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def num_sites(self) -> int:
        return len(self.engram_layers)

    def site_of_layer(self, layer: int):
        return self.engram_layers.index(layer) if layer in self.engram_layers else None

    def to_dict(self) -> dict:
        return geometry_of(self)


def _int(where, name, v, lo, hi) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        shown = repr(v) if len(repr(v)) <= 40 else repr(v)[:37] + "..."
        raise GeometryError(f"{where}: field geometry.{name}={shown} must be an integer in "
                            f"{lo}..{hi}")
    return v


def parse_geometry(d, where: str) -> Geometry:
    """A Geometry from a JSON object, every field typed and ranged (GeometryError names it)."""
    if not isinstance(d, dict):
        raise GeometryError(f"{where}: field geometry must be an object")
    missing = [f for f in GEOMETRY_FIELDS if f not in d]
    if missing:
        raise GeometryError(f"{where}: field geometry lacks {missing[0]!r}")
    g = {}
    for name in ("d_model", "num_heads", "num_kv_heads", "head_dim", "mhc_lanes", "vocab_size"):
        g[name] = _int(where, name, d[name], 1, MAX_DIM)
    g["num_layers"] = _int(where, "num_layers", d["num_layers"], 1, MAX_LAYERS)
    for name in ("engram_layers", "engram_orders"):
        v = d[name]
        if not isinstance(v, list) or len(v) > MAX_LAYERS:
            raise GeometryError(f"{where}: field geometry.{name} must be a list of at most "
                                f"{MAX_LAYERS} integers")
        g[name] = tuple(_int(where, f"{name}[{i}]", x, 0, MAX_DIM) for i, x in enumerate(v))
    bad = [i for i in g["engram_layers"] if i >= g["num_layers"]]
    if bad or len(set(g["engram_layers"])) != len(g["engram_layers"]):
        raise GeometryError(f"{where}: field geometry.engram_layers={list(g['engram_layers'])} "
                            f"must name distinct layers below num_layers={g['num_layers']}")
    theta = d["rope_theta"]
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < 1e300:
        raise GeometryError(f"{where}: field geometry.rope_theta={theta!r} must be a positive "
                            f"number")
    g["rope_theta"] = float(theta)
    return Geometry(**g)


def geometry_mismatch(a: dict, b: dict):
    """(field, a's value, b's value) of the first field both state and disagree on, else None."""
    for f in GEOMETRY_FIELDS:
        if f in a and f in b:
            va, vb = a[f], b[f]
            if isinstance(va, (list, tuple)) and isinstance(vb, (list, tuple)):
                va, vb = list(va), list(vb)     # a tuple and a list of one geometry agree
            if va != vb:
                return f, a[f], b[f]
    return None
