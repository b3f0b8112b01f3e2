"""needle v2 parameters: a flat dict keyed by upstream's flax paths ('/'-joined).

Per-layer tensors carry the leading `L` axis that upstream's `nn.scan` stacks, so a file of
upstream parameters flattened this way loads unchanged. Training-only entries upstream keeps
(`mtp_*`, `contrastive_head/log_temp`) are ignored on load.
"""
from __future__ import annotations

import math
import os
import struct

import torch

from .config import V2Config
from .memory_budget import DEFAULT_MAX_MEMORY, check_memory, stored_terms
from .safe_io import open_regular, parse_json

BLOCK = "stack/layers/block"
HEAD_PROBES = {"contrastive_head": 4, "confidence_head": 8}


class ParamsError(ValueError):
    """A parameter file or dict that does not fit the config (names the key, shape or offset)."""


def param_shapes(cfg: V2Config, heads: bool = True) -> dict:
    """Every exported parameter's flax path and shape, in a stable order."""
    L, d, n = cfg.num_layers, cfg.d_model, cfg.mhc_lanes
    attn, kv, hd, hn = cfg.attn_dim_eff, cfg.kv_dim, cfg.head_dim, cfg.hada_n
    s = {"embedding/embedding": (cfg.vocab_size, d)}
    s[f"{BLOCK}/ZCRMSNorm_0/scale"] = (L, d)
    for name, width in (("q_proj", attn), ("k_proj", kv), ("v_proj", kv), ("gate_proj", attn)):
        s[f"{BLOCK}/self_attn/{name}/kernel"] = (L, d, width)
    s[f"{BLOCK}/self_attn/out_proj/kernel"] = (L, attn, d)
    s[f"{BLOCK}/self_attn/q_norm/scale"] = (L, hd)
    s[f"{BLOCK}/self_attn/k_norm/scale"] = (L, hd)
    s[f"{BLOCK}/post_attn_norm/scale"] = (L, d)
    s[f"{BLOCK}/attn_gate"] = (L,)
    s[f"{BLOCK}/pre_hada_norm/scale"] = (L, d)
    for name in ("d1", "d2", "d3"):
        s[f"{BLOCK}/hadamard_mlp/{name}"] = (L, hn)
    s["stack/mhc_phi_pre"] = (L, n * d, n)
    s["stack/mhc_phi_post"] = (L, n * d, n)
    s["stack/mhc_phi_res"] = (L, n * d, n * n)
    s["stack/mhc_b_pre"] = (L, n)
    s["stack/mhc_b_post"] = (L, n)
    s["stack/mhc_b_res"] = (L, n, n)
    for name in ("mhc_a_pre", "mhc_a_post", "mhc_a_res"):
        s[f"stack/{name}"] = (L,)
    s["stack/final_norm/scale"] = (d,)
    for site in range(cfg.num_sites):
        s[f"engrams_{site}/embedding"] = (cfg.engram_tables, cfg.engram_slots, cfg.engram_sub)
        s[f"engrams_{site}/key_proj/kernel"] = (cfg.engram_fetched, d)
        s[f"engrams_{site}/value_proj/kernel"] = (cfg.engram_fetched, d)
        s[f"engrams_{site}/taps"] = (cfg.engram_taps, d)
    if heads:
        s["contrastive_head/probes"] = (4, d)
        s["contrastive_head/proj/kernel"] = (4 * d, cfg.contrastive_dim)
        s["confidence_head/probes"] = (8, d)
        s["confidence_head/proj/kernel"] = (8 * d, 1)
        s["confidence_head/proj/bias"] = (1,)
    return s


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

_ST_DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "F16": (torch.float16, 2),
              "BF16": (torch.bfloat16, 2), "I64": (torch.int64, 8), "I32": (torch.int32, 4),
              "U8": (torch.uint8, 1), "BOOL": (torch.bool, 1)}
_FLOAT_DTYPES = ("F16", "BF16", "F32", "F64")
_MAX_HEADER = 100 * 1024 * 1024
_MAX_DIM = 2 ** 31 - 1


