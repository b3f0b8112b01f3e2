"""The port's weights, prepared once at load: fused per-layer products laid out for `rowvecs`
(dense float32, or the pre-rotation rows of the Cactus-Quants codes), router biases with the
lane offsets folded in; and the Walsh matrix and RoPE tables, functions of the config.
port/parts.py turns the prepared tensors into the model's typed parts."""
from __future__ import annotations

import math

import torch

from reference.config import V2Config
from reference.params import BLOCK, check_params


def walsh(n: int):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).float()


def prepare_weights(params: dict, cfg: V2Config, cqw, device) -> dict:
    """Prepare every weight once. With `cqw` (slot name -> CqWeight) the matrices are the
    codes' pre-rotation rows [out, in_pad] and every product first rotates its input."""
    p = {k: v.detach().to(device=device, dtype=torch.float32)
         for k, v in check_params(params, cfg).items()}
    L, n, d = cfg.num_layers, cfg.mhc_lanes, cfg.d_model
    sa = f"{BLOCK}/self_attn"
    cat = lambda *names: torch.cat([p[f"{sa}/{nm}/kernel"] for nm in names], -1)
    w = {
        "emb": p["embedding/embedding"].contiguous(),
        # q | k | v | gate, one matvec per layer: [L, attn+2kv+attn, d]
        "qkvg": cat("q_proj", "k_proj", "v_proj", "gate_proj").transpose(1, 2).contiguous(),
        "out": p[f"{sa}/out_proj/kernel"].transpose(1, 2).contiguous(),
        "qn": p[f"{sa}/q_norm/scale"], "kn": p[f"{sa}/k_norm/scale"],
        "pre": p[f"{BLOCK}/ZCRMSNorm_0/scale"], "post": p[f"{BLOCK}/post_attn_norm/scale"],
        "pre_hada": p[f"{BLOCK}/pre_hada_norm/scale"],
        "attn_gate": torch.sigmoid(p[f"{BLOCK}/attn_gate"]),
        "d1": p[f"{BLOCK}/hadamard_mlp/d1"], "d2": p[f"{BLOCK}/hadamard_mlp/d2"],
        "d3": p[f"{BLOCK}/hadamard_mlp/d3"],
        # mHC router: pre | post | res logits from one matvec per layer: [L, 2n+n², n·d]
        "router": torch.cat([p["stack/mhc_phi_pre"], p["stack/mhc_phi_post"],
                             p["stack/mhc_phi_res"]], -1).transpose(1, 2).contiguous(),
        "final": p["stack/final_norm/scale"],
    }
    lane = torch.eye(n, device=device)[torch.arange(L) % n]
    w["pre_bias"] = p["stack/mhc_b_pre"] + (8 * lane - 4)
    w["post_bias"] = p["stack/mhc_b_post"] - 4 * (1 - lane)
    for k in ("a_pre", "a_post", "a_res", "b_res"):
        w[k] = p[f"stack/mhc_{k}"]
    w["sites"] = []
    for s in range(cfg.num_sites):
        kv = (torch.cat([p[f"engrams_{s}/key_proj/kernel"],
                         p[f"engrams_{s}/value_proj/kernel"]], -1).t().contiguous()
              if cqw is None else
              torch.cat([cqw[f"engram{s}.key_proj"].rows,
                         cqw[f"engram{s}.value_proj"].rows]).to(device))
        w["sites"].append({
            "tables": p[f"engrams_{s}/embedding"].reshape(-1, cfg.engram_sub).contiguous(),
            "kv": kv.t(),                                  # [in, 2d] view
            "taps": p[f"engrams_{s}/taps"],
        })
    for name in ("qkvg", "out", "router"):
        w[name + "_t"] = w[name].transpose(1, 2)          # [L, in, out] views
    w["rotate"] = cqw is not None
    if cqw is not None:                 # the codes' rows replace the dense products
        for name in ("qkvg", "out", "router"):
            del w[name]
        w.update(_cq_matrices(cqw, cfg, device))
    w["heads"] = {k: v for k, v in p.items() if "_head/" in k}
    return w


def rope_tables(cfg: V2Config, device) -> tuple:
    """cos, sin [max_seq_len, head_dim / 2] of every position's RoPE angles."""
    hd = cfg.head_dim
    inv = 1.0 / torch.pow(torch.tensor(cfg.rope_theta, dtype=torch.float32),
                          torch.arange(0, hd, 2, dtype=torch.float32) / hd)
    ang = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32), inv)
    return ang.cos().to(device), ang.sin().to(device)


def _cq_matrices(cqw: dict, cfg: V2Config, device) -> dict:
    """Pre-rotation rows of every CQ matrix, fused and laid out as the dense path's views."""
    L, n = cfg.num_layers, cfg.mhc_lanes
    rows = lambda name: cqw[name].rows.to(device)
    qkvg = torch.stack([torch.cat([rows(f"layer{i:02d}.{k}") for k in
                                   ("q_proj", "k_proj", "v_proj", "gate_proj")])
                        for i in range(L)])
    out = torch.stack([rows(f"layer{i:02d}.out_proj") for i in range(L)])
    phi = [rows(f"mhc_phi_{k}").reshape(L, -1, rows(f"mhc_phi_{k}").shape[-1])
           for k in ("pre", "post", "res")]                  # rows (layer, k)
    router = torch.cat(phi, 1)
    return {"qkvg_t": qkvg.transpose(1, 2), "out_t": out.transpose(1, 2),
            "router_t": router.transpose(1, 2), "head_t": rows("embedding").t(),
            "cq_bytes": sum(w.nbytes for w in cqw.values())}
