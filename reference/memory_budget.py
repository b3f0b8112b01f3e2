"""What a needle v2 geometry makes a run allocate, checked against a budget before allocating.

Header and config fields drive allocations directly: the port precomputes RoPE angles for every
position up to `max_seq_len`, a full-causal KV ring holds `max_seq_len` slots per layer, the
Engram value ring reaches (taps - 1) * dilation positions back, and the parameter tensors follow
vocab_size, d_model, engram_slots... A 94 KB file can declare tens of gigabytes. `check_memory`
adds up those allocations (float32, one copy of each) and refuses a geometry whose total exceeds
the budget, naming the largest term, its field and value. It also refuses a kv_window wider
than the KV budget (spec §a.2), which upstream never decodes with and which makes every step's
attention span the whole window.

The budget is DEFAULT_MAX_MEMORY unless the caller passes one (`--max-memory` in the CLIs). The
estimate is of one model's tables; a ladder run holds the parameters a few times over (the
reference, the port, a float64 arbiter), so its resident set is a small multiple of the
estimate: the shipped geometry estimates ~0.3 GB and a ladder run on it stays near 1.5 GB.
"""
from __future__ import annotations

import math

from bounded.size import (DEFAULT_MAX_MEMORY, GIB, cli_size, fmt_bytes as _fmt,  # noqa: F401
                          parse_size)

from .config import ConfigError, V2Config
from .param_layout import param_shapes

F32 = 4


class MemoryBudgetError(ConfigError):
    """A geometry whose tables would not fit the memory budget (names the field and bytes)."""


def implied_bytes(cfg: V2Config) -> dict:
    """{term: (bytes, field it follows, formula)} for the allocations the geometry implies."""
    hd, L = cfg.head_dim, cfg.num_layers
    params = sum(math.prod(s) for s in param_shapes(cfg, heads=True).values()) * F32
    ring = (cfg.engram_taps - 1) * cfg.engram_dilation + 1
    return {
        "parameters": (params, "vocab_size/d_model/num_layers/engram_slots",
                       "every parameter tensor, float32"),
        "RoPE tables": (3 * cfg.max_seq_len * (hd // 2) * F32, "max_seq_len",
                        "angles, cos, sin: 3 x max_seq_len x head_dim/2 x 4 bytes"),
        "KV cache": (2 * L * cfg.num_kv_heads * cfg.max_seq_len * hd * F32, "max_seq_len",
                     "K and V: 2 x num_layers x num_kv_heads x max_seq_len x head_dim x 4 "
                     "bytes (full causal)"),
        "Engram value ring": (cfg.num_sites * ring * cfg.d_model * F32, "engram_orders",
                              "sites x ((taps-1) x dilation + 1) x d_model x 4 bytes"),
        "Engram window": (cfg.engram_hist_window * (cfg.engram_fetched + 3 * cfg.d_model
                                                    + 3 * cfg.engram_tables) * F32,
                          "engram_orders", "taps x dilation x (fetched + 3 d_model + 3 tables) "
                                           "x 4 bytes, the history one Engram step reads"),
    }


def check_memory(cfg: V2Config, budget: int | None = None, where: str = "config",
                 offsets: dict | None = None, error=MemoryBudgetError,
                 extra: dict | None = None) -> int:
    """Total implied bytes, or `error` naming the largest term when the total exceeds `budget`
    (DEFAULT_MAX_MEMORY when None). `offsets` maps a field to its byte offset in the file.
    `extra`: more {term: (bytes, field, formula)} a reader really allocates besides one float32
    copy of the tables (the file as read, tensors as stored, working copies): see
    cact_terms and stored_terms."""
    budget = DEFAULT_MAX_MEMORY if budget is None else int(budget)
    if cfg.kv_window > cfg.kv_budget:
        # Not a budget question: upstream decodes with min(kv_budget, kv_window) (spec §a.2),
        # and the port's ring and each step's attention span the whole window.
        raise error(f"{where}: kv_window={cfg.kv_window} exceeds the KV budget of "
                    f"{cfg.kv_budget} positions (11.5 MiB at {cfg.kv_bytes_per_pos} bytes per "
                    f"position, at least 160, at most max_seq_len); upstream would decode "
                    f"with {cfg.effective_kv_window}")
    terms = dict(implied_bytes(cfg), **(extra or {}))
    total = sum(b for b, _, _ in terms.values())
    if total <= budget:
        return total
    name, (nbytes, fld, formula) = max(terms.items(), key=lambda kv: kv[1][0])
    values = ", ".join(f"{f}={getattr(cfg, f)!r}"
                       + (f" (byte {offsets[f]})" if offsets and f in offsets else "")
                       for f in fld.split("/") if hasattr(cfg, f)) or fld
    raise error(f"{where}: the geometry implies {_fmt(total)} of tables, over the memory "
                f"budget of {_fmt(budget)} (--max-memory); the largest is the {name}, "
                f"{_fmt(nbytes)} from {values}: {formula}")


def cact_terms(cfg: V2Config, file_size: int) -> dict:
    """What reading a .cact allocates besides the float32 parameters: the file's bytes and the
    slots' copy of every blob; the dequantised slot tensors, held while the per-layer ones are
    stacked into the flax-path parameters (a second float32 copy); and the largest CQ
    matrix's working set (its uint8 codes, its padded float32 rows, the float64 slices)."""
    from .cact_layout import CQ, canon
    from .cq import _CHUNK, padded
    big = max((s.shape[0] * padded(s.shape[1]) for s in canon(cfg) if s.kind == CQ), default=0)
    params = implied_bytes(cfg)["parameters"][0]
    return {"file and slot copies": (2 * file_size, "file size",
                                     "the bytes read and the slots' copy of each blob"),
            "dequantised slots": (params, "vocab_size/d_model/num_layers/engram_slots",
                                  "every slot dequantised to float32 before the per-layer "
                                  "tensors are stacked: a second copy of the parameters"),
            "CQ working copies": (big * (1 + F32) + min(big, _CHUNK) * 48,
                                  "vocab_size/d_model",
                                  "the largest CQ matrix's codes (1 byte per weight), its "
                                  "padded float32 rows, and one slice of float64 work")}


def stored_terms(header: dict, names) -> dict:
    """A parameter file's tensors as stored, for those not already float32 (an F32 tensor is
    the parameter itself; F16/BF16 ones are widened to a float32 copy, F64 ones kept beside
    the ladder's float32 copy): {term: (bytes, field, formula)} for check_memory."""
    nbytes = 0
    for name in names:
        info = header.get(name)
        if isinstance(info, dict) and info.get("dtype") != "F32":
            lo, hi = info["data_offsets"]
            nbytes += hi - lo
    return {"tensors as stored": (nbytes, "dtype", "the file's non-float32 tensors, read as "
                                                  "stored before the float32 copy is made")}
