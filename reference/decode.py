"""needle v2 incremental decode (upstream decode.py `_forward_cached`), restated in PyTorch.

One function runs a prefill (S tokens at `pos`) or a one-token step over an absolute-position
KV cache [L, B, KV, M, hd]. Engram is gated on `u`, the lane mix the block consumes. The
arithmetic follows upstream's order so float32 results agree to rounding; float64 parameters
run the same code in float64 (the arbiter between two disagreeing float32 results).

`trace(name, layer, values)` is called at every ladder point (docs/design.md) in forward order;
`layer` is None for whole-forward points. Values are the live tensors: a tracer copies what it
keeps and must not write into them. With `trace=None` nothing extra is computed or copied.
"""
from __future__ import annotations

import math

import torch

from .config import V2Config
from .ops import (apply_rope, engram_indices, hadamard_mlp, matmul, mhc_lane_offsets, rms_unit,
                  rope_tables, shift_right, sinkhorn, zcrms)
from .params import BLOCK

COARSE = ("hpre", "u", "alpha", "bx", "y", "hpost", "hres", "x")


class DecodeInputError(ValueError):
    """An input forward_cached refuses (names the argument, its value and the limit)."""


def init_kv_cache(cfg: V2Config, batch: int, max_len: int, dtype=torch.float32):
    if batch < 1 or not 1 <= max_len <= cfg.max_seq_len:
        raise DecodeInputError(f"batch={batch} must be >= 1 and max_len={max_len} in "
                               f"1..max_seq_len={cfg.max_seq_len}")
    shape = (cfg.num_layers, batch, cfg.num_kv_heads, max_len, cfg.head_dim)
    return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)


def layer_params(params: dict, i: int) -> dict:
    b, sa = BLOCK, f"{BLOCK}/self_attn"
    return {
        "pre": params[f"{b}/ZCRMSNorm_0/scale"][i],
        "q": params[f"{sa}/q_proj/kernel"][i], "k": params[f"{sa}/k_proj/kernel"][i],
        "v": params[f"{sa}/v_proj/kernel"][i], "o": params[f"{sa}/out_proj/kernel"][i],
        "gate": params[f"{sa}/gate_proj/kernel"][i],
        "qn": params[f"{sa}/q_norm/scale"][i], "kn": params[f"{sa}/k_norm/scale"][i],
        "post": params[f"{b}/post_attn_norm/scale"][i], "attn_gate": params[f"{b}/attn_gate"][i],
        "pre_hada": params[f"{b}/pre_hada_norm/scale"][i],
        "d1": params[f"{b}/hadamard_mlp/d1"][i], "d2": params[f"{b}/hadamard_mlp/d2"][i],
        "d3": params[f"{b}/hadamard_mlp/d3"][i],
    }


def _emit(trace, name, layer, value):
    if trace is not None:
        trace(name, layer, value)


def attention_cached(h, lp, k_cache_l, v_cache_l, pos, cos_s, sin_s, cfg, kv_window,
                     key_valid, sink, trace=None, layer=None, kv_store=None):
    """Gated GQA attention for S new positions; writes their K/V into the layer's cache
    (through `kv_store(values)` when the cache holds a narrower format: reference/precision.py)."""
    B, S, _ = h.shape
    H, KV, hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    q = matmul(h, lp["q"]).reshape(B, S, H, hd).transpose(1, 2)        # [B, H, S, hd]
    k = matmul(h, lp["k"]).reshape(B, S, KV, hd).transpose(1, 2)       # [B, KV, S, hd]
    v = matmul(h, lp["v"]).reshape(B, S, KV, hd).transpose(1, 2)
    q = apply_rope(zcrms(q, lp["qn"]), cos_s, sin_s)
    k = apply_rope(zcrms(k, lp["kn"]), cos_s, sin_s)
    _emit(trace, "q", layer, q)
    _emit(trace, "k", layer, k)
    _emit(trace, "v", layer, v)
    k_cache_l[:, :, pos:pos + S] = k if kv_store is None else kv_store(k)
    v_cache_l[:, :, pos:pos + S] = v if kv_store is None else kv_store(v)
    M = k_cache_l.shape[2]

    qg = q.reshape(B, KV, cfg.rep, S, hd)                          # contiguous GQA groups
    scores = torch.einsum("bgrsd,bgld->bgrsl", qg, k_cache_l) / math.sqrt(hd)
    qpos = pos + torch.arange(S)
    kpos = torch.arange(M)
    allowed = (kpos[None, :] <= qpos[:, None])[None]               # [1, S, M]
    if kv_window:
        recent = ((qpos[:, None] - kpos[None, :]) < kv_window)[None]
        allowed = allowed & (recent if sink is None else recent | sink[:, None, :])
    if key_valid is not None:
        allowed = allowed & key_valid[:, None, :]
    # A finite floor, as upstream: an all-masked row becomes uniform instead of NaN.
    scores = torch.where(allowed[:, None, None], scores, torch.finfo(scores.dtype).min)
    w = torch.softmax(scores, dim=-1)
    o = torch.einsum("bgrsl,bgld->bgrsd", w, v_cache_l)
    o = o.reshape(B, H, S, hd).transpose(1, 2).reshape(B, S, cfg.attn_dim_eff)
    gate = torch.sigmoid(matmul(h, lp["gate"]))
    _emit(trace, "attn", layer, o)
    _emit(trace, "gate", layer, gate)
    return matmul(o * gate, lp["o"])


