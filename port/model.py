"""V2Model: the port's one-token decode over a ring KV cache (after the seed's V2Model).

The weights are the model's typed parts (port/parts.py): `embedding`, `layers` (one V2Layer
each), `mhc`, `engrams` (one V2Engram per site) and `final_norm`, prepared once at load and
never changed. Per-sequence state lives in V2State. The math is the port's own
(docs/design.md, "Layout": port/ takes only config, params and cact from reference/).

`step` follows upstream decode.py: Engram gated on `u`, `y = block(bx) - u`, Sinkhorn in the
log domain for 20 iterations, the lanes updated from their values before the layer. The class
reads top to bottom in forward order: step -> rows -> engram -> layer -> attention -> mlp ->
finish. The methods other modules call (graph body, batch, heads, attention runtime, native
binding, ladder) are its public internal API, flags keyword-only.

Backends: chosen once when the model is built (`self.impl`, port/backend.py): "torch" runs
exactly this class's ops; "triton" runs decode steps as the fused Triton body of port/fused.py
(the same model, ~7 launches per layer; prefill stays here, with Triton attention); "native"
runs the C step (port/native.py). decode="graph" runs decode steps as prep + a capturable body
(port/graph.py), replayed from a CUDA graph on CUDA.
"""
from __future__ import annotations

import math

import torch

from reference import cact
from reference.config import V2Config
from . import load
from .backend import (BACKENDS, DECODES, backend_class, check_names,  # noqa: F401
                      check_precision, make_backend)
from .cq import CqWeight, fwht  # noqa: F401  (CqWeight: re-exported)
from .errors import StepError
from .host import M32, PRIME, SEED, host_row, ngram_rows  # noqa: F401
from .precision import PortPrecision, PrecisionError
from .ops import EPS, log_sinkhorn, rowvecs, sigmoid, silu, unit_rms, zc  # noqa: F401
from .parts import (Embedding, PartError, V2Mhc, attach_codes, check_parts,  # noqa: F401
                    model_tensors, pack_parts, parts_from_weights)
from .state import StateError, V2State  # noqa: F401
from .weights import prepare_weights, rope_tables, walsh  # noqa: F401

WEIGHT_FORMS = load.WEIGHT_FORMS


def row0(trace, v):
    """What a trace is handed of a traced value's rows [m, ...]: the first row (one-position
    steps), or every row when the trace says `batched` (a traced prefill_batch chunk)."""
    return v if getattr(trace, "batched", False) else v[0]


