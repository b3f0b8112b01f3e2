"""needle v2 training graph (upstream architecture.py) over a whole sequence, f32 or bf16.

Differs from decode.py only where upstream's training graph differs: Engram enters every
layer through `site_flags` (exact zeros at non-site layers), validity comes from the mask
diagonal, and with dtype bfloat16 the norm outputs, Dense inputs/weights, Hadamard matrix and
the lane stream between layers are rounded to bf16 exactly where upstream casts them, while
the mHC router, Sinkhorn and Engram gate stay f32. `flash=True` restates
`jax.nn.dot_product_attention` (scores multiplied by 1/sqrt(hd), mask value -0.7·f32max, softmax
in f32, probabilities cast back); `flash=False` upstream's explicit path (divide by sqrt(hd),
finfo.min).
"""
from __future__ import annotations

import math

import torch

from .config import V2Config
from .decode import layer_params
from .ops import (apply_rope, engram_indices, mhc_lane_offsets, rms_unit, rope_tables,
                  shift_right, silu, sinkhorn, walsh_matrix)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}
F32 = torch.float32


def _dtype(dtype):
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"dtype {dtype!r} not one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def _acc(dt):
    """The 'f32' of upstream's casts: float64 when running as the arbiter."""
    return torch.float64 if dt == torch.float64 else F32


def zcrms_cast(x, scale, dt):
    """ZCRMSNorm module: rms in f32 from x, (1 + g)·x / rms, result cast to the compute dtype."""
    xf = x.to(_acc(dt))
    rms = torch.sqrt(torch.mean(xf * xf, dim=-1, keepdim=True) + 1e-6)
    return ((1 + scale) * x.to(torch.promote_types(x.dtype, scale.dtype)) / rms).to(dt)


def dense(x, kernel, dt):
    """flax Dense(dtype=dt, no bias): inputs and kernel cast to dt, result in dt."""
    return x.to(dt) @ kernel.to(dt)


def causal_mask(T: int):
    return torch.tril(torch.ones(T, T, dtype=torch.bool))[None, None]


def padding_mask(tokens, pad_id: int):
    return (tokens != pad_id)[:, None, None, :]


def mask_diag(mask, offset: int):
    """valid[b, t] = mask[b, 0, t, t - offset] (False for t < offset)."""
    m = mask[:, 0]
    T = m.shape[-1]
    if offset >= T:
        return torch.zeros(m.shape[:-2] + (T,), dtype=m.dtype)
    d = torch.diagonal(m, offset=-offset, dim1=-2, dim2=-1)
    return torch.nn.functional.pad(d, (offset, 0)) if offset else d


def engram_kv(params, cfg: V2Config, tokens, mask, dt):
    orders, heads = cfg.engram_orders, cfg.engram_heads_eff
    dil, acc = cfg.engram_dilation, _acc(dt)
    idx = engram_indices(tokens, orders, heads, cfg.engram_slots)
    ngram_ok = torch.stack([mask_diag(mask, o - 1) for o in orders for _ in range(heads)], -1)
    tap_ok = [mask_diag(mask, j * dil) for j in range(cfg.engram_taps)]
    B, T = tokens.shape
    ks, vs = [], []
    for s in range(cfg.num_sites):
        tables = params[f"engrams_{s}/embedding"].to(acc)
        e = (tables[torch.arange(cfg.engram_tables), idx] * ngram_ok[..., None]).reshape(B, T, -1)
        k = dense(e.to(dt), params[f"engrams_{s}/key_proj/kernel"], dt)
        vraw = dense(e.to(dt), params[f"engrams_{s}/value_proj/kernel"], dt)
        taps = params[f"engrams_{s}/taps"].to(dt)
        v = 0
        for j in range(cfg.engram_taps):
            v = v + taps[j] * shift_right(vraw, j * dil) * tap_ok[j][..., None]
        ks.append(k)
        vs.append(v)
    return torch.stack(ks), torch.stack(vs)


