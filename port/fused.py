"""The triton backend's decode body: one token in fused Triton kernels, about seven launches
per layer (issue 12). The torch backend's `V2Model.layer` stays the readable statement of the
same arithmetic; this is the fast one, in a different op order where fusion needs it.

Per token, reading per-token values only from the decode graph's static buffers (port/graph.py)
and the attention runtime's (port/attn.py), so one CUDA graph replays it at any position:

    x0 = embedding[token] * sqrt(d)                               2 aten ops
    per Engram site: gather, key|value product, ring write, taps   engram_prelude
    per layer:
      r            = unit_rms(lanes) @ router                      norm_gemv ("unit")
      hpre, u, hpost, P, (alpha, bx)  from r, the lanes, Engram     mhc_route (Sinkhorn inside)
      q|k|v|gate   = zc(bx, pre_norm) @ W_qkvg                     norm_gemv ("zc")
      norms, RoPE, gate, ring write                                qk_rope_ring
      o            = attention over the -1-padded window           sparse_attn
      a            = (o * gate) @ W_out                            norm_gemv ("mul")
      lanes', y    = post norm, residual, Hadamard MLP, mHC merge   layer_tail
    lane mean, final norm -> state.hidden                          final_norm
    logits       = hidden @ head                                   norm_gemv ("none")

Each product is dense float32, rotated pre-rotation rows, or the packed codes themselves
(port/fused_weights.py; cq models stream the codes). The same body runs on the Triton kernels
or, `kernels="twin"`, on their torch twins (same contracts, plain torch: the fast way to check
the composition on a CPU).

A fused kernel hides what it keeps in registers. `HIDDEN` names those ladder points; every other
point of the registry (ladder/model/points.py) is traced at the kernel boundary that produces it.

At a 16-bit precision (`precision=` bfloat16 or float16, port/precision.py) the body runs in
that dtype: every tensor between kernels, the KV ring, the Engram value ring and the lanes are
16-bit; each kernel computes in float32 and rounds once per store (kernels/narrow.py). Dense
weights stored 16-bit are handed to the products as 16-bit tensors (half the bytes streamed);
the logits and the final hidden row stay float32 buffers holding the rounded values. Traced
values are widened to float32 (exactly) for the ladder.
"""
from __future__ import annotations

import functools
import math
import os
from types import SimpleNamespace

import torch

from kernels import (engram_prelude, final_norm, layer_tail, mhc_route, norm_gemv,
                     qk_rope_ring, sparse_attn)
from .fused_weights import FusedWeights
from .precision import DTYPES

# Registry points the fused body cannot show, and the kernel that keeps each in registers.
HIDDEN = {
    "nx": "the mHC router product's input norm (norm_gemv)",
    "h_in": "the q|k|v|gate product's input norm (norm_gemv)",
    "attn_post": "layer_tail",
    "mlp_in": "layer_tail",
    "mlp_out": "layer_tail",
    "block_out": "layer_tail",
    "res_logits": "mhc_route, before its Sinkhorn",
}
# The per-layer points it does trace, in the registry's order.
LAYER_TRACED = ("hpre", "u", "alpha", "bx", "q", "k", "v", "attn", "gate", "attn_out", "y",
                "hpost", "hres", "x")


_MODULES = {
    "norm_gemv": (norm_gemv, "norm_gemv"), "norm_cq_gemv": (norm_gemv, "norm_cq_gemv"),
    "mhc_route": (mhc_route, "mhc_route"), "qk_rope_ring": (qk_rope_ring, "qk_rope_ring"),
    "sparse_attn": (sparse_attn, "sparse_attn"), "layer_tail": (layer_tail, "layer_tail"),
    "engram_prelude": (engram_prelude, "engram_prelude"), "final_norm": (final_norm, "final_norm"),
}
# The two kernel sets, shared by every FusedBody (ladder/sides/faults.py patches entries here).
KERNELS = {name: SimpleNamespace(**{k: getattr(mod, f"{base}_{suffix}")
                                    for k, (mod, base) in _MODULES.items()})
           for name, suffix in (("triton", "triton"), ("twin", "torch"))}
if os.environ.get("TRITON_INTERPRET") == "1":
    # The interpreter runs a grid's programs one after another at ~8 ms each: wide output
    # blocks make the products several times faster on a CPU. Each output's reduction order
    # does not depend on the block width, so neither do its bits (tests/port/test_fused.py).
    _t = KERNELS["triton"]
    _t.norm_gemv = functools.partial(_t.norm_gemv, block_n=256)
    _t.norm_cq_gemv = functools.partial(_t.norm_cq_gemv, block_rows=64)


