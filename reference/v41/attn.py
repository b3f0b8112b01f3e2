"""DeepSeek-V4.1 attention, every layer class, restated plainly (attn_v41 spec §2.2, §3).

`AttnV41(args, weights)` (`AttnStackV41` is the same type): `args` carries the official
ModelArgs field names (see reference/v41/config.py: `n_layers` backbone layers; MTP layers'
attention weights `mtp.{k}.attn.*` are held when given, never run), `weights` the official
parameter names (`layers.{i}.attn.wq_a.weight`, `...compressor.wkv.weight`,
`...indexer.wq_b.weight`, `...attn_sink`, ...). `reset()` starts a
sequence (layer 0 at position 0 also does); `forward(layer, x, start_pos, trace=None)` runs one
layer's attention on its normed input x [m, dim] bf16 and returns [m, dim] bf16. Within a call
the layers run in order 0..L-1, so sources publish before their consumers read:

  kv source      runs the Compressor and publishes its compressed cache (and index keys)
  index source   runs the Indexer and publishes its selection (an empty one while nothing is
                 compressed); the candidate source also publishes its block filter
  other ratio>0  attends over what was last published
  ratio 0        its own window only

Attention is one sparse softmax over [window rows | compressed rows] with a per-head sink in the
denominator, computed like the official kernel: tiles of 64 selected rows, a running max floored
at -1e30, probabilities rounded to bf16 before they weight the rows, the sink added last.
Trace points (trace(name, layer, tensor)): qr, q, kv, window_idxs, latent (pre-RoPE, sources),
index_q, compressed_rows, topk_idxs (merged), o (before inverse RoPE), o_rot, og, out.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .index import candidate_keep, select, visible_lens, window_idxs
from .quant import fp4_roundtrip_e4m3, fp4_roundtrip_e8m0, fp8_roundtrip
from .rope import rope_table, rotate
from .config import (V41Args, V41ConfigError, forward_call_problem, mtp_layers_present,
                          mtp_weight_names, weight_names)

TILE = 64
NOTHING_PUBLISHED = {"compress_kv": None, "index_k": None, "topk_idxs": None, "candidates": None}


class AttnV41Error(ValueError):
    """A call the V4.1 attention refuses (names the value and the limit)."""


def rms_norm(x, w, eps):
    """Rows of x scaled to unit root-mean-square, then by the weight, in f32, back to x's dtype
    (spec §3.2 forces the order: w·(x·rsqrt(mean x² + eps)), not (w·x)·rsqrt(...))."""
    wide = x.float()
    inv_rms = torch.rsqrt(torch.mean(wide * wide, dim=-1, keepdim=True) + eps)
    return (wide * inv_rms * w).to(x.dtype)


def grouped_out(o_rot, wo_a, wo_b, groups):
    """spec §3.10: head outputs [m, H, D] -> (og [m, groups·rank], out [m, dim]). The H·D row
    splits into `groups` contiguous chunks (whole heads); chunk g meets only its own rank-sized
    block of wo_a, which is why this is a batched product over groups and not one Linear."""
    chunks = o_rot.reshape(o_rot.shape[0], groups, -1)              # [m, G, H·D/G]
    blocks = wo_a.unflatten(0, (groups, -1))                        # [G, rank, H·D/G]
    og = torch.einsum("tgk,grk->tgr", chunks, blocks).flatten(1)
    return og, F.linear(og, wo_b)


def completes_group(ratio: int, m: int, start_pos: int) -> bool:
    """Whether a call of m tokens at start_pos completes a compressor group (yields latents)."""
    return m >= ratio if start_pos == 0 else (start_pos + 1) % ratio == 0


def gated_pool(values, gates):
    """[g, r, d] f32 each -> [g, d]: per channel, a softmax of the gates over the group's r tokens
    weighs their values (spec §3.6: product, then the sum over the group)."""
    return (values * gates.softmax(dim=1)).sum(dim=1)


def _tile_rows(table, entries):
    """One tile of selection entries [m, B] -> (present [m, B], its rows [m, B, D] in f32). An
    absent entry (-1) reads row 0 and then zeros it, so it adds nothing to the weighted row sum
    (its weight is exp(-inf) = 0 anyway); the mask keeps its score out of the max."""
    present = entries >= 0
    rows = torch.where(present.unsqueeze(-1), table[entries.clamp_min(0)], 0.0)
    return present, rows


def sparse_attn_sink(q, rows, sink, idx, scale):
    """q [m, H, D] bf16, rows [N, D] bf16 (key and value), sink [H] f32, idx [m, K] (-1 absent)
    -> [m, H, D] bf16.

    One pass over the selection in tiles of TILE entries, carrying per (query, head) the largest
    score so far (`peak`), the softmax denominator (`mass`) and the unnormalised output
    (`blend`); both sums are rescaled whenever a tile raises the peak. The peak starts at a
    finite -1e30, so a query that selects nothing ends with zero weights and a zero output.
    """
    qf, table = q.float(), rows.float()
    peak = torch.full(q.shape[:2], -1e30, dtype=torch.float32)
    mass = torch.zeros(q.shape[:2], dtype=torch.float32)
    blend = torch.zeros(q.shape, dtype=torch.float32)
    for entries in idx.long().split(TILE, dim=1):
        present, tile = _tile_rows(table, entries)
        score = torch.einsum("thd,tkd->thk", qf, tile) * scale
        score = score.masked_fill(~present.unsqueeze(1), -torch.inf)
        # spec §3.8/§6.2 fix this order: weights against the raised peak, f32 weights into the
        # denominator, the same weights rounded to bf16 for the rows, both sums rescaled first
        raised = torch.maximum(peak, score.amax(dim=-1))
        decay = torch.exp(peak - raised)
        weight = torch.exp(score - raised.unsqueeze(-1))
        mass = mass * decay + weight.sum(dim=-1)
        blend = blend * decay.unsqueeze(-1) + \
            torch.einsum("thk,tkd->thd", weight.bfloat16().float(), tile)
        peak = raised
    # spec §3.8: the sink enters the denominator only, once, against the final peak
    return (blend / (mass + torch.exp(sink.float() - peak)).unsqueeze(-1)).to(torch.bfloat16)


class AttnStackV41:
    def __init__(self, args, weights: dict):
        try:
            self.args = a = V41Args.from_any(args)
            self.mtp = mtp_layers_present(a, weights)
        except V41ConfigError as e:
            raise AttnV41Error(str(e)) from None
        self.w = {}
        for i in range(a.n_layers):
            for name in weight_names(a, i):
                if name not in weights:
                    raise AttnV41Error(f"weights lack {name!r} (layer {i}'s role needs it)")
                self.w[name] = weights[name]
        for k in self.mtp:                  # held, not run: DSpark attention reads main_x
            self.w.update({n: weights[n] for n in mtp_weight_names(k)})
        self.plain = rope_table(a.rope_head_dim, a.max_seq_len, a.rope_theta)
        self.yarn = rope_table(a.rope_head_dim, a.max_seq_len, a.compress_rope_theta, True,
                               a.rope_factor, a.original_seq_len, a.beta_fast, a.beta_slow)
        self.reset()

    def reset(self):
        a = self.args
        bf = torch.bfloat16
        self.ring = [torch.zeros(a.window_size, a.head_dim, dtype=bf) for _ in range(a.n_layers)]
        self.cache, self.kcache, self.kv_state, self.score_state = {}, {}, {}, {}
        for i in a.kv_sources:
            r = a.compress_ratios[i]
            self.cache[i] = torch.zeros(a.max_seq_len // r, a.head_dim, dtype=bf)
            if i in a.index_sources:
                self.kcache[i] = torch.zeros(a.max_seq_len // r, a.index_head_dim, dtype=bf)
            if r > 1:
                self.kv_state[i] = torch.zeros(r, a.head_dim, dtype=torch.float32)
                self.score_state[i] = torch.full((r, a.head_dim), -torch.inf,
                                                 dtype=torch.float32)
        self.shared = dict(NOTHING_PUBLISHED)

    def _p(self, layer, name):
        return self.w[f"layers.{layer}.attn.{name}"]

    def _check(self, layer, x, start_pos):
        problem = forward_call_problem(self.args, layer, x, start_pos, self.args.max_seq_len)
        if problem:
            raise AttnV41Error(problem)

    def _check_sources(self, layer, m, start_pos):
        """Refuse, before anything is written, a call whose layer would read what no source has
        published (spec §2.2): the state it is judged against is the one the call would see,
        i.e. a fresh one when layer 0 at position 0 starts a sequence."""
        role = self.args.role(layer)
        if not role.ratio:
            return
        sh = NOTHING_PUBLISHED if layer == 0 and start_pos == 0 else self.shared
        r, clen = role.ratio, (start_pos + m) // role.ratio
        if not role.is_kv_source and sh["compress_kv"] is None:
            raise AttnV41Error(f"layer {layer} (ratio {r}) runs before any kv source "
                               f"published a compressed cache")
        if not role.is_index_source:
            sel = sh["topk_idxs"]
            if sel is None or sel.shape[0] != m:
                raise AttnV41Error(f"layer {layer} reuses a selection no index source published "
                                   f"for these {m} queries (published: "
                                   f"{None if sel is None else list(sel.shape)})")
            return
        if clen == 0:
            return                                   # publishes the empty selection
        if sh["index_k"] is None and not (role.is_kv_source and
                                          completes_group(r, m, start_pos)):
            raise AttnV41Error(f"index source {layer} runs before any index keys were published")
        if role.uses_candidates:
            cand = sh["candidates"]
            if cand is None or tuple(cand.shape) != (m, clen):
                raise AttnV41Error(f"index source {layer} needs the candidate source's filter "
                                   f"for {(m, clen)} scores (published: "
                                   f"{None if cand is None else tuple(cand.shape)})")

    def forward(self, layer: int, x, start_pos: int, trace=None):
        self._check(layer, x, start_pos)
        self._check_sources(layer, x.shape[0], start_pos)
        if layer == 0 and start_pos == 0:
            self.reset()
        a, role = self.args, self.args.role(layer)
        tr = trace or (lambda name, lay, v: None)
        m = x.shape[0]
        f = (self.yarn if role.ratio else self.plain)[start_pos:start_pos + m]

        qr = rms_norm(F.linear(x, self._p(layer, "wq_a.weight")), self._p(layer, "q_norm.weight"),
                      a.norm_eps)
        q = rotate(F.linear(qr, self._p(layer, "wq_b.weight")).view(m, a.n_heads, a.head_dim), f)
        kv = rms_norm(F.linear(x, self._p(layer, "wkv.weight")), self._p(layer, "kv_norm.weight"),
                      a.norm_eps)
        kv = fp8_roundtrip(rotate(kv, f))
        tr("qr", layer, qr), tr("q", layer, q), tr("kv", layer, kv)

        ring, win = self.ring[layer], a.window_size
        for t in range(max(0, m - win), m):               # the ring holds position p at p % win
            ring[(start_pos + t) % win] = kv[t]
        rows = kv if start_pos == 0 else ring
        idx = window_idxs(win, m, start_pos)
        tr("window_idxs", layer, idx)
        if role.ratio:
            rows_b, sel = self._compressed(layer, role, x, qr, start_pos, rows.shape[0], tr)
            rows = torch.cat([rows, rows_b])
            idx = torch.cat([idx, sel], dim=1)
        tr("topk_idxs", layer, idx)

        o = sparse_attn_sink(q, rows, self._p(layer, "attn_sink"), idx, a.head_dim ** -0.5)
        o_rot = rotate(o, f, inverse=True)
        og, out = grouped_out(o_rot, self._p(layer, "wo_a.weight"),
                              self._p(layer, "wo_b.weight"), a.o_groups)
        tr("o", layer, o), tr("o_rot", layer, o_rot), tr("og", layer, og), tr("out", layer, out)
        return out

    # ---- compressed part ----
    def _compressed(self, layer, role, x, qr, start_pos, offset, tr):
        sh, m = self.shared, x.shape[0]
        ratio = role.ratio
        clen = (start_pos + m) // ratio
        latent = None
        if role.is_kv_source:
            latent = self._compress(layer, ratio, x, start_pos)
            sh["compress_kv"] = self.cache[layer]
            if latent is not None:
                tr("latent", layer, latent)
        if role.is_index_source:
            if clen == 0:
                sel = torch.empty(m, 0, dtype=torch.int32)
            else:
                sel = self._index(layer, role, x, qr, latent, start_pos, offset, tr)
            sh["topk_idxs"] = sel
        else:
            sel = sh["topk_idxs"]                    # its row count was checked up front
        if latent is not None:
            g = latent.shape[0]
            pos = torch.arange(g) * ratio if start_pos == 0 \
                else torch.tensor([start_pos + 1 - ratio])
            row0 = start_pos // ratio
            self.cache[layer][row0:row0 + g] = fp4_roundtrip_e4m3(rotate(latent, self.yarn[pos]))
        rows_b = sh["compress_kv"][:clen]
        tr("compressed_rows", layer, rows_b)
        return rows_b, sel

    def _compress(self, layer, ratio, x, start_pos):
        """The pre-RoPE latents this call completes ([groups, hd] bf16), or None. Above ratio 1
        the tokens of a group not yet complete wait in kv_state / score_state (f32)."""
        a = self.args
        norm = self._p(layer, "compressor.norm.weight")
        if ratio == 1:                       # every token is its own group: no gate, no f32
            return rms_norm(F.linear(x, self._p(layer, "compressor.wkv.weight")), norm, a.norm_eps)
        xf = x.float()
        kv = F.linear(xf, self._p(layer, "compressor.wkv.weight"))
        gate = F.linear(xf, self._p(layer, "compressor.wgate.weight"))
        wait_kv, wait_gate = self.kv_state[layer], self.score_state[layer]
        if start_pos == 0:                   # whole groups pool now, the tail waits
            whole = x.shape[0] // ratio * ratio
            wait_kv[:x.shape[0] - whole] = kv[whole:]
            wait_gate[:x.shape[0] - whole] = gate[whole:]
            if whole == 0:
                return None
            shape = (whole // ratio, ratio, a.head_dim)
            pooled = gated_pool(kv[:whole].view(shape), gate[:whole].view(shape))
        else:                                # one token fills its slot; the last slot pools
            slot = start_pos % ratio
            wait_kv[slot], wait_gate[slot] = kv[0], gate[0]
            if slot != ratio - 1:
                return None
            pooled = gated_pool(wait_kv[None], wait_gate[None])
        return rms_norm(pooled.to(torch.bfloat16), norm, a.norm_eps)

    def _index(self, layer, role, x, qr, latent, start_pos, offset, tr):
        """This index source's selection [m, k]. A kv source first turns its new latents into
        index keys; the scores then read whatever key cache was published last."""
        a, sh, m = self.args, self.shared, x.shape[0]
        width = (start_pos + m) // role.ratio
        if role.is_kv_source and latent is not None:
            self._publish_index_keys(layer, role.ratio, latent, start_pos)
        score = self._index_scores(layer, x, qr, sh["index_k"][:width], start_pos, tr)
        lens = visible_lens(m, start_pos, role.ratio)
        if start_pos == 0:                           # a prefill query sees (t+1) div ratio
            score = score.masked_fill(torch.arange(width)[None, :] >= lens, -torch.inf)
        # the candidate source publishes its block filter but is not narrowed by it; later
        # index sources score only inside it (shape checked up front)
        if role.is_candidate_source:
            sh["candidates"] = candidate_keep(score, lens, a.candidate_topk_blocks,
                                              a.candidate_block_size)
        elif role.uses_candidates:
            score = score.masked_fill(~sh["candidates"], -torch.inf)
        return select(score, lens, min(a.index_topk, width), offset)

    def _publish_index_keys(self, layer, ratio, latent, start_pos):
        """spec §3.7 keys: k_norm(wk·latent), RoPE'd at each group's first position, fp4 (e8m0),
        written at the groups' cache rows and published. Only calls that complete a group get
        here (as in the official code): other decode steps leave the published keys as they are."""
        a = self.args
        first = torch.arange(latent.shape[0]) * ratio if start_pos == 0 \
            else torch.tensor([start_pos + 1 - ratio])
        keys = rms_norm(F.linear(latent, self._p(layer, "indexer.wk.weight")),
                        self._p(layer, "indexer.k_norm.weight"), a.norm_eps)
        keys = fp4_roundtrip_e8m0(rotate(keys, self.yarn[first]))
        cache = self.kcache[layer]
        cache[start_pos // ratio:start_pos // ratio + keys.shape[0]] = keys
        self.shared["index_k"] = cache

    def _index_scores(self, layer, x, qr, keys, start_pos, tr):
        """[m, W] bf16 index scores of the m queries against the W visible keys (spec §3.7)."""
        a, m = self.args, x.shape[0]
        head_w = F.linear(x, self._p(layer, "indexer.weights_proj.weight")) * \
            (a.index_head_dim ** -0.5 * a.index_n_heads ** -0.5)
        qi = F.linear(qr, self._p(layer, "indexer.wq_b.weight"))
        qi = qi.view(m, a.index_n_heads, a.index_head_dim)
        qi = fp4_roundtrip_e8m0(rotate(qi, self.yarn[start_pos:start_pos + m]))
        tr("index_q", layer, qi)
        per_head = (qi.flatten(0, 1) @ keys.T).view(m, a.index_n_heads, -1)    # [m, h, W]
        # spec §3.7 fixes the order: each head's rectified dot is weighted and rounded to bf16,
        # then the heads are summed (not one fused weighted contraction)
        return (per_head.relu() * head_w.unsqueeze(-1)).sum(dim=1)


AttnV41 = AttnStackV41
