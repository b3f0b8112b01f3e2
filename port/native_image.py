"""The native step's image: everything `needle_trace` (kernels/native/needle_trace.c) reads,
in one safetensors file, so the C step runs as a program of its own, with no Python in its
process, and writes a trace archive the ladder compares (`python -m ladder compare`).

The image holds what the ctypes binding hands the library (port/native.py: the same NModel
numbers and arrays, by field name) and the host's part of every position of a schedule: the
token ids and the Engram n-gram rows with their presence bits, which the port's host prep
computes for the C step in every backend. Dense float32 weights (the packed form's codes are
bound through ctypes structs the image does not carry).
"""
from __future__ import annotations

import json
import os

import torch

from .native import host_row, model_arrays, model_scalars

FLOAT_SCALARS = ("eps", "attn_scale", "walsh_scale")
ARGMAX_MARK = "@ARGMAX@"


def write_image(model, tokens: list, steps: list, path, manifest: dict) -> str:
    """Write the image of `model` (a dense V2Model) over `tokens` cut into `steps` [(pos, len)],
    with `manifest` (ladder/engine/archive.py's fields; its "argmax" filled in by the program)."""
    from safetensors.torch import save_file
    if model.form != "dense":
        raise ValueError(f"the native image carries dense float32 weights; this model's form "
                         f"is {model.form!r} (build it with weights='dense')")
    cfg = model.cfg
    t = {}
    for k, v in model_scalars(model).items():
        t[f"f/{k}" if k in FLOAT_SCALARS else f"s/{k}"] = torch.tensor(
            [v], dtype=torch.float32 if k in FLOAT_SCALARS else torch.int64)
    state = model.make_state()
    t["s/R"] = torch.tensor([state.ring], dtype=torch.int64)
    t["s/window"] = torch.tensor([state.window], dtype=torch.int64)
    for k, v in model_arrays(model).items():
        t[k] = v.detach().contiguous()
    for s, site in enumerate(model.engrams):
        t[f"tables/{s}"] = site.tables.contiguous()
        t[f"eng_kv/{s}"] = site.kv.t().contiguous()
        t[f"eng_taps/{s}"] = site.taps.contiguous()
    orders = [o for o in cfg.engram_orders for _ in range(cfg.engram_heads_eff)]
    valid = [True] * len(tokens)
    rows = [host_row(cfg, tokens, valid, p) for p in range(len(tokens))]
    T = len(orders) if cfg.num_sites else 0
    t["host/tok"] = torch.tensor(tokens, dtype=torch.int64)
    t["host/flat"] = torch.tensor([x for r in rows for x in r[0]], dtype=torch.int64)
    t["host/ok"] = torch.tensor([x for r in rows for x in r[1]], dtype=torch.float32)
    t["host/tap_ok"] = torch.tensor([x for r in rows for x in r[2]], dtype=torch.uint8)
    t["host/valid"] = torch.ones(len(tokens), dtype=torch.uint8)
    if T == 0:
        t["s/T"] = torch.tensor([0], dtype=torch.int64)
    t["sched/steps"] = torch.tensor(steps, dtype=torch.int64).reshape(-1)
    m = dict(manifest, argmax=ARGMAX_MARK)
    t["manifest"] = torch.frombuffer(bytearray(json.dumps(m, sort_keys=True).encode()),
                                     dtype=torch.uint8)
    path = os.fspath(path)
    save_file(t, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path