def _brief(v) -> str:
    """repr(v) cut to 80 characters: a hostile header value may be megabytes long."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."


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
    """Validate a safetensors file's framing before anything is allocated: (header, data_start).

    The file must be a regular file of at most `max_bytes` (default: the memory budget, as
    every tensor is read into memory); the header JSON is parsed with bounded nesting; every
    declared dtype, shape and byte range is checked against the file size, and the ranges
    must tile the data exactly (as safetensors writes them). A truncated or lying file raises
    ParamsError naming the tensor, field and offset.
    """
    f, size = open_regular(path, DEFAULT_MAX_MEMORY if max_bytes is None else max_bytes,
                           ParamsError, "parameter file")
    with f:
        return _read_header(f, size, os.fspath(path))


def _read_header(f, size: int, path: str) -> tuple:
    head = f.read(8)
    if len(head) < 8:
        raise ParamsError(f"{path}: file is {size} bytes; the 8-byte header length at "
                          f"offset 0 is truncated")
    (hlen,) = struct.unpack("<Q", head)
    if hlen > min(_MAX_HEADER, size - 8):
        raise ParamsError(f"{path}: header length {hlen} at offset 0 exceeds the "
                          f"{size - 8} bytes after it (limit {_MAX_HEADER})")
    raw = f.read(hlen)
    header = parse_json(raw, f"{path}: header", ParamsError, base=8)
    if not isinstance(header, dict):
        raise ParamsError(f"{path}: header at offset 8 is not a JSON object")
    data_start, data_len = 8 + hlen, size - 8 - hlen
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            if not isinstance(info, dict) or not all(isinstance(v, str) for v in info.values()):
                raise ParamsError(f"{path}: __metadata__ must map strings to strings")
            continue
        if not isinstance(info, dict) or not {"dtype", "shape", "data_offsets"} <= set(info):
            raise ParamsError(f"{path}: tensor {name!r} entry lacks dtype/shape/data_offsets")
        dtype = info["dtype"]
        if not isinstance(dtype, str) or dtype not in _ST_DTYPES:   # a list is unhashable
            raise ParamsError(f"{path}: tensor {name!r} field dtype={_brief(dtype)} "
                              f"is not one of {sorted(_ST_DTYPES)}")
        shape, offs = info["shape"], info["data_offsets"]
        # A dimension no larger than the data (or 2**31 - 1): a zero-byte tensor of shape
        # [2**64, 0] fits any byte count but no torch size.
        max_dim = max(data_len, _MAX_DIM)
        if not (isinstance(shape, list) and len(shape) <= 8
                and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= max_dim
                        for x in shape)):
            raise ParamsError(f"{path}: tensor {name!r} field shape={_brief(shape)} is invalid "
                              f"(at most 8 integers in 0..{max_dim})")
        if not (isinstance(offs, list) and len(offs) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) for x in offs)
                and 0 <= offs[0] <= offs[1]):
            raise ParamsError(f"{path}: tensor {name!r} field data_offsets={_brief(offs)} is "
                              f"invalid")
        nbytes = math.prod(shape) * _ST_DTYPES[info["dtype"]][1]
        if offs[1] - offs[0] != nbytes:
            raise ParamsError(f"{path}: tensor {name!r} shape {shape} needs {nbytes} bytes but "
                              f"data_offsets span {offs[1] - offs[0]}")
        if offs[1] > data_len:
            raise ParamsError(f"{path}: tensor {name!r} data_offsets end {offs[1]} "
                              f"(file offset {data_start + offs[1]}) is past the end of the "
                              f"file ({size} bytes)")
        spans.append((offs[0], offs[1], name))
    end = 0
    for lo, hi, name in sorted(spans):
        if lo != end:
            raise ParamsError(f"{path}: tensor {name!r} data starts at file offset "
                              f"{data_start + lo}, not at {data_start + end} where the previous "
                              f"one ends (tensors must tile the data, no gaps or overlaps)")
        end = hi
    if end != data_len:
        raise ParamsError(f"{path}: {data_len - end} bytes at file offset {data_start + end} "
                          f"follow the last tensor")
    return header, data_start


def _read_tensor(f, path: str, name: str, info: dict, data_start: int) -> torch.Tensor:
    dtype, _ = _ST_DTYPES[info["dtype"]]
    lo, hi = info["data_offsets"]
    buf = torch.empty(hi - lo, dtype=torch.uint8)
    f.seek(data_start + lo)
    if hi > lo and f.readinto(buf.numpy()) != hi - lo:
        raise ParamsError(f"{path}: tensor {name!r} is truncated at file offset {data_start + lo}"
                          f" (the file shrank while being read)")
    return buf.view(dtype).reshape(info["shape"])


def load_safetensors(path, max_bytes: int | None = None, names=None, error=ParamsError) -> tuple:
    """(tensors, metadata) after the framing check above; no pickle, no mmap of the path.

    `names`: read only these tensors (the others are framed but never allocated). `error`: the
    exception class to raise (the message is ParamsError's), so a fixture loader can call this
    in place of safetensors' load_file and keep its own error class."""
    path_s = os.fspath(path)
    try:
        f, size = open_regular(path, DEFAULT_MAX_MEMORY if max_bytes is None else max_bytes,
                               ParamsError, "safetensors file")
        with f:
            header, data_start = _read_header(f, size, path_s)
            tensors = {name: _read_tensor(f, path_s, name, info, data_start)
                       for name, info in header.items()
                       if name != "__metadata__" and (names is None or name in names)}
    except ParamsError as e:
        if error is ParamsError:
            raise
        raise error(str(e)) from None
    return tensors, dict(header.get("__metadata__", {}))


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
