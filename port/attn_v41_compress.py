"""The compressed part of a V4.1 layer in the port (attn_v41 spec §2.2 step 3, §3.6, §3.7):
the Compressor on kv sources, the Indexer on index sources (with the candidate filter), and the
publish / reuse of the shared cache, index keys and selection. Host decisions happen here
(whether a group completes, the top-k), which is why source layers are not capturable.

As in the official code, a kv source publishes its index keys only on calls that complete a
group; on the other decode steps its indexer reads the key cache published last.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .attn_v41_ops import (AttnV41Error, block_filter, fp4_e4m3_rt, fp4_e8m0_rt, rms, rope,
                           topk_positions, visible)


def compressed_part(st, layer, role, x, qr, start_pos, offset, tr):
    """-> (the published compressed cache, this layer's selection [m, k], compress_len)."""
    sh, m, r = st.shared, x.shape[0], role.ratio
    clen = (start_pos + m) // r
    latent = None
    if role.is_kv_source:
        latent = compress(st, layer, r, x, start_pos)
        sh["compress_kv"] = st.cache[layer]
        if latent is not None:
            tr("latent", layer, latent)
    if sh["compress_kv"] is None:
        raise AttnV41Error(f"layer {layer} (ratio {r}) runs before any kv source published a "
                           f"compressed cache")
    if role.is_index_source:
        sel = torch.empty(m, 0, dtype=torch.int64, device=st.dev) if clen == 0 else \
            index(st, layer, role, x, qr, latent, start_pos, offset, tr)
        sh["topk_idxs"] = sel
    else:
        sel = sh["topk_idxs"]
        if sel is None or sel.shape[0] != m:
            raise AttnV41Error(f"layer {layer} reuses a selection no index source published "
                               f"for these {m} queries")
    if latent is not None:
        row0 = start_pos // r
        st.cache[layer][row0:row0 + latent.shape[0]] = \
            fp4_e4m3_rt(rope(latent, st.yarn[_group_pos(latent.shape[0], r, start_pos, st.dev)]))
    return sh["compress_kv"], sel, clen


def _group_pos(groups, r, start_pos, dev):
    """RoPE position of each new latent: the first token of its group."""
    if start_pos == 0:
        return torch.arange(groups, device=dev) * r
    return torch.tensor([start_pos + 1 - r], device=dev)


def compress(st, layer, r, x, start_pos):
    """Pre-RoPE latents completed by this call ([groups, hd] bf16) or None."""
    a = st.args
    norm = st._p(layer, "compressor.norm.weight")
    if r == 1:
        return rms(F.linear(x, st._p(layer, "compressor.wkv.weight")), norm, a.norm_eps)
    xf = x.float()
    kv = F.linear(xf, st._p(layer, "compressor.wkv.weight"))
    gate = F.linear(xf, st._p(layer, "compressor.wgate.weight"))
    ks, gs, m = st.kv_state[layer], st.score_state[layer], x.shape[0]
    if start_pos == 0:
        n = m - m % r                                   # rows in whole groups
        ks[:m - n] = kv[n:]
        gs[:m - n] = gate[n:]
        if n == 0:
            return None
        groups = (-1, r, a.head_dim)
        pooled = (kv[:n].view(groups) * gate[:n].view(groups).softmax(1)).sum(1)
    else:
        ks[start_pos % r] = kv[0]
        gs[start_pos % r] = gate[0]
        if (start_pos + 1) % r:
            return None
        pooled = (ks * gs.softmax(0)).sum(0, keepdim=True)
    return rms(pooled.to(torch.bfloat16), norm, a.norm_eps)


def index(st, layer, role, x, qr, latent, start_pos, offset, tr):
    a, sh, m, r = st.args, st.shared, x.shape[0], role.ratio
    width = (start_pos + m) // r
    if role.is_kv_source and latent is not None:
        k = rms(F.linear(latent, st._p(layer, "indexer.wk.weight")),
                st._p(layer, "indexer.k_norm.weight"), a.norm_eps)
        k = fp4_e8m0_rt(rope(k, st.yarn[_group_pos(k.shape[0], r, start_pos, st.dev)]))
        st.kcache[layer][start_pos // r:start_pos // r + k.shape[0]] = k
        sh["index_k"] = st.kcache[layer]
    if sh["index_k"] is None:
        raise AttnV41Error(f"index source {layer} runs before any index keys were published")
    qi = F.linear(qr, st._p(layer, "indexer.wq_b.weight")).view(m, a.index_n_heads,
                                                                 a.index_head_dim)
    qi = fp4_e8m0_rt(rope(qi, st.yarn[start_pos:start_pos + m]))
    tr("index_q", layer, qi)
    head_w = F.linear(x, st._p(layer, "indexer.weights_proj.weight")) * \
        (a.index_head_dim ** -0.5 * a.index_n_heads ** -0.5)
    dots = torch.einsum("bshd,btd->bsht", qi.unsqueeze(0), sh["index_k"][:width].unsqueeze(0))
    score = (dots.relu() * head_w.unsqueeze(0).unsqueeze(-1)).sum(dim=2).squeeze(0)
    # the host decision: scores come down and the top-k runs on the CPU, whose tie rule
    # (frequent exact ties: bf16 scores, -inf) is the official one
    score, lens = score.cpu(), visible(m, start_pos, r)
    if start_pos == 0:
        score = score.masked_fill(torch.arange(width).unsqueeze(0) >= lens, -torch.inf)
    if role.is_candidate_source:
        sh["candidates"] = block_filter(score, lens, a.candidate_topk_blocks,
                                        a.candidate_block_size)
    elif role.uses_candidates:
        keep = sh["candidates"]
        if keep is None or keep.shape != score.shape:
            raise AttnV41Error(f"index source {layer} needs the candidate filter for "
                               f"{tuple(score.shape)} scores")
        score = score.masked_fill(~keep, -torch.inf)
    return topk_positions(score, lens, min(a.index_topk, width), offset).to(st.dev)