def block_cached(bx, lp, k_cache_l, v_cache_l, pos, cos_s, sin_s, cfg, kv_window, key_valid,
                 sink, trace=None, layer=None, kv_store=None):
    """Sandwich-norm block: attention then HadamardMLP, each with its residual."""
    h = zcrms(bx, lp["pre"])
    _emit(trace, "h_in", layer, h)
    a = attention_cached(h, lp, k_cache_l, v_cache_l, pos, cos_s, sin_s, cfg, kv_window,
                         key_valid, sink, trace, layer, kv_store)
    _emit(trace, "attn_out", layer, a)
    a = zcrms(a, lp["post"])
    _emit(trace, "attn_post", layer, a)
    z = bx + torch.sigmoid(lp["attn_gate"]) * a
    m = zcrms(z, lp["pre_hada"])
    _emit(trace, "mlp_in", layer, m)
    m = hadamard_mlp(m, lp["d1"], lp["d2"], lp["d3"], cfg.d_model)
    _emit(trace, "mlp_out", layer, m)
    return z + m


def engram_kv(params, cfg, hist, hist_valid, pos, S):
    """Per-site Engram keys and convolved values for positions pos..pos+S-1: [sites, B, S, d].

    Works over the window hist[pos-W : pos+S] (W = taps * dilation), zero and invalid before
    position 0, exactly the span the taps and n-grams of the new positions can reach.
    """
    W, dil = cfg.engram_hist_window, cfg.engram_dilation
    B = hist.shape[0]
    win = torch.nn.functional.pad(hist, (W, 0))[:, pos:pos + W + S]
    win_valid = torch.nn.functional.pad(hist_valid, (W, 0))[:, pos:pos + W + S]
    win_valid = win_valid.to(params["embedding/embedding"].dtype)
    orders, heads = cfg.engram_orders, cfg.engram_heads_eff
    idx = engram_indices(win, orders, heads, cfg.engram_slots)     # [B, W+S, T]
    # Only the oldest token of each n-gram, and only the tapped position, is checked.
    ngram_ok = torch.stack([shift_right(win_valid, o - 1) for o in orders for _ in range(heads)],
                           dim=-1)
    tap_ok = [shift_right(win_valid, j * dil) for j in range(cfg.engram_taps)]
    table_ids = torch.arange(cfg.engram_tables)
    ks, vs = [], []
    for s in range(cfg.num_sites):
        tables = params[f"engrams_{s}/embedding"]
        e = (tables[table_ids, idx] * ngram_ok[..., None]).reshape(B, W + S, -1)
        k = matmul(e, params[f"engrams_{s}/key_proj/kernel"])
        vraw = matmul(e, params[f"engrams_{s}/value_proj/kernel"])
        taps = params[f"engrams_{s}/taps"]
        v = 0
        for j in range(cfg.engram_taps):
            v = v + taps[j] * shift_right(vraw, j * dil) * tap_ok[j][..., None]
        ks.append(k[:, W:])
        vs.append(v[:, W:])
    return torch.stack(ks), torch.stack(vs)


