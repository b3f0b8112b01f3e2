"""Which tensor sits in which .cact slot, and how it maps to the reference's flax-path params.

The file is positional (no names): embedding; 14 tensors per layer; 9 mHC tensors; 4 per Engram
site; final_norm; optional probe heads (a manifest of head codes, then probes/proj/bias per
head); an optional RAW tokenizer last (spec §e.5). Matrices are stored [out, in], i.e. the flax
kernel transposed; the names are upstream's exporter names, which its bits maps match against.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .config import V2Config
from .param_layout import BLOCK

CQ, FP16, RAW = "cq", "fp16", "raw"
HEADS = (("contrastive_head", 1, 4), ("confidence_head", 2, 8))   # key, manifest code, probes
LAYER_SLOTS = ("norm_in", "q_proj", "k_proj", "v_proj", "q_norm", "k_norm", "gate_proj",
               "out_proj", "post_norm", "attn_gate", "pre_hada", "d1", "d2", "d3")
MHC_SLOTS = ("mhc_a_pre", "mhc_a_post", "mhc_a_res", "mhc_b_pre", "mhc_b_post", "mhc_b_res",
             "mhc_phi_pre", "mhc_phi_post", "mhc_phi_res")
_LAYER_PARAM = {   # slot -> (flax path under the block, is a matrix)
    "norm_in": ("ZCRMSNorm_0/scale", False), "q_proj": ("self_attn/q_proj/kernel", True),
    "k_proj": ("self_attn/k_proj/kernel", True), "v_proj": ("self_attn/v_proj/kernel", True),
    "q_norm": ("self_attn/q_norm/scale", False), "k_norm": ("self_attn/k_norm/scale", False),
    "gate_proj": ("self_attn/gate_proj/kernel", True),
    "out_proj": ("self_attn/out_proj/kernel", True),
    "post_norm": ("post_attn_norm/scale", False), "attn_gate": ("attn_gate", False),
    "pre_hada": ("pre_hada_norm/scale", False), "d1": ("hadamard_mlp/d1", False),
    "d2": ("hadamard_mlp/d2", False), "d3": ("hadamard_mlp/d3", False)}


@dataclass(frozen=True)
class SlotSpec:
    name: str
    kind: str          # CQ, FP16 or RAW
    shape: tuple       # stored shape ([out, in] for CQ); () for RAW


def base_count(cfg: V2Config) -> int:
    """Slots through final_norm."""
    return 1 + len(LAYER_SLOTS) * cfg.num_layers + len(MHC_SLOTS) + 4 * cfg.num_sites + 1


def canon(cfg: V2Config, heads: tuple = (), tokenizer: bool = False) -> list:
    """The slot list for a geometry. `heads`: ((key, out_dim), ...) in manifest order."""
    d, n, L = cfg.d_model, cfg.mhc_lanes, cfg.num_layers
    attn, kv, hd, hn = cfg.attn_dim_eff, cfg.kv_dim, cfg.head_dim, cfg.hada_n
    layer_shape = {"norm_in": (d,), "q_proj": (attn, d), "k_proj": (kv, d), "v_proj": (kv, d),
                   "q_norm": (hd,), "k_norm": (hd,), "gate_proj": (attn, d),
                   "out_proj": (d, attn), "post_norm": (d,), "attn_gate": (1,),
                   "pre_hada": (d,), "d1": (hn,), "d2": (hn,), "d3": (hn,)}
    out = [SlotSpec("embedding", CQ, (cfg.vocab_size, d))]
    for i in range(L):
        out += [SlotSpec(f"layer{i:02d}.{s}", CQ if _LAYER_PARAM[s][1] else FP16, layer_shape[s])
                for s in LAYER_SLOTS]
    out += [SlotSpec(s, FP16, (L,)) for s in MHC_SLOTS[:3]]
    out += [SlotSpec("mhc_b_pre", FP16, (L, n)), SlotSpec("mhc_b_post", FP16, (L, n)),
            SlotSpec("mhc_b_res", FP16, (L, n, n))]
    out += [SlotSpec("mhc_phi_pre", CQ, (L * n, n * d)),
            SlotSpec("mhc_phi_post", CQ, (L * n, n * d)),
            SlotSpec("mhc_phi_res", CQ, (L * n * n, n * d))]
    T, slots, sub = cfg.engram_tables, cfg.engram_slots, cfg.engram_sub
    for s in range(cfg.num_sites):
        out += [SlotSpec(f"engram{s}.tables", CQ, (T * slots, sub)),
                SlotSpec(f"engram{s}.key_proj", CQ, (d, cfg.engram_fetched)),
                SlotSpec(f"engram{s}.value_proj", CQ, (d, cfg.engram_fetched)),
                SlotSpec(f"engram{s}.taps", FP16, (cfg.engram_taps, d))]
    out.append(SlotSpec("final_norm", FP16, (d,)))
    if heads:
        out.append(SlotSpec("heads.manifest", FP16, (len(heads),)))
        probes = {key: p for key, _, p in HEADS}
        for key, width in heads:
            out += [SlotSpec(f"{key}.probes", FP16, (probes[key], d)),
                    SlotSpec(f"{key}.proj", FP16, (width, probes[key] * d)),
                    SlotSpec(f"{key}.bias", FP16, (width,))]
    if tokenizer:
        out.append(SlotSpec("tokenizer", RAW, ()))
    return out


def heads_in(params: dict) -> tuple:
    """((key, out_dim), ...) for the probe heads present in a params dict, in manifest order."""
    return tuple((key, int(params[f"{key}/proj/kernel"].shape[1])) for key, _, _ in HEADS
                 if f"{key}/probes" in params and f"{key}/proj/kernel" in params)


def slot_tensors(params: dict, cfg: V2Config) -> dict:
    """Stored-layout tensors by slot name (float32; CQ ones [out, in]) from flax-path params."""
    p = {k: v.detach().to(torch.float32) for k, v in params.items()}
    t = {"embedding": p["embedding/embedding"]}
    for i in range(cfg.num_layers):
        for s, (path, matrix) in _LAYER_PARAM.items():
            v = p[f"{BLOCK}/{path}"][i]
            t[f"layer{i:02d}.{s}"] = v.T if matrix else v.reshape(-1)
    for s in MHC_SLOTS:
        v = p[f"stack/{s}"]
        if s.startswith("mhc_phi_"):   # [L, n*d, k] -> rows (layer, k) of length n*d
            v = v.permute(0, 2, 1).reshape(-1, v.shape[1])
        t[s] = v
    T, slots, sub = cfg.engram_tables, cfg.engram_slots, cfg.engram_sub
    for s in range(cfg.num_sites):
        t[f"engram{s}.tables"] = p[f"engrams_{s}/embedding"].reshape(T * slots, sub)
        t[f"engram{s}.key_proj"] = p[f"engrams_{s}/key_proj/kernel"].T
        t[f"engram{s}.value_proj"] = p[f"engrams_{s}/value_proj/kernel"].T
        t[f"engram{s}.taps"] = p[f"engrams_{s}/taps"]
    t["final_norm"] = p["stack/final_norm/scale"]
    heads = heads_in(p)
    if heads:
        code = {key: c for key, c, _ in HEADS}
        t["heads.manifest"] = torch.tensor([float(code[k]) for k, _ in heads])
        for key, width in heads:
            t[f"{key}.probes"] = p[f"{key}/probes"]
            t[f"{key}.proj"] = p[f"{key}/proj/kernel"].T
            bias = p.get(f"{key}/proj/bias")      # the contrastive head has none: zeros
            t[f"{key}.bias"] = torch.zeros(width) if bias is None else bias
    return {k: v.contiguous() for k, v in t.items()}


def params_from_slots(t: dict, cfg: V2Config) -> dict:
    """Inverse of slot_tensors: flax-path params (float32, contiguous) from stored tensors."""
    L = cfg.num_layers
    p = {"embedding/embedding": t["embedding"]}
    for s, (path, matrix) in _LAYER_PARAM.items():
        rows = [t[f"layer{i:02d}.{s}"] for i in range(L)]
        v = torch.stack([r.T for r in rows]) if matrix else torch.stack(rows)
        p[f"{BLOCK}/{path}"] = v.reshape(L) if s == "attn_gate" else v
    for s in MHC_SLOTS:
        v = t[s]
        if s.startswith("mhc_phi_"):
            v = v.reshape(L, -1, v.shape[1]).permute(0, 2, 1)
        p[f"stack/{s}"] = v
    T, slots, sub = cfg.engram_tables, cfg.engram_slots, cfg.engram_sub
    for s in range(cfg.num_sites):
        p[f"engrams_{s}/embedding"] = t[f"engram{s}.tables"].reshape(T, slots, sub)
        p[f"engrams_{s}/key_proj/kernel"] = t[f"engram{s}.key_proj"].T
        p[f"engrams_{s}/value_proj/kernel"] = t[f"engram{s}.value_proj"].T
        p[f"engrams_{s}/taps"] = t[f"engram{s}.taps"]
    p["stack/final_norm/scale"] = t["final_norm"]
    for key, _, _ in HEADS:
        if f"{key}.probes" in t:
            p[f"{key}/probes"] = t[f"{key}.probes"]
            p[f"{key}/proj/kernel"] = t[f"{key}.proj"].T
            if key == "confidence_head":       # the contrastive head's zero bias is dropped
                p[f"{key}/proj/bias"] = t[f"{key}.bias"]
    return {k: v.to(torch.float32).contiguous() for k, v in p.items()}
