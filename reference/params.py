"""needle v2 parameters: a flat dict keyed by upstream's flax paths ('/'-joined).

Per-layer tensors carry the leading `L` axis that upstream's `nn.scan` stacks, so a file of
upstream parameters flattened this way loads unchanged. Training-only entries upstream keeps
(`mtp_*`, `contrastive_head/log_temp`) are ignored on load.
"""
from __future__ import annotations

import math
import os

import torch

from .config import V2Config
from .param_layout import BLOCK, HEAD_PROBES, param_shapes  # noqa: F401 (re-exported)
from .memory_budget import DEFAULT_MAX_MEMORY, check_memory, stored_terms
from bounded import safetensors as _bounded
from bounded.safetensors import FLOAT_DTYPES, ST_DTYPES


class ParamsError(ValueError):
    """A parameter file or dict that does not fit the config (names the key, shape or offset)."""


def has_heads(params: dict) -> bool:
    return all(k in params for k in ("contrastive_head/probes", "confidence_head/probes"))


def init_params(cfg: V2Config, seed: int = 0, perturbed: bool = False, heads: bool = True,
                dtype=torch.float32) -> dict:
    """Upstream's init distributions (spec §a.3), seeded; float32 then cast to `dtype`.

    `perturbed=True` replaces every degenerate init (zero norm scales, identity taps, 4·I b_res,
    0.01 router gains, tiny Engram values) with values that make every path carry signal, so
    a bug anywhere moves the logits.
    """
    g = torch.Generator().manual_seed(seed)
    shapes = param_shapes(cfg, heads)
    resid = 0.02 / math.sqrt(2 * cfg.num_layers)

    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    p = {}
    for key, shape in shapes.items():   # one pass in a fixed order: seed -> same values
        leaf = key.rsplit("/", 1)[-1]
        if key.endswith("out_proj/kernel") or key.endswith("value_proj/kernel"):
            p[key] = normal(shape, resid)
        elif leaf == "scale" or key.endswith("attn_gate") or key.startswith("stack/mhc_b_pre") \
                or key.startswith("stack/mhc_b_post") or key.endswith("proj/bias"):
            p[key] = torch.zeros(shape)
        elif leaf in ("d1", "d2"):
            p[key] = torch.ones(shape)
        elif leaf == "d3":
            p[key] = torch.full(shape, 0.02)
        elif key == "stack/mhc_b_res":
            p[key] = 4.0 * torch.eye(cfg.mhc_lanes).expand(shape).clone()
        elif key.startswith("stack/mhc_a_"):
            p[key] = torch.full(shape, 0.01)
        elif leaf == "taps":
            p[key] = torch.zeros(shape)
            p[key][0] = 1.0
        else:
            p[key] = normal(shape, 0.02)
    if perturbed:
        _perturb(p, cfg, g)
    return {k: v.to(dtype) for k, v in p.items()}


def _perturb(p: dict, cfg: V2Config, g: torch.Generator):
    def normal(shape, std, mean=0.0):
        return torch.randn(shape, generator=g, dtype=torch.float32) * std + mean

    n, L = cfg.mhc_lanes, cfg.num_layers
    for key in sorted(p):
        shape, leaf = tuple(p[key].shape), key.rsplit("/", 1)[-1]
        if leaf == "scale":
            p[key] = normal(shape, 0.3)
        elif key.endswith("attn_gate"):
            p[key] = normal(shape, 1.0, 1.5)
        elif leaf in ("d1", "d2"):
            p[key] = normal(shape, 0.3, 1.0)
        elif leaf == "d3":
            p[key] = normal(shape, 1.0)
        elif key in ("stack/mhc_b_pre", "stack/mhc_b_post"):
            p[key] = normal(shape, 1.0)
        elif key == "stack/mhc_b_res":
            # A plan far from identity: lanes really mix, Sinkhorn really iterates.
            p[key] = normal(shape, 1.0) + torch.eye(n)
        elif key.startswith("stack/mhc_a_"):
            p[key] = normal(shape, 0.3, 1.0)
        elif key.startswith("stack/mhc_phi_"):
            p[key] = normal(shape, 1.0 / math.sqrt(n * cfg.d_model))
        elif leaf == "taps":
            p[key] = normal(shape, 0.5) + torch.tensor([1.0, 0.0, 0.0, 0.0])[:, None]
        elif key == "embedding/embedding":
            p[key] = normal(shape, 0.1)
        elif key.startswith("engrams_") and leaf == "embedding":
            p[key] = normal(shape, 1.0)
        elif key.startswith("engrams_") and leaf == "kernel":
            p[key] = normal(shape, 1.0 / math.sqrt(cfg.engram_fetched))
        elif key.endswith("out_proj/kernel"):
            p[key] = normal(shape, 1.0 / math.sqrt(cfg.attn_dim_eff))
        elif key.endswith("proj/bias"):
            p[key] = normal(shape, 0.5)
    del L