class FusedBody:
    """The fused decode body of one model (weights laid out once, `FusedWeights.of`)."""

    def __init__(self, model, kernels: str = "triton"):
        if kernels not in KERNELS:
            raise ValueError(f"kernels={kernels!r} is not one of {tuple(KERNELS)}")
        self.model, self.kernels = model, kernels
        prec = model.precision
        self.act = DTYPES[prec.activations]          # what the body's tensors are held in
        self.w = FusedWeights.of(model, DTYPES.get(prec.weights))

    @property
    def k(self) -> SimpleNamespace:
        return KERNELS[self.kernels]

    # ---- products ----
    def product(self, x, gain, kind: str, prod, out=None):
        """norm(x) @ W for one Product: one launch per code block (one for dense); y rounded
        to the body's activation dtype."""
        k, act = self.k, self.act
        if not prod.blocks:
            return k.norm_gemv(x, gain, prod.w, kind, rotate=prod.rotate, out=out, act=act)
        if len(prod.blocks) == 1:
            return k.norm_cq_gemv(x, gain, kind, *prod.blocks[0].operands(), out=out, act=act)
        y = out if out is not None else torch.empty(prod.out_features, device=x.device,
                                                    dtype=act)
        for b in prod.blocks:
            k.norm_cq_gemv(x, gain, kind, *b.operands(), out=y[b.row0:b.row0 + b.out],
                           act=act)
        return y

    def widened(self, trace):
        """`trace` handed float32 values (16-bit ones widened exactly); itself at float32."""
        if trace is None or self.act == torch.float32:
            return trace

        def wide_trace(name, layer, value):
            trace(name, layer, value.float() if value.dtype != torch.float32 else value)
        return wide_trace

    # ---- the body ----
    def __call__(self, g, state, trace=None):
        """One decode token from the graph's static buffers `g` (DecodeGraph, prepped);
        returns state.logits. `trace(name, layer, value)` sees every point a kernel
        boundary exposes."""
        model, cfg, k = self.model, self.model.cfg, self.k
        n, d = cfg.mhc_lanes, cfg.d_model
        trace = self.widened(trace)
        x0 = model.embedding.table.index_select(0, g.token)[0] * math.sqrt(d)      # [d]
        if self.act != torch.float32:
            x0 = x0.to(self.act)
        if trace:
            trace("embed", None, x0)
        eng = []
        for s, site in enumerate(model.engrams):
            prod = self.w.engram_kv[s]
            cq = prod.blocks[0].operands() if prod.blocks else None
            kv = k.engram_prelude(site.tables, g.rows, g.ngram_ok, prod.w, state.vraw[s],
                                  g.eslot, site.taps, g.tap_slots, g.tap_ok,
                                  rotate=prod.rotate, cq=cq, act=self.act)
            eng.append((kv[:d], kv[d:]))
            if trace:
                trace(f"engram_k{s}", None, kv[:d])
                trace(f"engram_v{s}", None, kv[d:])
        X = x0[None].expand(n, d)
        rt = state.attn_runtime(model)
        for i in range(cfg.num_layers):
            last = i == cfg.num_layers - 1
            X = self.layer(i, X, eng, state, rt, trace=trace, out=state.lanes if last else None)
        mean = k.final_norm(state.lanes, model.final_norm, state.hidden)
        if trace:
            trace("lane_mean", None, mean)
            trace("final_norm", None, state.hidden)
        self.product(state.hidden, None, "none", self.w.head, out=state.logits)
        if trace:
            trace("logits", None, state.logits)
        return state.logits

    def layer(self, i: int, X, eng, state, rt, *, trace=None, out=None):
        """Layer i on the lanes X [n, d] for the token at rt.pos: returns the new lanes."""
        model, cfg, k = self.model, self.model.cfg, self.k
        lw, mhc, w = model.layers[i], model.mhc, self.w
        site = cfg.site_of_layer(i)
        ek, ev = eng[site] if site is not None else (None, None)
        r = self.product(X, None, "unit", w.router[i])
        hpre, u, hpost, P, alpha, bx = k.mhc_route(
            r, X, mhc.a_pre[i], mhc.pre_bias[i], mhc.a_post[i], mhc.post_bias[i],
            mhc.a_res[i], mhc.b_res[i], ek=ek, ev=ev)
        qkvg = self.product(bx, lw.pre_norm, "zc", w.qkvg[i])
        q, kk, v, gate = k.qk_rope_ring(qkvg, lw.q_norm, lw.k_norm, model.cos, model.sin,
                                        rt.pos, rt.slot, state.k[i], state.v[i],
                                        cfg.num_heads, cfg.num_kv_heads)
        o = k.sparse_attn(q[None], state.k[i].transpose(0, 1), state.v[i].transpose(0, 1),
                          rt.idx_tile[None], rt.scale).reshape(-1)
        a = self.product(o, gate, "mul", w.out[i])
        Xn, y = k.layer_tail(a, bx, u, X, P, hpost, lw.post_norm, lw.attn_gate,
                             lw.pre_hada_norm, lw.d1, lw.d2, lw.d3, out=out)
        if trace:
            vals = dict(hpre=hpre, u=u, alpha=alpha, bx=bx, q=q, k=kk, v=v, attn=o, gate=gate,
                        attn_out=a, y=y, hpost=hpost, hres=P, x=Xn)
            for name in LAYER_TRACED:
                if vals[name] is not None:
                    trace(name, i, vals[name])
        return Xn