def attention(h, lp, mask, cos, sin, cfg: V2Config, dt, flash: bool):
    B, T, _ = h.shape
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = dense(h, lp["q"], dt).reshape(B, T, H, hd).transpose(1, 2)
    k = dense(h, lp["k"], dt).reshape(B, T, KV, hd).transpose(1, 2)
    v = dense(h, lp["v"], dt).reshape(B, T, KV, hd).transpose(1, 2)
    q = apply_rope(zcrms_cast(q, lp["qn"], dt), cos, sin).to(dt)
    k = apply_rope(zcrms_cast(k, lp["kn"], dt), cos, sin).to(dt)
    if flash:
        acc = _acc(dt)
        qg = q.reshape(B, KV, cfg.rep, T, hd)
        s = torch.einsum("bgrtd,bgsd->bgrts", qg.to(acc), k.to(acc))
        s = s * torch.tensor(1.0 / math.sqrt(hd), dtype=acc)
        m = mask.expand(B, H, T, T).reshape(B, KV, cfg.rep, T, T)
        s = torch.where(m, s, torch.tensor(-0.7 * torch.finfo(F32).max, dtype=acc))
        w = torch.softmax(s, dim=-1).to(dt)
        o = torch.einsum("bgrts,bgsd->bgrtd", w, v).reshape(B, H, T, hd)
    else:
        kr = k.repeat_interleave(cfg.rep, dim=1)                    # contiguous GQA groups
        vr = v.repeat_interleave(cfg.rep, dim=1)
        # Upstream divides by an f32 array, which promotes bf16 scores to f32 from here on.
        acc = _acc(dt)
        s = (q @ kr.transpose(-1, -2)).to(acc) / torch.sqrt(torch.tensor(float(hd), dtype=acc))
        s = torch.where(mask, s, torch.finfo(s.dtype).min)
        o = torch.softmax(s, dim=-1) @ vr.to(acc)
    o = o.transpose(1, 2).reshape(B, T, cfg.attn_dim_eff)
    o = o * torch.sigmoid(dense(h, lp["gate"], dt))
    return dense(o, lp["o"], dt)


def hadamard_mlp_cast(h, lp, d_model, dt):
    n = lp["d1"].shape[-1]
    Hn = walsh_matrix(n, _acc(dt)).to(dt)
    z = torch.nn.functional.pad(h, (0, n - d_model)) if n != d_model else h
    z = (lp["d1"].to(dt) * z) @ Hn
    z = silu(lp["d2"].to(dt) * z) @ Hn
    return (lp["d3"].to(dt) * z)[..., :d_model]


def block(u, lp, mask, cos, sin, cfg, dt, flash, ekv, flags):
    x = u
    if ekv is not None:
        ek, ev = ekv
        acc = _acc(dt)
        alpha = torch.sigmoid(torch.einsum("btd,sbtd->sbt", rms_unit(u.to(acc)),
                                           rms_unit(ek.to(acc))) / math.sqrt(cfg.d_model))
        x = x + torch.einsum("s,sbt,sbtd->btd", flags, alpha, ev.to(acc)).to(x.dtype)
    skip = x
    a = attention(zcrms_cast(x, lp["pre"], dt), lp, mask, cos, sin, cfg, dt, flash)
    a = zcrms_cast(a, lp["post"], dt)
    x = skip + torch.sigmoid(lp["attn_gate"]).to(dt) * a
    return x + hadamard_mlp_cast(zcrms_cast(x, lp["pre_hada"], dt), lp, cfg.d_model, dt)