def check_params(params: dict, cfg: V2Config, heads: bool | None = None) -> dict:
    """The exported subset of `params` in canonical order, shapes checked; extras dropped."""
    want = param_shapes(cfg, heads=has_heads(params) if heads is None else heads)
    out = {}
    for key, shape in want.items():
        if key not in params:
            raise ParamsError(f"missing parameter {key!r} (expected shape {list(shape)})")
        t = params[key]
        if not isinstance(t, torch.Tensor):
            t = torch.as_tensor(t)
        if tuple(t.shape) != shape:
            raise ParamsError(f"parameter {key!r} has shape {list(t.shape)}, "
                              f"config needs {list(shape)}")
        out[key] = t
    return out


# ---- safetensors io (no pickle) ----

_ST_DTYPES, _FLOAT_DTYPES = ST_DTYPES, FLOAT_DTYPES


def save_params(path, params: dict, cfg: V2Config | None = None, metadata: dict | None = None):
    """Write a safetensors parameter file. The bytes are serialised first and written by
    Python, so a full disk or an unwritable path is an OSError, not a safetensors error."""
    from safetensors.torch import save
    meta = dict(metadata or {})
    if cfg is not None:
        meta["needle_config"] = cfg.to_json()
    tensors = {k: v.detach().contiguous().cpu() for k, v in sorted(params.items())}
    blob = save(tensors, metadata=meta)
    try:
        with open(os.fspath(path), "wb") as f:
            f.write(blob)
    except OSError as e:
        raise OSError(e.errno, f"cannot write {os.fspath(path)}: {e.strerror}") from None


def read_safetensors_header(path, max_bytes: int | None = None) -> tuple:
    """bounded.safetensors.read_safetensors_header, raising ParamsError."""
    return _bounded.read_safetensors_header(path, max_bytes, ParamsError)


def load_safetensors(path, max_bytes: int | None = None, names=None, error=ParamsError) -> tuple:
    """(tensors, metadata) of a safetensors file (bounded.safetensors.load_safetensors)."""
    return _bounded.load_safetensors(path, max_bytes, names, error)


def check_values(params: dict, where: str) -> None:
    """Parameters read from a file: floating point and finite, as the .cact reader demands.
    An integer or bool tensor of the right shape is refused, not silently cast."""
    for key, t in params.items():
        if not t.dtype.is_floating_point:
            raise ParamsError(f"{where}: parameter {key!r} has dtype {t.dtype}; parameters "
                              f"must be floating point (F16, BF16, F32, F64)")
        k = first_flat(t, lambda v: ~torch.isfinite(v))
        if k is not None:
            raise ParamsError(f"{where}: parameter {key!r} value [{k}] (flat index) = "
                              f"{float(t.reshape(-1)[k])} is not finite")


SCAN = 1 << 20      # elements per slice of a value scan


def first_flat(t: torch.Tensor, test):
    """The flat index of the first element where `test(slice)` is true, or None. Scans SCAN
    elements at a time: a whole-tensor mask and its nonzero() (int64, 8 bytes per hit: an
    all-NaN tensor would need twice its own size) are never made."""
    flat = t.reshape(-1)
    for lo in range(0, flat.numel(), SCAN):
        hit = test(flat[lo:lo + SCAN])
        if hit.any():
            return lo + int(hit.reshape(-1).to(torch.uint8).argmax())
    return None


def load_params(path, cfg: V2Config | None = None, max_memory: int | None = None) -> tuple:
    """(params, cfg): the config comes from the file's metadata unless given. The geometry is
    checked against the memory budget (`max_memory`, default DEFAULT_MAX_MEMORY) before any
    tensor is read."""
    where = os.fspath(path)
    budget = DEFAULT_MAX_MEMORY if max_memory is None else max_memory
    header, _ = read_safetensors_header(path, budget)
    meta = header.get("__metadata__", {})
    if cfg is None:
        if "needle_config" not in meta:
            raise ParamsError(f"{where}: no needle_config in the metadata; "
                              f"pass the config explicitly")
        cfg = V2Config.from_json(meta["needle_config"], f"{where}: metadata needle_config")
    want = param_shapes(cfg, heads=all(f"{k}/probes" in header for k in HEAD_PROBES))
    check_memory(cfg, budget, where, extra=stored_terms(header, want))
    for key in want:
        info = header.get(key)
        if isinstance(info, dict) and info["dtype"] not in _FLOAT_DTYPES:
            raise ParamsError(f"{where}: parameter {key!r} has dtype {info['dtype']}; "
                              f"parameters must be one of {_FLOAT_DTYPES} (not cast silently)")
    tensors, _ = load_safetensors(path, budget, names=set(want))
    check_values(tensors, where)
    # Half-precision files compute in float32; float64 files stay float64 (the arbiter).
    params = check_params({k: v.float() if v.dtype in (torch.float16, torch.bfloat16) else v
                           for k, v in tensors.items()}, cfg)
    return params, cfg
