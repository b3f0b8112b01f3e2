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

from reference.v41.config import MAX_SELECTION

from .ops import (AttnV41Error, block_filter, fp4_e4m3_rt, fp4_e8m0_rt, rms, rope,
                           topk_positions, visible)


NOTHING_PUBLISHED = {"compress_kv": None, "index_k": None, "topk_idxs": None, "candidates": None}


def yields_latents(r, m, start_pos):
    """Whether m tokens at start_pos complete at least one group of r (the Compressor yields)."""
    return m >= r if start_pos == 0 else (start_pos + 1) % r == 0


def check_sources(st, layer, m, start_pos):
    """Refuse a call whose layer would read something no source has published, before the call
    writes anything (spec §2.2). Judged against the state the call would see: a fresh one when
    layer 0 at position 0 starts the sequence."""
    a, role = st.args, st.args.role(layer)
    if not role.ratio:
        return
    sh = NOTHING_PUBLISHED if layer == 0 and start_pos == 0 else st.shared
    r, clen = role.ratio, (start_pos + m) // role.ratio
    if not role.is_kv_source and sh["compress_kv"] is None:
        raise AttnV41Error(f"layer {layer} (ratio {r}) runs before any kv source published a "
                           f"compressed cache")
    if role.is_index_source:
        if clen and sh["index_k"] is None and not (role.is_kv_source and
                                                   yields_latents(r, m, start_pos)):
            raise AttnV41Error(f"index source {layer} runs before any index keys were published")
        keep = sh["candidates"]
        if clen and role.uses_candidates and (keep is None or tuple(keep.shape) != (m, clen)):
            raise AttnV41Error(f"index source {layer} needs the candidate filter for {(m, clen)} "
                               f"scores (published: {None if keep is None else tuple(keep.shape)})")
        return
    sel = sh["topk_idxs"]
    if sel is None or sel.shape[0] != m:
        raise AttnV41Error(f"layer {layer} reuses a selection no index source published for "
                           f"these {m} queries (published: "
                           f"{None if sel is None else list(sel.shape)}, needs [{m}, k])")
    width = (min(m, a.window_size) if start_pos == 0 else a.window_size) + sel.shape[1]
    if width > st._fixed(True):
        raise AttnV41Error(f"layer {layer}: selection of {width} entries exceeds "
                           f"min(window + index_topk, {MAX_SELECTION}) = {st._fixed(True)}")


def compressed_part(st, layer, role, x, qr, start_pos, offset, tr):
    """-> (the published compressed cache, this layer's selection [m, k], compress_len).
    check_sources has vetted what this reads."""
    sh, m, r = st.shared, x.shape[0], role.ratio
    clen = (start_pos + m) // r
    latent = None
    if role.is_kv_source:
        latent = compress(st, layer, r, x, start_pos)
        sh["compress_kv"] = st.cache[layer]
        if latent is not None:
            tr("latent", layer, latent)
    if role.is_index_source:
        sel = torch.empty(m, 0, dtype=torch.int64, device=st.dev) if clen == 0 else \
            index(st, layer, role, x, qr, latent, start_pos, offset, tr)
        sh["topk_idxs"] = sel
    else:
        sel = sh["topk_idxs"]
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


def _softmax_pool(kv, gate):
    """Groups [g, r, d] f32 -> [g, d]: each channel's r values weighted by the softmax of their
    gates along the group (spec §3.6 fixes the order: weights times values, then the sum)."""
    return (kv * torch.softmax(gate, dim=1)).sum(dim=1)