def _check_inputs(params, cfg, tokens, k_cache, v_cache, pos, hist, hist_valid, sink,
                  key_valid):
    if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2 or tokens.dtype.is_floating_point:
        raise DecodeInputError(f"tokens must be an integer tensor [B, S], got "
                               f"{getattr(tokens, 'dtype', type(tokens))} "
                               f"{list(getattr(tokens, 'shape', []))}")
    B, S = tokens.shape
    if S < 1:
        raise DecodeInputError("tokens must hold at least one position (S >= 1)")
    lo, hi = int(tokens.min()), int(tokens.max())
    if lo < 0 or hi >= cfg.vocab_size:
        bad = hi if hi >= cfg.vocab_size else lo
        raise DecodeInputError(f"token id {bad} outside 0..vocab_size-1={cfg.vocab_size - 1}")
    want = (cfg.num_layers, B, cfg.num_kv_heads, None, cfg.head_dim)
    for name, c in (("k_cache", k_cache), ("v_cache", v_cache)):
        if c.dim() != 5 or any(w is not None and w != g for w, g in zip(want, c.shape)):
            raise DecodeInputError(f"{name} shape {list(c.shape)} must be "
                                   f"[L={want[0]}, B={B}, KV={want[2]}, M, hd={want[4]}]")
    if k_cache.shape != v_cache.shape:
        raise DecodeInputError(f"k_cache {list(k_cache.shape)} and v_cache "
                               f"{list(v_cache.shape)} differ")
    dtype = params["embedding/embedding"].dtype
    if k_cache.dtype != dtype or v_cache.dtype != dtype:
        raise DecodeInputError(f"caches are {k_cache.dtype}/{v_cache.dtype}; params are {dtype}")
    M = k_cache.shape[3]
    if pos < 0 or pos + S > M or pos + S > cfg.max_seq_len:
        raise DecodeInputError(f"positions pos={pos}..{pos + S - 1} must lie in "
                               f"0..{min(M, cfg.max_seq_len) - 1} (cache length {M}, "
                               f"max_seq_len {cfg.max_seq_len})")
    for name, m in (("sink", sink), ("key_valid", key_valid)):
        if m is not None and (m.dtype != torch.bool or tuple(m.shape) != (B, M)):
            raise DecodeInputError(f"{name} must be bool [B={B}, M={M}], got {m.dtype} "
                                   f"{list(m.shape)}")
    if hist is not None:
        if hist.dim() != 2 or hist.shape[0] != B or hist.shape[1] < pos + S \
                or hist.dtype.is_floating_point:
            raise DecodeInputError(f"hist must be integer [B={B}, >= pos+S={pos + S}], got "
                                   f"{hist.dtype} {list(hist.shape)}")
        if hist_valid is not None and (hist_valid.dtype != torch.bool
                                       or hist_valid.shape != hist.shape):
            raise DecodeInputError(f"hist_valid must be bool {list(hist.shape)}, got "
                                   f"{hist_valid.dtype} {list(hist_valid.shape)}")
        if int(hist.min()) < 0 or int(hist.max()) >= cfg.vocab_size:
            raise DecodeInputError(f"hist holds ids outside 0..{cfg.vocab_size - 1}")


def layer_cached(params, cfg: V2Config, i: int, x, engram, k_cache_l, v_cache_l, pos, cos_s,
                 sin_s, kv_window, key_valid, sink, trace, offsets, *, kv_store=None):
    """Layer `i` on lanes x [B, S, n, d]: the mHC routing around one block. `engram` is the
    layer's site's (keys, values) [B, S, d] or None; `offsets` its (pre, post) lane offsets.
    Writes the layer's K/V into its cache; returns the new lanes. (The ladder re-runs a layer
    through this from another implementation's recorded inputs: ladder/sides/dump_locate.py.)"""
    B, S, n, C = x.shape
    st = "stack/mhc_"
    nx = rms_unit(x.reshape(B, S, n * C))                          # one rms over all lanes
    _emit(trace, "nx", i, nx)
    hpre = torch.sigmoid(params[st + "a_pre"][i] * matmul(nx, params[st + "phi_pre"][i])
                         + params[st + "b_pre"][i] + offsets[0])
    _emit(trace, "hpre", i, hpre)
    u = torch.einsum("btn,btnc->btc", hpre, x)
    _emit(trace, "u", i, u)
    bx = u
    if engram is not None:
        ek, ev = engram
        alpha = torch.sigmoid(torch.einsum("btd,btd->bt", rms_unit(u), rms_unit(ek))
                              / math.sqrt(C))
        _emit(trace, "alpha", i, alpha)
        bx = u + alpha[..., None] * ev
    _emit(trace, "bx", i, bx)
    out = block_cached(bx, layer_params(params, i), k_cache_l, v_cache_l, pos, cos_s,
                       sin_s, cfg, kv_window, key_valid, sink, trace, i, kv_store)
    _emit(trace, "block_out", i, out)
    y = out - u                                                    # minus u, not bx
    _emit(trace, "y", i, y)
    hpost = 2 * torch.sigmoid(params[st + "a_post"][i] * matmul(nx, params[st + "phi_post"][i])
                              + params[st + "b_post"][i] + offsets[1])
    _emit(trace, "hpost", i, hpost)
    res = params[st + "a_res"][i] * matmul(nx, params[st + "phi_res"][i]).reshape(B, S, n, n) \
        + params[st + "b_res"][i]
    _emit(trace, "res_logits", i, res)
    hres = sinkhorn(res)
    _emit(trace, "hres", i, hres)
    x = torch.einsum("btij,btjc->btic", hres, x) + hpost[..., None] * y[:, :, None, :]
    _emit(trace, "x", i, x)
    return x


