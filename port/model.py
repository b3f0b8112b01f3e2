"""V2Model: the port's one-token decode over a ring KV cache (after the seed's V2Model).

Weights are prepared once at load (fused per-layer projections, row-major [out, in] so every
product is a matrix-vector call) and never change. Per-sequence state lives in V2State. The
math is the port's own (docs/design.md, "Layout": port/ takes only config, params and cact
from reference/).

`step` follows upstream decode.py: Engram gated on `u`, `y = block(bx) - u`, Sinkhorn in the
log domain for 20 iterations, the lanes updated from their values before the layer.
"""
from __future__ import annotations

import math

import torch

from reference import cact
from reference.config import V2Config
from .cq import CqWeight, fwht
from .state import StateError, V2State
from .weights import prepare_weights

WEIGHT_FORMS = ("dense", "cq")
BACKENDS = ("torch", "triton", "native")
DECODES = ("eager", "graph")

EPS = 1e-6
SEED, PRIME, M32 = 0x9E3779B9, 0x01000193, 0xFFFFFFFF


class StepError(ValueError):
    """A step the model refuses (names the value and the limit); the state is untouched."""


def _lanewise(fn, x):
    """fn applied through torch's SIMD body only. Its vector and scalar-tail code paths for
    sigmoid/silu round differently, and which one an element takes depends on how many
    elements share the call; padding to a multiple of 64 sends every element down the vector
    path, so a value's bits do not depend on the rows batched with it."""
    flat = x.reshape(-1)
    n = flat.numel()
    buf = torch.zeros(-(-n // 64) * 64, dtype=x.dtype, device=x.device)
    buf[:n] = flat
    return fn(buf)[:n].view(x.shape)


def sigmoid(x):
    return _lanewise(torch.sigmoid, x)


def silu(x):
    return _lanewise(torch.nn.functional.silu, x)


def zc(x, g):
    return (1.0 + g) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)


def unit_rms(x):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)


def log_sinkhorn(z, iters: int = 20):
    for _ in range(iters):
        z = z - torch.logsumexp(z, -1, keepdim=True)
        z = z - torch.logsumexp(z, -2, keepdim=True)
    return z.exp()


def ngram_rows(cfg: V2Config, tokens: list, pos: int) -> list:
    """Row of every Engram table for position `pos` (uint32 hash, spec §b.8), in Python ints."""
    rows = []
    for oi, order in enumerate(cfg.engram_orders):
        for h in range(cfg.engram_heads_eff):
            acc = (SEED * (oi * cfg.engram_heads_eff + h + 1)) & M32
            for j in range(order):
                tok = tokens[pos - j] if pos - j >= 0 else 0
                acc = ((acc ^ tok) * PRIME) & M32
            rows.append((acc ^ (acc >> 15)) % cfg.engram_slots)
    return rows


def rowvecs(x, wt):
    """x [m, k] @ wt [k, n] as m independent M=1 products (bmm over an expanded weight).

    A plain [m, k] @ [k, n] picks BLAS kernels by m, so a row's bits would depend on how
    many rows travel with it; one product per row keeps step and prefill bit-identical."""
    return torch.bmm(x[:, None, :], wt.expand(x.shape[0], *wt.shape))[:, 0]