class V2Model:
    # Which Engram gate this port implements. Upstream has two: architecture.py (training)
    # gates the Engram value on the lane-stacked x, decode.py gates it on u, the lane-mixed
    # vector the block consumes. The port follows decode.py, the incremental path the
    # fixtures come from; a change toward architecture.py is a bug, not a fix.
    ENGRAM_GATE_SOURCE = "decode.py (_forward_cached), gate on u"

    def __init__(self, cfg: V2Config, embedding: Embedding, layers: list, mhc: V2Mhc,
                 engrams: list, final_norm, *, heads: dict | None = None, device=None,
                 backend: str = "torch", decode: str = "eager", precision=None):
        check_names(backend, decode)
        # What every stored tensor is rounded to (port/precision.py); float32: nothing is.
        self.precision = PortPrecision.of(precision)
        check_precision(self.precision, backend, decode)
        self.rnd, self.kv_store = self.precision.store, self.precision.kv_store
        self.form = check_parts(cfg, embedding, layers, mhc, engrams, final_norm)
        self.cfg = cfg
        self.embedding, self.layers, self.mhc = embedding, list(layers), mhc
        self.engrams, self.final_norm = list(engrams), final_norm
        self.heads = dict(heads or {})          # probe-head parameters (port/heads.py)
        self.device = torch.device(final_norm.device if device is None else device)
        self.rotate = self.form == "rotated"    # every product rotates its input first
        self.walsh = walsh(cfg.hada_n).to(self.device)
        self.cos, self.sin = rope_tables(cfg, self.device)
        self.backend = backend          # torch ops, Triton attention, or the C step (CPU)
        self.decode = decode            # graph: prep + a capturable body (port/graph.py)
        self.impl = make_backend(self, backend, decode)     # the one place the choice is made

    # ---- construction ----
    @classmethod
    def new(cls, cfg: V2Config, embedding: Embedding, layers: list, mhc: V2Mhc, engrams: list,
            final_norm, **runtime) -> "V2Model":
        """The model over its parts, every shape checked (PartError names the wrong part).
        `runtime`: heads, device, backend, decode (keyword-only)."""
        return cls(cfg, embedding, layers, mhc, engrams, final_norm, **runtime)

    @property
    def parts(self) -> tuple:
        """(embedding, layers, mhc, engrams, final_norm): V2Model.new's arguments."""
        return self.embedding, self.layers, self.mhc, self.engrams, self.final_norm

    def tensors(self):
        """(path, tensor) of every tensor the model holds: parts, heads, RoPE and Walsh."""
        yield from model_tensors(self)

    @classmethod
    def from_params(cls, params: dict, cfg: V2Config, weights: str = "dense", device="cpu",
                    bits_map: str = "embedding=4,mhc=4,default=2", backend: str = "torch",
                    decode: str = "eager", precision=None):
        """weights="dense": float32 as given; "cq": quantised as the .cact writer does
        (`bits_map`), then computed from the codes (see from_cact). port/load.py.
        `precision`: port/precision.py (None: float32 throughout)."""
        return load.from_params(cls, params, cfg, weights, device, bits_map, backend, decode,
                                precision)

    @classmethod
    def from_cact(cls, path, weights: str = "cq", device="cpu", backend: str = "torch",
                  decode: str = "eager"):
        """Load a .cact file. "cq": every matrix stays in its codes (CqWeight, pre-rotation rows
        at load; activations rotated per 128-group); "dense": the dequantised float32 matrices."""
        return cls.from_cactfile(cact.read_cact(path), weights, device, backend, decode)

    @classmethod
    def from_cactfile(cls, f, weights: str = "cq", device="cpu", backend: str = "torch",
                      decode: str = "eager", precision=None):
        return load.from_cactfile(cls, f, weights, device, backend, decode, precision)

    @classmethod
    def _build(cls, params: dict, cfg: V2Config, cqw, device, backend="torch", decode="eager",
               precision=None):
        return load.build(cls, params, cfg, cqw, device, backend, decode, precision)

    # ---- state ----
    def make_state(self) -> V2State:
        win = self.cfg.kv_window
        if win == 0:
            return self.make_state_full_causal()
        return V2State(self.cfg, ring=win, window=win, device=self.device,
                       act_dtype=self.impl.state_dtype)

    def make_state_full_causal(self) -> V2State:
        return V2State(self.cfg, ring=self.cfg.max_seq_len, window=0, device=self.device)

    # ---- public steps ----
    def uses_body(self, state: V2State) -> bool:
        """Does `step` run the decode body (prep + device body, port/graph.py) on this state?
        decode="graph" and the triton backend (whose body is the fused kernels) do, on a
        windowed ring without pad keys; position 0 and everything else run `rows`."""
        return self.impl.uses_body(state)

    @property
    def hidden_points(self) -> dict:
        """Ladder points a decode step cannot show (fused into a kernel) -> where they went;
        empty unless the backend fuses (triton)."""
        return dict(self.impl.hidden_points)

    def step(self, token: int, state: V2State, logits=None):
        if self.uses_body(state):
            if logits is not None:
                self.check_step(token, state, logits=logits)
            out = state.decode_graph(self).step(token)
            return out if logits is None else logits.copy_(out)
        return self.run_step(token, state, logits=logits)

    def step_prefill(self, token: int, state: V2State) -> None:
        self.run_step(token, state, want_logits=False)

    def step_traced(self, token: int, state: V2State, logits, trace, *, prefill: bool = False):
        """`step` with every ladder point the step exposes passed to `trace(name, layer,
        value)`. On the triton backend a decode step is the fused body, which hides
        `hidden_points`; prefill=True traces the prefill arithmetic (`step_prefill`'s and
        `prefill_batch`'s) instead, where every point exists."""
        if self.impl.traces_body and not prefill and state.pos and self.uses_body(state):
            self.check_step(token, state, logits=logits)
            out = state.decode_graph(self).step(token, trace=trace)
            return out if logits is None else logits.copy_(out)
        return self.run_step(token, state, logits=logits, trace=trace)

    @staticmethod
    def last_hidden(state: V2State):
        return state.hidden

    def check_step(self, token, state, *, logits=None) -> int:
        """The token id a step would feed (a tensor token read once); StepError if refused."""
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
            if self.impl.contiguous_logits and not logits.is_contiguous():
                raise StepError(f"logits buffer with strides {logits.stride()}: the native "
                                f"step writes a contiguous [{cfg.vocab_size}] buffer")
        return token

    # ---- the forward, in order ----
    def run_step(self, token, state: V2State, *, logits=None, trace=None,
                 want_logits: bool = True):
        token = self.check_step(token, state, logits=logits)
        return self.rows([token], state, logits=logits, trace=trace, want_logits=want_logits)

    def rows(self, tokens: list, state: V2State, *, logits=None, trace=None,
             want_logits: bool = True, pool=None):
        """Run m = len(tokens) positions (already checked) through the backend's rows (the
        torch ops of `forward_rows`, or the C step)."""
        pos0 = state.pos
        pad = self.cfg.pad_token_id
        keep = [not (state.pad_aware and t == pad) for t in tokens]
        state.tokens.extend(tokens)         # inputs were checked: nothing below can fail
        state.valid.extend(keep)
        return self.impl.rows(tokens, state, pos0, keep, logits=logits, trace=trace,
                              want_logits=want_logits, pool=pool)

    def forward_rows(self, tokens: list, state: V2State, pos0: int, keep: list, *,
                     logits=None, trace=None, want_logits: bool = True, pool=None):
        """The torch forward of m = len(tokens) positions at pos0 (already in state.tokens).
        Every op is either elementwise, a reduction over a row, a per-row matrix product (bmm,
        one M=1 product per row) or the per-position attention, so row r's bits do not depend
        on m: a batched prefill leaves exactly the state of m single steps."""
        cfg = self.cfg
        n, d, m = cfg.mhc_lanes, cfg.d_model, len(tokens)
        x0 = self.rnd(self.embedding.table[torch.tensor(tokens, device=self.device)]
                      * math.sqrt(d))
        if trace:
            trace("embed", None, row0(trace, x0))
        eng = self.engram(state, pos0, m, trace=trace)
        X = x0[:, None, :].expand(m, n, d)                                      # [m, n, d]
        keep_t = torch.tensor(keep, device=self.device) if pool is not None else None
        if pool is not None:
            pool.add(x0, keep_t)
        cos = self.cos[pos0:pos0 + m, None, :]
        sin = self.sin[pos0:pos0 + m, None, :]
        for i in range(cfg.num_layers):
            X = self.layer(i, X, eng, state, pos0, cos, sin, trace=trace)
            if pool is not None:
                pool.add(X.mean(1), keep_t)
        return self.finish(X, state, logits=logits, trace=trace, want_logits=want_logits)

    def engram(self, state, pos0: int, m: int, *, trace=None) -> list:
        """Keys and convolved values of every site for positions pos0..pos0+m-1: [m, d] each.

        Row by row for the value ring: a row's taps read the rows before it, so a later row
        of the chunk must not overwrite a slot an earlier one still reads."""
        cfg, out = self.cfg, []
        if not cfg.num_sites:
            return out
        valid = state.valid                 # only the oldest n-gram token / tapped row counts
        host = [host_row(cfg, state.tokens, valid, p) for p in range(pos0, pos0 + m)]
        flat = torch.tensor([h[0] for h in host], device=self.device)
        ok = torch.tensor([h[1] for h in host], device=self.device)
        dil, R, d = cfg.engram_dilation, state.engram_ring, cfg.d_model
        for s, site in enumerate(self.engrams):
            e = (site.tables[flat] * ok[..., None]).reshape(m, -1)
            kv = self.rnd(self.mm(e, site.kv))
            k, vraw = kv[:, :d], kv[:, d:]
            v = torch.empty_like(vraw)
            for r in range(m):
                p = pos0 + r
                state.vraw[s, p % R] = vraw[r]
                acc = torch.zeros_like(vraw[r])
                for j in range(cfg.engram_taps):
                    if host[r][2][j]:
                        acc = acc + site.taps[j] * state.vraw[s, (p - j * dil) % R]
                v[r] = self.rnd(acc)
            if trace:
                trace(f"engram_k{s}", None, row0(trace, k))
                trace(f"engram_v{s}", None, row0(trace, v))
            out.append((k, v))
        return out

    def layer(self, i: int, X, eng, state, pos0: int, cos, sin, *, trace=None,
              attention=None):
        """Layer i on lanes X [m, n, d] at positions pos0..pos0+m-1; returns the new lanes.

        Writes the layer's K/V rows into the state's ring. `eng` holds every site's (k, v).
        `attention(i, h, cos, sin)` replaces the attention sublayer (the runtime's
        decode_body, which reads the position from device buffers; m = 1 there)."""
        cfg, lw, mhc = self.cfg, self.layers[i], self.mhc
        n, d, m = cfg.mhc_lanes, cfg.d_model, X.shape[0]
        q_ = self.rnd                       # each stored tensor at the activation dtype
        nx = q_(unit_rms(X.reshape(m, n * d)))
        r = q_(self.mm(nx, mhc.router[i]))
        hpre = q_(sigmoid(mhc.a_pre[i] * r[:, :n] + mhc.pre_bias[i]))
        u = q_(torch.bmm(hpre[:, None, :], X)[:, 0])
        bx, alpha = u, None
        site = cfg.site_of_layer(i)
        if site is not None:
            ek, ev = eng[site]
            alpha = q_(sigmoid((unit_rms(u) * unit_rms(ek)).sum(-1, keepdim=True)
                               / math.sqrt(d)))
            bx = q_(u + alpha * ev)
        h = q_(zc(bx, lw.pre_norm))
        if attention is not None:           # the graph body's: positions from device buffers
            q, k, v, o, gate, a = attention(i, h, cos, sin)
        else:
            q, k, v, o, gate, a = self.attention(i, h, cos, sin, state, pos0)
        ap = q_(zc(a, lw.post_norm))
        z = q_(bx + lw.attn_gate * ap)
        mi = q_(zc(z, lw.pre_hada_norm))
        mo = q_(self.mlp(i, mi))
        y = q_(z + mo - u)
        hpost = q_(2 * sigmoid(mhc.a_post[i] * r[:, n:2 * n] + mhc.post_bias[i]))
        res = q_(mhc.a_res[i] * r[:, 2 * n:].reshape(m, n, n) + mhc.b_res[i])
        P = q_(log_sinkhorn(res))
        if trace:
            for name, val in (("nx", nx), ("hpre", hpre), ("u", u), ("alpha", alpha),
                              ("bx", bx), ("h_in", h), ("q", q), ("k", k), ("v", v),
                              ("attn", o), ("gate", gate), ("attn_out", a),
                              ("attn_post", ap), ("mlp_in", mi), ("mlp_out", mo),
                              ("block_out", q_(z + mo)), ("y", y), ("hpost", hpost),
                              ("res_logits", res), ("hres", P)):
                if val is not None:
                    trace(name, i, row0(trace, val if name != "alpha" else val[:, 0]))
        X = q_(torch.bmm(P, X) + hpost[:, :, None] * y[:, None, :])
        if trace:
            trace("x", i, row0(trace, X))
        return X

    def attention(self, i: int, h, cos, sin, state, pos0: int, *, attend=None):
        """The attention sublayer on normed rows h [m, d]: fused q|k|v|gate product, q/k norms
        and RoPE, attention per position (or `attend(i, q, k, v)` for one row), the gate and
        the output product. Returns (q, k, v, o, gate, out) for the trace."""
        cfg, lw, m = self.cfg, self.layers[i], h.shape[0]
        H, KV, hd, attn, kvd = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.attn_dim_eff,
                                cfg.kv_dim)
        q_ = self.rnd
        qkvg = q_(self.mm(h, lw.qkvg))
        q = q_(self.rope(zc(qkvg[:, :attn].reshape(m, H, hd), lw.q_norm), cos, sin))
        k = q_(self.rope(zc(qkvg[:, attn:attn + kvd].reshape(m, KV, hd), lw.k_norm), cos, sin))
        v = qkvg[:, attn + kvd:attn + 2 * kvd].reshape(m, KV, hd)
        gate = q_(sigmoid(qkvg[:, attn + 2 * kvd:]))
        # the ring keeps the KV format (int8: code * scale); the trace shows k, v as computed
        kc, vc = self.kv_store(k), self.kv_store(v)
        if attend is not None:
            o = torch.stack([attend(i, q[0], kc[0], vc[0])])
        else:
            o = torch.stack([self._attend(i, q[r_], kc[r_], vc[r_], state, pos0 + r_)
                             for r_ in range(m)])
        o = q_(o)
        return q, k, v, o, gate, q_(self.mm(q_(o * gate), lw.out))

    def _attend(self, i, q, k, v, state, pos):
        """One position's attention through the state's AttnV41-style runtime (port/attn.py):
        write its K/V into the ring, then attend over the window selection."""
        return state.attn_runtime(self).forward(i, q[None], k[None], v[None], pos)[0]

    def mlp(self, i: int, h):
        """The Hadamard MLP of layer i on rows h [m, d]: d3 · W · silu(d2 · W · (d1 · h))."""
        lw, cfg = self.layers[i], self.cfg
        z = torch.nn.functional.pad(h, (0, cfg.hada_n - cfg.d_model))
        z = rowvecs(lw.d1 * z, self.walsh)
        z = rowvecs(silu(lw.d2 * z), self.walsh)
        return (lw.d3 * z)[:, :cfg.d_model]

    def finish(self, X, state, *, logits=None, trace=None, want_logits: bool = True):
        """Last row's lanes -> state.lanes, the final norm -> state.hidden, the LM head."""
        state.lanes.copy_(X[-1])
        mean = self.rnd(X[-1].mean(0))
        torch.mul(1.0 + self.final_norm, mean / torch.sqrt((mean * mean).mean() + EPS),
                  out=state.hidden)
        if self.precision.activations != "float32":
            state.hidden.copy_(self.rnd(state.hidden))
        if trace:
            trace("lane_mean", None, mean)
            trace("final_norm", None, state.hidden)
        if not want_logits:
            return None
        out = state.logits if logits is None else logits
        if self.rotate:
            out.copy_(self.mm(state.hidden[None], self.embedding.head)[0])
        else:
            torch.mv(self.embedding.table, state.hidden, out=out)
        if self.precision.activations != "float32":
            out.copy_(self.rnd(out))
        if trace:
            trace("logits", None, out)
        return out

    # ---- the products every sublayer shares ----
    def mm(self, x, wt):
        """x [m, in] times a part's matrix wt [in or in_pad, out], row by row."""
        if self.rotate:
            x = fwht(torch.nn.functional.pad(x, (0, wt.shape[0] - x.shape[-1])))
        return rowvecs(x, wt)

    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        a, b = x[..., :half], x[..., half:]
        return torch.cat([a * cos - b * sin, b * cos + a * sin], -1)

    # ---- entry points kept in their own modules: injection, batches, heads ----
    def step_layer(self, i: int, lanes, state: V2State, pos: int, *, engram=None, trace=None,
                   prefill: bool = False):
        """Injection: layer `i` alone at `pos` on the given lanes, through the implementation
        under test (port/inject.py)."""
        from .inject import step_layer
        return step_layer(self, i, lanes, state, pos, engram=engram, trace=trace,
                          prefill=prefill)

    def prefill_batch(self, tokens, state: V2State, batch, logits=None, trace=None):
        from .batch import prefill_batch
        return prefill_batch(self, tokens, state, batch, logits, trace=trace)

    def encode_contrastive(self, tokens, *, window: int = 0):
        """Probe head over tokens [T] or a batch [B, T] (port/heads.py); window 0: full causal."""
        from .heads import encode_contrastive
        return encode_contrastive(self, tokens, window=window)

    def confidence(self, tokens, *, window: int = 0):
        """Confidence logit over tokens [T] or a batch [B, T] (port/heads.py)."""
        from .heads import confidence
        return confidence(self, tokens, window=window)