def forward_cached(params, cfg: V2Config, tokens, k_cache, v_cache, pos, *, kv_window=None,
                   hist=None, hist_valid=None, sink=None, key_valid=None, trace=None,
                   kv_store=None):
    """Run S tokens at positions pos..pos+S-1. Returns (logits [B,S,V], k_cache', v_cache').

    The caches passed in are not modified; updated copies are returned. `kv_window=None`
    means `cfg.kv_window` (0: full causal). With `hist=None` the call's own tokens are the
    Engram history anchored at position 0 (upstream's rule: right only for a prefill at 0).
    `kv_store`: what the cache keeps of each new K/V (None: the values themselves; the
    noise-floor reference's int8 KV, reference/precision.py).
    """
    pos = int(pos)
    _check_inputs(params, cfg, tokens, k_cache, v_cache, pos, hist, hist_valid, sink,
                  key_valid)
    kv_window = cfg.kv_window if kv_window is None else int(kv_window)
    if kv_window < 0:
        raise DecodeInputError(f"kv_window={kv_window} must be >= 0")
    tokens = tokens.to(torch.int64)
    emb = params["embedding/embedding"]
    dtype = emb.dtype
    B, S = tokens.shape
    n, C = cfg.mhc_lanes, cfg.d_model
    k_cache, v_cache = k_cache.clone(), v_cache.clone()

    x0 = emb[tokens] * math.sqrt(C)
    _emit(trace, "embed", None, x0)
    cos, sin = rope_tables(cfg.head_dim, k_cache.shape[3], cfg.rope_theta, dtype)
    cos_s, sin_s = cos[pos:pos + S], sin[pos:pos + S]

    ek = ev = None
    if cfg.num_sites:
        h = tokens if hist is None else hist.to(torch.int64)
        hv = torch.ones(h.shape, dtype=torch.bool) if hist_valid is None else hist_valid
        ek, ev = engram_kv(params, cfg, h, hv, 0 if hist is None else pos, S)
        for s in range(cfg.num_sites):
            _emit(trace, f"engram_k{s}", None, ek[s])
            _emit(trace, f"engram_v{s}", None, ev[s])

    pre_off, post_off = mhc_lane_offsets(cfg.num_layers, n, dtype)
    x = x0[:, :, None, :].expand(B, S, n, C)                       # lanes [B, S, n, d]
    for i in range(cfg.num_layers):
        site = cfg.site_of_layer(i)
        eng = None if site is None else (ek[site], ev[site])
        x = layer_cached(params, cfg, i, x, eng, k_cache[i], v_cache[i], pos, cos_s, sin_s,
                         kv_window, key_valid, sink, trace, (pre_off[i], post_off[i]),
                         kv_store=kv_store)
    m = torch.mean(x, dim=2)
    _emit(trace, "lane_mean", None, m)
    f = zcrms(m, params["stack/final_norm/scale"])
    _emit(trace, "final_norm", None, f)
    logits = matmul(f, emb.T)
    _emit(trace, "logits", None, logits)
    return logits, k_cache, v_cache


def generate(params, cfg: V2Config, prompt, max_new_tokens: int, *, kv_window=None,
             max_len=None, eos_id=None):
    """Greedy decoding (B = 1): one prefill call, then one call per new token.

    Returns the generated ids (without the prompt), stopping early at `eos_id`.
    """
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise DecodeInputError("prompt must hold at least one token")
    max_len = max_len or min(cfg.max_seq_len, len(prompt) + max_new_tokens)
    if len(prompt) > max_len:
        raise DecodeInputError(f"prompt of {len(prompt)} tokens exceeds max_len={max_len}")
    dtype = params["embedding/embedding"].dtype
    kc, vc = init_kv_cache(cfg, 1, max_len, dtype)
    hist = torch.zeros(1, max_len, dtype=torch.int64)
    hist[0, :len(prompt)] = torch.tensor(prompt)
    valid = torch.ones(1, max_len, dtype=torch.bool)
    logits, kc, vc = forward_cached(params, cfg, hist[:, :len(prompt)], kc, vc, 0,
                                    kv_window=kv_window, hist=hist, hist_valid=valid)
    out, pos = [], len(prompt)
    nxt = int(torch.argmax(logits[0, -1]))
    for _ in range(max_new_tokens):
        if nxt == eos_id or pos >= max_len:
            break
        out.append(nxt)
        hist[0, pos] = nxt
        logits, kc, vc = forward_cached(params, cfg, hist[:, pos:pos + 1], kc, vc, pos,
                                        kv_window=kv_window, hist=hist, hist_valid=valid)
        nxt = int(torch.argmax(logits[0, -1]))
        pos += 1
    return out
