"""Every ladder point re-computed by the reference's own op from the port's recorded inputs.

A point's chained error (the port against the reference, both run from the token) carries
everything every earlier op rounded differently: at bfloat16 a layer's MLP output inherits a
per-position scale of several rounding steps from the norms before it, and that inherited
spread, not the op, sets how small a systematic error the statistics can see. Fed the port's
own recorded inputs, the reference's op computes what that one op should have given; the
port's departure from it is the op's own error alone, a handful of roundings wide
(docs/precision.md, "Own-op statistics").

Each op reads only recorded points (never a replayed one), so an error is counted once, at the
op that made it; the ops are the reference's functions (reference/ops.py) wired as
reference/decode.py wires them, and tests/ladder/sides/test_op_replay.py holds the wiring to
the reference: replayed on the reference's own recording, every op gives its recorded values.
An op whose inputs a recording lacks is not replayed. `attn` reads the recorded keys and values
of the earlier positions of its window (stored in the cache's format), so it is replayed only
where the recording holds all of them.
"""
from __future__ import annotations

import math

import torch

from ladder.model.names import point_name


# A one-iteration-short change counts where it exceeds this many of the replay's own
# rounding steps at the value (2^-16 relative in float32): below it, the difference between
# 19 and 20 iterations is the arithmetic's noise, not convergence.
RESOLVED = 128


def _sinkhorn_pair(logits):
    """(reference.ops.sinkhorn(logits), the same one iteration short), from one run of the
    reference's iterations."""
    from reference.ops import SINKHORN_ITERS, log_sinkhorn_steps
    *_, short, plan = log_sinkhorn_steps(logits, SINKHORN_ITERS)
    return torch.exp(plan), torch.exp(short)


