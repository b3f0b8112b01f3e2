"""Every parameter's flax path and shape for a geometry: the one list the params file, the .cact
layout and the memory budget all read. A leaf (it imports only the config), so the modules that
use it import one way: params -> memory_budget -> param_layout, cact_layout -> param_layout."""
from __future__ import annotations

from .config import V2Config

BLOCK = "stack/layers/block"
HEAD_PROBES = {"contrastive_head": 4, "confidence_head": 8}


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
