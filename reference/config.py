"""needle v2 geometry: upstream's config fields plus every derived quantity (spec §a)."""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field, fields

MIB = 1024 * 1024
ENGRAM_TAPS = 4          # causal dilated conv taps, fixed upstream
CQ_GROUP = 128           # .cact quantisation group
MAX_INT = 2 ** 31 - 1    # every integer field: an i32 (the .cact header stores u32)
MAX_ENGRAM_ORDER = 64    # n-gram order (and Engram dilation); upstream uses 2 and 3
MAX_ENGRAM_ORDERS = 16
DTYPES = ("float32", "bfloat16", "float16", "float64")


class ConfigError(ValueError):
    """A configuration that needle v2 cannot run (names the field and the limit)."""


@dataclass(frozen=True, init=False)
class V2Config:
    vocab_size: int = 8192
    d_model: int = 512
    attn_dim: int = 0                 # 0 means d_model
    num_heads: int = 8
    num_kv_heads: int = 4
    num_layers: int = 12              # upstream's class default; the shipped model has 27
    max_seq_len: int = 2048
    pad_token_id: int = 0
    contrastive_dim: int = 128
    rope_theta: float = 100000.0
    dtype: str = "bfloat16"           # training-graph compute dtype; decode is always f32
    flash: bool = True
    engram_orders: tuple = (2, 3)
    engram_heads: int = 0             # 0 means auto
    engram_slots: int = 8192
    engram_layers: tuple = (2, 15)
    mhc_lanes: int = 4
    kv_window: int = 0                # 0: no window of its own, the KV budget (effective_kv_window)
    kv_bits: int = 8
    act_bits: int = 8
    weight_bits: str = ""
    remat: bool = True
    scan_unroll: int = 1

    def __init__(self, **fields_):
        # Upstream's TransformerConfig ignores unknown keys; so do we. Known keys are checked
        # for type before anything derives from them (a string "8" would otherwise surface as
        # a TypeError deep in a property).
        known = {f.name: f for f in fields(V2Config)}
        for name, f in known.items():
            value = fields_.get(name, f.default)
            object.__setattr__(self, name, _typed(name, value))
        self._validate()

    def _validate(self):
        def need(cond, what):
            if not cond:
                raise ConfigError(what)
        for name in ("vocab_size", "d_model", "num_heads", "num_kv_heads", "num_layers",
                     "max_seq_len", "engram_slots", "mhc_lanes", "scan_unroll"):
            v = getattr(self, name)
            need(v >= 1, f"{name}={v!r} must be an integer >= 1")
        need(self.attn_dim >= 0, f"attn_dim={self.attn_dim} must be >= 0")
        need(self.num_heads <= self.attn_dim_eff,
             f"num_heads={self.num_heads} must be <= attn_dim={self.attn_dim_eff}")
        need(self.attn_dim_eff % self.num_heads == 0,
             f"attn_dim={self.attn_dim_eff} must be a multiple of num_heads={self.num_heads}")
        need(self.head_dim % 2 == 0, f"head_dim={self.head_dim} must be even (half-split RoPE)")
        need(self.num_heads % self.num_kv_heads == 0,
             f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        need(1 <= len(self.engram_orders) <= MAX_ENGRAM_ORDERS,
             f"engram_orders={self.engram_orders} must hold 1..{MAX_ENGRAM_ORDERS} orders")
        for i, order in enumerate(self.engram_orders):
            # The hash of an order-o n-gram costs o steps per position and the taps reach
            # 3*o back, so the order also scales every Engram window; upstream uses 2 and 3.
            need(1 <= order <= MAX_ENGRAM_ORDER,
                 f"engram_orders[{i}]={order} outside 1..{MAX_ENGRAM_ORDER}")
        need(len(self.engram_layers) <= self.num_layers,
             f"engram_layers has {len(self.engram_layers)} entries, more than num_layers="
             f"{self.num_layers}")
        for s, layer in enumerate(self.engram_layers):
            need(0 <= layer < self.num_layers,
                 f"engram_layers[{s}]={layer} outside 0..num_layers-1={self.num_layers - 1}")
        need(len(set(self.engram_layers)) == len(self.engram_layers),
             f"engram_layers={self.engram_layers} repeats a layer")
        need(self.engram_sub >= 1, f"engram sub-dim d_model // tables = {self.engram_sub} must be >= 1")
        need(self.kv_window >= 0, f"kv_window={self.kv_window} must be >= 0")
        need(0 <= self.pad_token_id < self.vocab_size,
             f"pad_token_id={self.pad_token_id} outside 0..vocab_size-1={self.vocab_size - 1} "
             f"(a token id)")
        need(math.isfinite(self.rope_theta) and self.rope_theta > 0,
             f"rope_theta={self.rope_theta!r} must be finite and > 0")
        # below 1 the frequencies base^(-2k/d) grow with k; below ~1e-38 they overflow float32
        # and every angle is NaN (a run that "fails" instead of a refused input)
        need(1.0 <= self.rope_theta <= 1e30,
             f"rope_theta={self.rope_theta!r} outside 1..1e30 (the RoPE base: frequencies "
             f"base^(-2k/head_dim) must not grow, nor underflow float32)")
        need(self.dtype in DTYPES, f"dtype={self.dtype!r} must be one of {DTYPES}")
        for name in ("kv_bits", "act_bits"):
            v = getattr(self, name)
            need(0 <= v <= 32, f"{name}={v} outside 0..32")

    # ---- derived quantities (spec §a.2) ----
    @property
    def attn_dim_eff(self) -> int:
        return self.attn_dim or self.d_model

    @property
    def head_dim(self) -> int:
        return self.attn_dim_eff // self.num_heads

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rep(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def engram_heads_eff(self) -> int:
        return self.engram_heads or max(1, self.d_model // (len(self.engram_orders) * 128))

    @property
    def engram_tables(self) -> int:
        return len(self.engram_orders) * self.engram_heads_eff

    @property
    def engram_sub(self) -> int:
        return self.d_model // self.engram_tables

    @property
    def engram_fetched(self) -> int:
        return self.engram_tables * self.engram_sub

    @property
    def engram_taps(self) -> int:
        return ENGRAM_TAPS

    @property
    def engram_dilation(self) -> int:
        return max(self.engram_orders)

    @property
    def engram_hist_window(self) -> int:
        """Decode's Engram history window W = taps * dilation."""
        return ENGRAM_TAPS * self.engram_dilation

    @property
    def num_sites(self) -> int:
        return len(self.engram_layers)

    @property
    def hada_n(self) -> int:
        return 1 << (self.d_model - 1).bit_length()

    @property
    def stream_dim(self) -> int:
        return self.mhc_lanes * self.d_model

    def active_lane(self, layer: int) -> int:
        return layer % self.mhc_lanes

    def site_of_layer(self, layer: int):
        """Engram site index carried by `layer`, or None."""
        return self.engram_layers.index(layer) if layer in self.engram_layers else None

    @property
    def kv_bytes_per_pos(self) -> int:
        # int8 K and V plus an f32 scale per 32 values, for every layer; int8 Engram rows per site.
        return (self.num_layers * (2 * self.kv_dim + 2 * (self.kv_dim // 32) * 4)
                + self.num_sites * (self.d_model + (self.d_model // 32) * 4))

    @property
    def kv_budget(self) -> int:
        fit = (int(11.5 * MIB) // self.kv_bytes_per_pos) // 32 * 32
        return max(160, min(self.max_seq_len, fit))

    @property
    def effective_kv_window(self) -> int:
        return min(self.kv_budget, self.kv_window) if self.kv_window else self.kv_budget

    # ---- presets, JSON ----
    @classmethod
    def preset(cls, name: str) -> "V2Config":
        if name not in PRESETS:
            raise ConfigError(f"unknown preset {name!r}; known: {sorted(PRESETS)}")
        return cls(**PRESETS[name])

    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["engram_orders"] = list(self.engram_orders)
        out["engram_layers"] = list(self.engram_layers)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text, where: str = "config JSON") -> "V2Config":
        """From JSON text (str or bytes), parsed with bounded nesting and number sizes."""
        from bounded.io import parse_json
        data = parse_json(text, where, ConfigError)
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: must be a JSON object, got {type(data).__name__}")
        return cls.from_file_fields(data, where)

    @classmethod
    def from_file_fields(cls, data: dict, where: str | None = "config") -> "V2Config":
        """From a config a file carries: as the constructor, but a key that is not a field is
        refused, naming it and the field it looks like (a look-alike `kv_window` would
        otherwise leave the default 0 and run a full-causal model). `where` prefixes the
        message (None: the caller adds its own)."""
        import difflib
        pre = "" if where is None else f"{where}: "
        known = [f.name for f in fields(cls)]
        for key in data:
            if key not in known:
                near = difflib.get_close_matches(key, known, n=1, cutoff=0.6) \
                    if len(key) <= 64 else []
                hint = f" (did you mean {near[0]!r}?)" if near else ""
                shown = repr(key) if len(repr(key)) <= 60 else repr(key)[:57] + "..."
                raise ConfigError(f"{pre}unknown field {shown}{hint}; known: "
                                  f"{', '.join(known)}")
        try:
            return cls(**data)
        except ConfigError as e:
            raise ConfigError(f"{pre}{e}") from None

    def replace(self, **changes) -> "V2Config":
        return V2Config(**{**self.to_dict(), **changes})

    def geometry_diff(self, other: "V2Config") -> list:
        """Names of the fields (upstream's) on which two configs disagree."""
        return [f.name for f in fields(self) if getattr(self, f.name) != getattr(other, f.name)]


_BOOLS = ("flash", "remat")
_STRS = ("dtype", "weight_bits")
_SEQS = ("engram_orders", "engram_layers")


def _typed(name: str, value):
    """`value` as the field's type, or ConfigError naming the field, value and type."""
    def bad(want):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        raise ConfigError(f"field {name}={shown} ({type(value).__name__}) must be {want}")

    def integer(v, label):
        if isinstance(v, bool) or not isinstance(v, int):
            bad(f"{label}integers" if label else "an integer")
        if not -MAX_INT <= v <= MAX_INT:
            bad(f"{label}integers in -{MAX_INT}..{MAX_INT}" if label else
                f"an integer in -{MAX_INT}..{MAX_INT}")
        return v

    if name in _BOOLS:
        return value if isinstance(value, bool) else bad("true or false")
    if name in _STRS:
        return value if isinstance(value, str) and len(value) <= 64 else bad("a string")
    if name == "rope_theta":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            bad("a number")
        try:
            return float(value)
        except OverflowError:
            bad("a finite number")
    if name in _SEQS:
        if not isinstance(value, (list, tuple)) or len(value) > 64:
            bad("a list of at most 64 integers")
        return tuple(integer(v, "a list of ") for v in value)
    return integer(value, "")


PRESETS = {
    # The released needle2 geometry (.cact header: window 256, kv_bits 8).
    "shipped": dict(vocab_size=8192, d_model=512, attn_dim=512, num_heads=8, num_kv_heads=4,
                    num_layers=27, max_seq_len=2048, engram_orders=(2, 3), engram_heads=0,
                    engram_slots=8192, engram_layers=(2, 15), mhc_lanes=4, kv_window=256,
                    kv_bits=8, rope_theta=100000.0, dtype="float32"),
    # Small but complete: d not a power of two (Hadamard padding, CQ group padding), head_dim
    # whose sqrt is inexact (decode's divide vs the training graph's multiply), GQA rep 2,
    # 6 layers over 4 lanes (every lane active, two twice), two Engram sites, window 8 so
    # test sequences wrap, a prime slot count.
    "tiny": dict(vocab_size=256, d_model=48, attn_dim=0, num_heads=4, num_kv_heads=2,
                 num_layers=6, max_seq_len=64, engram_orders=(2, 3), engram_heads=0,
                 engram_slots=97, engram_layers=(1, 4), mhc_lanes=4, kv_window=8,
                 kv_bits=8, rope_theta=10000.0, dtype="float32", contrastive_dim=16),
}