def forward(params, cfg: V2Config, tokens, *, mask=None, dtype=None, flash=None,
            collect_hidden=False):
    """Training-graph logits [B, T, V] (f32); with collect_hidden also the per-layer lane means
    [L, B, T, d] in the compute dtype."""
    dt = _dtype(dtype or cfg.dtype)
    flash = cfg.flash if flash is None else flash
    tokens = tokens.to(torch.int64)
    B, T = tokens.shape
    if T > cfg.max_seq_len:
        raise ValueError(f"sequence length {T} exceeds max_seq_len={cfg.max_seq_len}")
    if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size:
        raise ValueError(f"token ids must lie in 0..{cfg.vocab_size - 1}")
    if mask is None:
        mask = causal_mask(T)
    acc = _acc(dt)
    emb = params["embedding/embedding"].to(acc)
    x0 = emb[tokens] * math.sqrt(cfg.d_model)
    cos, sin = rope_tables(cfg.head_dim, T, cfg.rope_theta, acc)
    ekv = engram_kv(params, cfg, tokens, mask, dt) if cfg.num_sites else None
    n, C, L = cfg.mhc_lanes, cfg.d_model, cfg.num_layers
    flags = torch.zeros(L, cfg.num_sites, dtype=acc)
    for s, layer in enumerate(cfg.engram_layers):
        flags[layer, s] = 1.0
    pre_off, post_off = mhc_lane_offsets(L, n, acc)
    st = {k: params["stack/mhc_" + k].to(acc) for k in
          ("phi_pre", "phi_post", "phi_res", "b_pre", "b_post", "b_res", "a_pre", "a_post",
           "a_res")}
    x = x0.to(dt)[:, :, None, :].expand(B, T, n, C)
    hidden = []
    for i in range(L):
        xf = x.to(acc)
        nx = rms_unit(xf.reshape(B, T, n * C))
        hpre = torch.sigmoid(st["a_pre"][i] * (nx @ st["phi_pre"][i]) + st["b_pre"][i]
                             + pre_off[i])
        u = torch.einsum("btn,btnc->btc", hpre, xf).to(dt)
        y = block(u, layer_params(params, i), mask, cos, sin, cfg, dt, flash, ekv,
                  flags[i]) - u
        hpost = 2 * torch.sigmoid(st["a_post"][i] * (nx @ st["phi_post"][i]) + st["b_post"][i]
                                  + post_off[i])
        hres = sinkhorn(st["a_res"][i] * (nx @ st["phi_res"][i]).reshape(B, T, n, n)
                        + st["b_res"][i])
        x = (torch.einsum("btij,btjc->btic", hres, xf)
             + hpost[..., None] * y.to(acc)[:, :, None, :]).to(dt)
        if collect_hidden:
            hidden.append(torch.mean(x.to(acc), dim=2).to(dt))
    m = torch.mean(x.to(acc), dim=2).to(dt)
    f = zcrms_cast(m, params["stack/final_norm/scale"], dt)
    logits = f.to(acc) @ emb.T
    return (logits, torch.stack(hidden)) if collect_hidden else logits


def hidden_cells(params, cfg: V2Config, tokens, *, window: int = 0, sink=None, dtype=None,
                 flash=None):
    """cells [B, T, L+1, d]: x0 then the lane mean after each layer (no final norm).

    Mask: causal, key-side padding (token != pad), and with `window > 0` the sliding window
    OR-ed with `sink` [B, T]."""
    tokens = tokens.to(torch.int64)
    T = tokens.shape[1]
    mask = causal_mask(T) & padding_mask(tokens, cfg.pad_token_id)
    if window:
        p = torch.arange(T)
        keep = ((p[:, None] - p[None, :]) < window)[None, None]
        if sink is not None:
            keep = keep | sink[:, None, None, :]
        mask = mask & keep
    dt = _dtype(dtype or cfg.dtype)
    _, hidden = forward(params, cfg, tokens, mask=mask, dtype=dt, flash=flash,
                        collect_hidden=True)
    acc = _acc(dt)
    x0 = params["embedding/embedding"].to(acc)[tokens] * math.sqrt(cfg.d_model)
    return torch.stack([x0, *[h.to(acc) for h in hidden]], dim=2)