class V2Model:
    # Which Engram gate this port implements. Upstream has two: architecture.py (training)
    # gates the Engram value on the lane-stacked x, decode.py gates it on u, the lane-mixed
    # vector the block consumes. The port follows decode.py, the incremental path the
    # fixtures come from; a change toward architecture.py is a bug, not a fix.
    ENGRAM_GATE_SOURCE = "decode.py (_forward_cached), gate on u"

    def __init__(self, cfg: V2Config, w: dict, device, backend: str = "torch",
                 decode: str = "eager", packed: dict | None = None):
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
        if decode not in DECODES:
            raise ValueError(f"decode={decode!r} is not one of {DECODES}")
        self.cfg, self.w, self.device = cfg, w, torch.device(device)
        self.backend = backend          # torch ops, Triton attention, or the C step (CPU)
        self.decode = decode            # graph: prep + a capturable body (port/graph.py)
        if backend == "native":
            if self.device.type != "cpu" or decode != "eager":
                raise ValueError(f"backend='native' runs eagerly on the CPU (device="
                                 f"{self.device}, decode={decode!r})")
            from .native import NativeModel
            self._native = NativeModel(cfg, w, packed)

    # ---- construction ----
    @classmethod
    def from_params(cls, params: dict, cfg: V2Config, weights: str = "dense", device="cpu",
                    bits_map: str = "embedding=4,mhc=4,default=2", backend: str = "torch",
                    decode: str = "eager"):
        """weights="dense": float32 as given; "cq": quantised as the .cact writer does
        (`bits_map`), then computed from the codes (see from_cact)."""
        if weights not in WEIGHT_FORMS:
            raise ValueError(f"weights={weights!r} is not one of {WEIGHT_FORMS}")
        if weights == "cq":
            return cls.from_cactfile(cact.build_cact(params, cfg, bits_map), "cq", device,
                                     backend, decode)
        return cls._build(params, cfg, None, device, backend, decode)

    @classmethod
    def from_cact(cls, path, weights: str = "cq", device="cpu", backend: str = "torch",
                  decode: str = "eager"):
        """Load a .cact file. "cq": every matrix stays in its codes (CqWeight, pre-rotation rows
        at load; activations rotated per 128-group); "dense": the dequantised float32 matrices."""
        return cls.from_cactfile(cact.read_cact(path), weights, device, backend, decode)

    @classmethod
    def from_cactfile(cls, f, weights: str = "cq", device="cpu", backend: str = "torch",
                      decode: str = "eager"):
        if weights not in WEIGHT_FORMS:
            raise ValueError(f"weights={weights!r} is not one of {WEIGHT_FORMS}")
        cqw = None
        if weights == "cq":
            form = "packed" if backend == "native" else "dense"
            cqw = {s.name: CqWeight.from_slot(s, form) for s in f.slots
                   if s.dtype == cact.DTYPE_CQ}
        if weights == "cq" and backend == "native":    # the C step reads the codes as stored
            model = cls(f.config, prepare_weights(f.params, f.config, None, device), device,
                        backend, decode, packed=cqw)
            model.tokenizer = f.tokenizer
            return model
        model = cls._build(f.params, f.config, cqw, device, backend, decode)
        model.tokenizer = f.tokenizer
        return model

    @classmethod
    def _build(cls, params: dict, cfg: V2Config, cqw, device, backend="torch", decode="eager"):
        return cls(cfg, prepare_weights(params, cfg, cqw, device), device, backend, decode)

    # ---- state ----
    def make_state(self) -> V2State:
        win = self.cfg.kv_window
        if win == 0:
            return self.make_state_full_causal()
        return V2State(self.cfg, ring=win, window=win, device=self.device)

    def make_state_full_causal(self) -> V2State:
        return V2State(self.cfg, ring=self.cfg.max_seq_len, window=0, device=self.device)

    # ---- public steps ----
    def step(self, token: int, state: V2State, logits=None):
        if self.decode == "graph" and state.window and not state.pad_aware:
            if logits is not None:
                self._check(token, state, logits)
            out = state.decode_graph(self).step(token)
            return out if logits is None else logits.copy_(out)
        return self._step(token, state, logits, None, True)

    def step_prefill(self, token: int, state: V2State) -> None:
        self._step(token, state, None, None, False)

    def step_traced(self, token: int, state: V2State, logits, trace):
        return self._step(token, state, logits, trace, True)

    @staticmethod
    def last_hidden(state: V2State):
        return state.hidden

    # ---- the step ----
    def _check(self, token, state, logits):
        cfg = self.cfg
        if isinstance(token, torch.Tensor):
            if token.device != self.device:
                raise StepError(f"token is on {token.device}; the model is on {self.device}")
            token = int(token)
        if not isinstance(token, int) or not 0 <= token < cfg.vocab_size:
            raise StepError(f"token id {token} outside 0..vocab_size-1={cfg.vocab_size - 1}")
        if state.cfg != cfg:
            raise StepError("state belongs to a model of another geometry")
        if state.pos >= cfg.max_seq_len:
            raise StepError(f"position {state.pos} is past max_seq_len={cfg.max_seq_len}")
        if logits is not None:
            if logits.shape != (cfg.vocab_size,) or logits.dtype != torch.float32:
                raise StepError(f"logits buffer {logits.dtype} {list(logits.shape)}; needs "
                                f"float32 [{cfg.vocab_size}]")
            if logits.device != self.device:
                raise StepError(f"logits buffer on {logits.device}; model on {self.device}")
            if self.backend == "native" and not logits.is_contiguous():
                raise StepError(f"logits buffer with strides {logits.stride()}: the native "
                                f"step writes a contiguous [{cfg.vocab_size}] buffer")
        return token

    def _engram(self, state, pos0, m, trace):
        """Keys and convolved values of every site for positions pos0..pos0+m-1: [m, d] each.

        Row by row for the value ring: a row's taps read the rows before it, so a later row
        of the chunk must not overwrite a slot an earlier one still reads."""
        cfg, out = self.cfg, []
        if not cfg.num_sites:
            return out
        S, orders = cfg.engram_slots, [o for o in cfg.engram_orders
                                       for _ in range(cfg.engram_heads_eff)]
        flat = torch.tensor([[t * S + r for t, r in enumerate(ngram_rows(cfg, state.tokens, p))]
                             for p in range(pos0, pos0 + m)], device=self.device)
        valid = state.valid                 # only the oldest n-gram token / tapped row counts
        ok = torch.tensor([[1.0 if p - (o - 1) >= 0 and valid[p - (o - 1)] else 0.0
                            for o in orders] for p in range(pos0, pos0 + m)], device=self.device)
        dil, R, d = cfg.engram_dilation, state.engram_ring, cfg.d_model
        for s, site in enumerate(self.w["sites"]):
            e = (site["tables"][flat] * ok[..., None]).reshape(m, -1)
            kv = self._mm(e, site["kv"])
            k, vraw = kv[:, :d], kv[:, d:]
            v = torch.empty_like(vraw)
            for r in range(m):
                p = pos0 + r
                state.vraw[s, p % R] = vraw[r]
                acc = torch.zeros_like(vraw[r])
                for j in range(cfg.engram_taps):
                    if p - j * dil >= 0 and valid[p - j * dil]:
                        acc = acc + site["taps"][j] * state.vraw[s, (p - j * dil) % R]
                v[r] = acc
            if trace:
                trace(f"engram_k{s}", None, k[0])
                trace(f"engram_v{s}", None, v[0])
            out.append((k, v))
        return out

    def _attention(self, i, h, cos, sin, state, pos0, attend=None):
        """The attention sublayer on normed rows h [m, d]: fused q|k|v|gate product, q/k norms
        and RoPE, attention per position (or `attend(i, q, k, v)` for one row), the gate and
        the output product. Returns (q, k, v, o, gate, out) for the trace."""
        cfg, w, m = self.cfg, self.w, h.shape[0]
        H, KV, hd, attn, kvd = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attn_dim_eff,
                                cfg.kv_dim)
        qkvg = self._mm(h, w["qkvg_t"][i])
        q = self._rope(zc(qkvg[:, :attn].reshape(m, H, hd), w["qn"][i]), cos, sin)
        k = self._rope(zc(qkvg[:, attn:attn + kvd].reshape(m, KV, hd), w["kn"][i]), cos, sin)
        v = qkvg[:, attn + kvd:attn + 2 * kvd].reshape(m, KV, hd)
        gate = sigmoid(qkvg[:, attn + 2 * kvd:])
        if attend is not None:
            o = torch.stack([attend(i, q[0], k[0], v[0])])
        else:
            o = torch.stack([self._attend(i, q[r_], k[r_], v[r_], state, pos0 + r_)
                             for r_ in range(m)])
        return q, k, v, o, gate, self._mm(o * gate, w["out_t"][i])

    def _attend(self, i, q, k, v, state, pos):
        """One position's attention through the state's AttnV41-style runtime (port/attn.py):
        write its K/V into the ring, then attend over the window selection."""
        return state.attn_runtime(self).forward(i, q[None], k[None], v[None], pos)[0]

    def _step(self, token, state: V2State, logits, trace, want_logits):
        token = self._check(token, state, logits)
        return self._rows([token], state, logits, trace, want_logits)

    def _rows(self, tokens: list, state: V2State, logits, trace, want_logits, pool=None):
        """Run m = len(tokens) positions. Every op is either elementwise, a reduction over a
        row, a per-row matrix product (bmm, one M=1 product per row) or the per-position
        attention, so row r's bits do not depend on m: a batched prefill leaves exactly the
        state of m single steps."""
        cfg, w = self.cfg, self.w
        n, d, H, KV, hd = cfg.mhc_lanes, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        attn, kvd, m = cfg.attn_dim_eff, cfg.kv_dim, len(tokens)
        pos0 = state.pos
        pad = cfg.pad_token_id
        keep = [not (state.pad_aware and t == pad) for t in tokens]
        state.tokens.extend(tokens)         # inputs were checked: nothing below can fail
        state.valid.extend(keep)
        if self.backend == "native":
            from .native import run_rows
            return run_rows(self, self._native, tokens, state, pos0, logits, trace,
                            want_logits, pool)
        x0 = w["emb"][torch.tensor(tokens, device=self.device)] * math.sqrt(d)   # [m, d]
        if trace:
            trace("embed", None, x0[0])
        eng = self._engram(state, pos0, m, trace)
        X = x0[:, None, :].expand(m, n, d)
        keep_t = torch.tensor(keep, device=self.device) if pool is not None else None
        if pool is not None:
            pool.add(x0, keep_t)
        cos = w["cos"][pos0:pos0 + m, None, :]
        sin = w["sin"][pos0:pos0 + m, None, :]
        for i in range(cfg.num_layers):
            X = self._layer(i, X, eng, state, pos0, cos, sin, trace)
            if pool is not None:
                pool.add(X.mean(1), keep_t)
        return self._finish(X, state, logits, trace, want_logits)

    def _finish(self, X, state, logits, trace, want_logits):
        """Last row's lanes -> state.lanes, the final norm -> state.hidden, the LM head."""
        w = self.w
        state.lanes.copy_(X[-1])
        mean = X[-1].mean(0)
        torch.mul(1.0 + w["final"], mean / torch.sqrt((mean * mean).mean() + EPS),
                  out=state.hidden)
        if trace:
            trace("lane_mean", None, mean)
            trace("final_norm", None, state.hidden)
        if not want_logits:
            return None
        out = state.logits if logits is None else logits
        if w["rotate"]:
            out.copy_(self._mm(state.hidden[None], w["head_t"])[0])
        else:
            torch.mv(w["emb"], state.hidden, out=out)
        if trace:
            trace("logits", None, out)
        return out

    def _layer(self, i, X, eng, state, pos0, cos, sin, trace=None, attention=None):
        """Layer i on lanes X [m, n, d] at positions pos0..pos0+m-1; returns the new lanes.

        Writes the layer's K/V rows into the state's ring. `eng` holds every site's (k, v).
        `attention(i, h, cos, sin)` replaces the attention sublayer (the runtime's
        decode_body, which reads the position from device buffers; m = 1 there)."""
        cfg, w = self.cfg, self.w
        n, d, H, KV, hd = cfg.mhc_lanes, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        attn, kvd, m = cfg.attn_dim_eff, cfg.kv_dim, X.shape[0]
        nx = unit_rms(X.reshape(m, n * d))
        r = self._mm(nx, w["router_t"][i])
        hpre = sigmoid(w["a_pre"][i] * r[:, :n] + w["pre_bias"][i])
        u = torch.bmm(hpre[:, None, :], X)[:, 0]
        bx, alpha = u, None
        site = cfg.site_of_layer(i)
        if site is not None:
            ek, ev = eng[site]
            alpha = sigmoid((unit_rms(u) * unit_rms(ek)).sum(-1, keepdim=True)
                                  / math.sqrt(d))
            bx = u + alpha * ev
        h = zc(bx, w["pre"][i])
        if attention is not None:           # the graph body's: positions from device buffers
            q, k, v, o, gate, a = attention(i, h, cos, sin)
        else:
            q, k, v, o, gate, a = self._attention(i, h, cos, sin, state, pos0)
        ap = zc(a, w["post"][i])
        z = bx + w["attn_gate"][i] * ap
        mi = zc(z, w["pre_hada"][i])
        mo = self._hadamard(mi, i)
        y = z + mo - u
        hpost = 2 * sigmoid(w["a_post"][i] * r[:, n:2 * n] + w["post_bias"][i])
        res = w["a_res"][i] * r[:, 2 * n:].reshape(m, n, n) + w["b_res"][i]
        P = log_sinkhorn(res)
        if trace:
            for name, val in (("nx", nx), ("hpre", hpre), ("u", u), ("alpha", alpha),
                              ("bx", bx), ("h_in", h), ("q", q), ("k", k), ("v", v),
                              ("attn", o), ("gate", gate), ("attn_out", a),
                              ("attn_post", ap), ("mlp_in", mi), ("mlp_out", mo),
                              ("block_out", z + mo), ("y", y), ("hpost", hpost),
                              ("res_logits", res), ("hres", P)):
                if val is not None:
                    trace(name, i, val[0] if name != "alpha" else val[0, 0])
        X = torch.bmm(P, X) + hpost[:, :, None] * y[:, None, :]
        if trace:
            trace("x", i, X[0])
        return X

    def _mm(self, x, wt):
        """x [m, in] times a prepared weight view wt [in or in_pad, out], row by row."""
        if self.w["rotate"]:
            x = fwht(torch.nn.functional.pad(x, (0, wt.shape[0] - x.shape[-1])))
        return rowvecs(x, wt)

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    def _hadamard(self, h, i):
        w, cfg = self.w, self.cfg
        z = torch.nn.functional.pad(h, (0, cfg.hada_n - cfg.d_model))
        z = rowvecs(w["d1"][i] * z, w["walsh"])
        z = rowvecs(silu(w["d2"][i] * z), w["walsh"])
        return (w["d3"][i] * z)[:, :cfg.d_model]

    def encode_contrastive(self, tokens, *, window: int = 0):
        """Probe head over tokens [T] or a batch [B, T] (port/heads.py); window 0: full causal."""
        from .heads import encode_contrastive
        return encode_contrastive(self, tokens, window=window)

    def confidence(self, tokens, *, window: int = 0):
        """Confidence logit over tokens [T] or a batch [B, T] (port/heads.py)."""
        from .heads import confidence
        return confidence(self, tokens, window=window)

    def step_layer(self, i: int, lanes, state: V2State, pos: int, engram=None, trace=None):
        """Injection: run only layer `i` at position `pos` (already stepped into `state`) on the
        given lanes [n, d], with `engram` = [(k [d], v [d]) per site] (default: recomputed
        from the state's tokens). Runs the implementation under test: the C layer for
        backend="native" (port/native.py run_layer), the graph body's layer (attention from
        the runtime's static buffers, `decode_body`) where decode="graph" steps run it, else
        this class's `_layer` (whose attention goes through the backend's kernel). Overwrites
        that layer's K/V at `pos`: pass `state.clone()`. Returns the lanes after the layer."""
        if not 0 <= i < self.cfg.num_layers or not 0 <= pos < state.pos:
            raise StepError(f"layer {i} / position {pos} outside 0..{self.cfg.num_layers - 1}"
                            f" / 0..{state.pos - 1}")
        if self.backend == "native":
            from .native import run_layer
            return run_layer(self, self._native, i, lanes, state, pos, engram, trace)
        if engram is None:
            engram = self._engram(state.clone(), pos, 1, None)
        eng = [(k.reshape(1, -1), v.reshape(1, -1)) for k, v in engram]
        X = lanes.reshape(1, self.cfg.mhc_lanes, self.cfg.d_model).to(state.k)
        if self.decode == "graph" and pos and state.window and not state.pad_aware:
            rt = state.attn_runtime(self)         # as DecodeGraph.body runs a layer
            rt.invalidate_decode_uploads()
            rt.decode_prep(i, pos)
            cos = self.w["cos"].index_select(0, rt.pos)[:, None, :]
            sin = self.w["sin"].index_select(0, rt.pos)[:, None, :]
            return self._layer(i, X, eng, state, 0, cos, sin, trace,
                               attention=rt.decode_body)[0]
        cos, sin = self.w["cos"][pos:pos + 1, None, :], self.w["sin"][pos:pos + 1, None, :]
        return self._layer(i, X, eng, state, pos, cos, sin, trace)[0]

    def prefill_batch(self, tokens, state: V2State, batch, logits=None):
        from .batch import prefill_batch
        return prefill_batch(self, tokens, state, batch, logits)