class Replayer:
    """The reference's ops at one precision: `params` (already at it), the activation dtype,
    the cache's store (None: values as they are)."""

    def __init__(self, params: dict, cfg, dtype, kv_store=None):
        from reference.decode import layer_params
        from reference.ops import mhc_lane_offsets
        self.P, self.cfg, self.dtype, self.kv_store = params, cfg, dtype, kv_store
        self.lps = [layer_params(params, i) for i in range(cfg.num_layers)]
        pre, post = mhc_lane_offsets(cfg.num_layers, cfg.mhc_lanes, dtype)
        self.offsets = list(zip(pre, post))

    def rope(self, positions):
        from reference.ops import rope_tables
        cos, sin = rope_tables(self.cfg.head_dim, max(positions) + 1, self.cfg.rope_theta,
                               self.dtype)
        idx = torch.as_tensor(positions)
        return cos[idx], sin[idx]

    def layer(self, i: int, get, positions, keys=None, directions=None) -> dict:
        """{point name: values [S, ...]} of layer `i`'s ops replayed at `positions`; `get(name)`
        the recording's values of L{i}.name there ([S, ...], or None), with `x_in` the lanes
        entering the layer. `keys`: the recorded keys and values of the attention's window,
        ([S, M, KV, hd] keys, values, [S, M] allowed) for `attn`, or None. `directions`: a
        dict, filled with each iterative op's change when it runs one iteration fewer
        ({"hres": [S, n, n]}), the direction systematic_sums.direction_sums tests."""
        from reference.ops import (apply_rope, hadamard_mlp, matmul, rms_unit, sinkhorn,
                                   zcrms)
        cfg, P, lp, dt = self.cfg, self.P, self.lps[i], self.dtype
        st = "stack/mhc_"
        n, C, H, KV, hd = cfg.mhc_lanes, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, \
            cfg.head_dim
        pre_off, post_off = self.offsets[i]
        v = {}

        def rec(name):
            t = get(name)
            return None if t is None else t.to(dt)

        def op(name, fn, *inputs):
            vals = [rec(x) for x in inputs]
            if all(t is not None for t in vals):
                v[name] = fn(*vals)
        S = len(positions)
        op("nx", lambda x: rms_unit(x.reshape(S, n * C)), "x_in")
        op("hpre", lambda nx: torch.sigmoid(P[st + "a_pre"][i] * matmul(nx, P[st + "phi_pre"][i])
                                            + P[st + "b_pre"][i] + pre_off), "nx")
        op("u", lambda hpre, x: torch.einsum("tn,tnc->tc", hpre, x), "hpre", "x_in")
        site = cfg.site_of_layer(i)
        if site is not None:
            op("alpha", lambda u, ek: torch.sigmoid(torch.einsum(
                "td,td->t", rms_unit(u), rms_unit(ek)) / math.sqrt(C)), "u", "engram_k")
            op("bx", lambda u, a, ev: u + a[..., None] * ev, "u", "alpha", "engram_v")
        else:
            op("bx", lambda u: u, "u")
        op("h_in", lambda bx: zcrms(bx, lp["pre"]), "bx")
        cos, sin = self.rope(positions)

        def qk(h, w, norm, heads):                 # [S, heads, hd], RoPE at each position
            z = zcrms(matmul(h, w).reshape(S, heads, hd), norm)
            return apply_rope(z.transpose(0, 1), cos, sin).transpose(0, 1)
        op("q", lambda h: qk(h, lp["q"], lp["qn"], H), "h_in")
        op("k", lambda h: qk(h, lp["k"], lp["kn"], KV), "h_in")
        op("v", lambda h: matmul(h, lp["v"]).reshape(S, KV, hd), "h_in")
        if keys is not None:
            op("attn", lambda q: self._attention(q, *keys), "q")
        op("gate", lambda h: torch.sigmoid(matmul(h, lp["gate"])), "h_in")
        op("attn_out", lambda o, g: matmul(o * g, lp["o"]), "attn", "gate")
        op("attn_post", lambda a: zcrms(a, lp["post"]), "attn_out")
        sig = torch.sigmoid(lp["attn_gate"])
        op("mlp_in", lambda bx, a: zcrms(bx + sig * a, lp["pre_hada"]), "bx", "attn_post")
        op("mlp_out", lambda m: hadamard_mlp(m, lp["d1"], lp["d2"], lp["d3"], C), "mlp_in")
        op("block_out", lambda bx, a, m: (bx + sig * a) + m, "bx", "attn_post", "mlp_out")
        op("y", lambda out, u: out - u, "block_out", "u")
        op("hpost", lambda nx: 2 * torch.sigmoid(
            P[st + "a_post"][i] * matmul(nx, P[st + "phi_post"][i]) + P[st + "b_post"][i]
            + post_off), "nx")
        op("res_logits", lambda nx: P[st + "a_res"][i] * matmul(
            nx, P[st + "phi_res"][i]).reshape(S, n, n) + P[st + "b_res"][i], "nx")
        if directions is None:
            op("hres", sinkhorn, "res_logits")
        else:
            op("hres", _sinkhorn_pair, "res_logits")
        if directions is not None and "hres" in v:
            v["hres"], short = v["hres"]
            g = short - v["hres"]
            # where the plan has converged, g is the replay's own rounding, which any other
            # float32 order shares in part: only a change well past it is a direction
            resolved = g.abs() > RESOLVED * torch.finfo(dt).eps * v["hres"].abs()
            directions["hres"] = torch.where(resolved, g, torch.zeros_like(g))
        op("x", lambda hres, x, hpost, y: torch.einsum("tij,tjc->tic", hres, x)
           + hpost[..., None] * y[:, None, :], "hres", "x_in", "hpost", "y")
        return v

    def _attention(self, q, K, V, allowed):
        """q [S, H, hd]; K, V [S, M, KV, hd] (each query's window, in the cache's format);
        allowed [S, M]. The reference's scores, mask, softmax and weighted sum."""
        cfg = self.cfg
        S, H, hd = q.shape
        KV, rep = cfg.num_kv_heads, cfg.rep
        qg = q.reshape(S, KV, rep, hd)
        scores = torch.einsum("sgrd,smgd->sgrm", qg, K) / math.sqrt(hd)
        scores = torch.where(allowed[:, None, None, :], scores, torch.finfo(scores.dtype).min)
        w = torch.softmax(scores, dim=-1)
        o = torch.einsum("sgrm,smgd->sgrd", w, V)
        return o.reshape(S, H * hd)

    def tail(self, get) -> dict:
        """The whole-forward ops after the last layer, from its recorded lanes."""
        from reference.ops import matmul, zcrms
        v = {}
        x = get(point_name("x", self.cfg.num_layers - 1))
        if x is not None:
            v["lane_mean"] = torch.mean(x.to(self.dtype), dim=-2)
        m = get("lane_mean")
        if m is not None:
            v["final_norm"] = zcrms(m.to(self.dtype), self.P["stack/final_norm/scale"])
        f = get("final_norm")
        if f is not None:
            v["logits"] = matmul(f.to(self.dtype), self.P["embedding/embedding"].T)
        return v

    def stored(self, kv):
        kv = kv.to(self.dtype)
        return kv if self.kv_store is None else self.kv_store(kv)