def compress(st, layer, r, x, start_pos):
    """Pre-RoPE latents completed by this call ([groups, hd] bf16) or None."""
    a = st.args
    norm = st._p(layer, "compressor.norm.weight")
    if r == 1:
        return rms(F.linear(x, st._p(layer, "compressor.wkv.weight")), norm, a.norm_eps)
    xf = x.float()
    kv = F.linear(xf, st._p(layer, "compressor.wkv.weight"))
    gate = F.linear(xf, st._p(layer, "compressor.wgate.weight"))
    held_kv, held_gate, m = st.kv_state[layer], st.score_state[layer], x.shape[0]
    if start_pos:                                       # decode: slot start_pos mod r
        held_kv[start_pos % r].copy_(kv[0])
        held_gate[start_pos % r].copy_(gate[0])
        groups = (held_kv.unsqueeze(0), held_gate.unsqueeze(0)) \
            if yields_latents(r, 1, start_pos) else None
    else:                                               # prefill: the leftover rows are held
        done = m // r
        held_kv[:m - done * r].copy_(kv[done * r:])
        held_gate[:m - done * r].copy_(gate[done * r:])
        groups = (kv[:done * r].view(done, r, -1), gate[:done * r].view(done, r, -1)) \
            if done else None
    if groups is None:
        return None
    return rms(_softmax_pool(*groups).to(torch.bfloat16), norm, a.norm_eps)


def index(st, layer, role, x, qr, latent, start_pos, offset, tr):
    """The index source's selection [m, k] on st.dev: scores on the device, then the host
    decision (scores come down and the top-k runs on the CPU, whose tie rule for the frequent
    exact ties, bf16 scores and -inf, is the official one)."""
    a, m, r = st.args, x.shape[0], role.ratio
    width = (start_pos + m) // r
    if role.is_kv_source and latent is not None:       # only group-completing calls
        st.shared["index_k"] = _write_index_keys(st, layer, r, latent, start_pos)
    score = _index_scores(st, layer, x, qr, st.shared["index_k"][:width], start_pos, tr).cpu()
    lens = visible(m, start_pos, r)
    if start_pos == 0:
        score = score.masked_fill(torch.arange(width).unsqueeze(0) >= lens, -torch.inf)
    score = _apply_candidates(st, role, score, lens)
    return topk_positions(score, lens, min(a.index_topk, width), offset).to(st.dev)


def _write_index_keys(st, layer, r, latent, start_pos):
    """Index keys of the new latents (spec §3.7: wk, k_norm, RoPE at the group position, fp4
    e8m0) stored at their cache rows; returns the key cache to publish."""
    a = st.args
    k = rms(F.linear(latent, st._p(layer, "indexer.wk.weight")),
            st._p(layer, "indexer.k_norm.weight"), a.norm_eps)
    k = fp4_e8m0_rt(rope(k, st.yarn[_group_pos(k.shape[0], r, start_pos, st.dev)]))
    row0 = start_pos // r
    st.kcache[layer][row0:row0 + k.shape[0]] = k
    return st.kcache[layer]


def _index_scores(st, layer, x, qr, keys, start_pos, tr):
    """[m, W] bf16 scores of the m queries against keys [W, d]."""
    a, m = st.args, x.shape[0]
    qi = F.linear(qr, st._p(layer, "indexer.wq_b.weight")).view(m, a.index_n_heads,
                                                                 a.index_head_dim)
    qi = fp4_e8m0_rt(rope(qi, st.yarn[start_pos:start_pos + m]))
    tr("index_q", layer, qi)
    head_w = F.linear(x, st._p(layer, "indexer.weights_proj.weight")) * \
        (a.index_head_dim ** -0.5 * a.index_n_heads ** -0.5)
    dots = torch.matmul(qi.reshape(-1, a.index_head_dim), keys.t()).view(m, a.index_n_heads, -1)
    # spec §3.7's order: per head weight the rectified dot (rounded to bf16), then sum heads
    return torch.sum(torch.relu(dots) * head_w[:, :, None], dim=1)


def _apply_candidates(st, role, score, lens):
    """The candidate source publishes its block filter (and keeps its own scores); a later
    index source scores only inside that filter (shape vetted by check_sources)."""
    a, sh = st.args, st.shared
    if role.is_candidate_source:
        sh["candidates"] = block_filter(score, lens, a.candidate_topk_blocks,
                                        a.candidate_block_size)
    elif role.uses_candidates:
        score = score.masked_fill(~sh["candidates"], -torch.inf)
    return score
