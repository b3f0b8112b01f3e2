"""backend="native": the whole step of m positions in one call to the C step
(kernels/native/needle_step.c), on the model's dense float32 weights or, for a model built from
Cactus-Quants codes, on the packed codes themselves (kernels/native/cq_packed.c).

The model's parts (port/parts.py) are bound once (NativeModel keeps every tensor the C side
points to); each state gets its binding, scratch and host arrays once (NativeBuffers, grown
only when a prefill chunk is wider than any before), so a step allocates no tensor: the host
computes the n-gram hashes and validity bits into preallocated ctypes arrays and the C side
writes the caches, lanes, hidden vector and logits in place.
"""
from __future__ import annotations

import ctypes
import math

import torch

from kernels import native
from kernels.native import NModel, NState, ptr
from . import host
from .errors import StepError
from .parts import stacked

_I64P = ctypes.POINTER(ctypes.c_int64)
_U8P = ctypes.POINTER(ctypes.c_uint8)


def model_scalars(model) -> dict:
    """The NModel's numbers for a V2Model (the C step's view of its geometry)."""
    cfg = model.cfg
    return dict(L=cfg.num_layers, n=cfg.mhc_lanes, d=cfg.d_model, H=cfg.num_heads,
                KV=cfg.num_kv_heads, hd=cfg.head_dim, hada=cfg.hada_n, max_seq=cfg.max_seq_len,
                vocab=cfg.vocab_size, sinkhorn_iters=20, eps=1e-6,
                attn_scale=1.0 / math.sqrt(cfg.head_dim),
                walsh_scale=float(model.walsh[0, 0]), sites=len(model.engrams),
                T=len(cfg.engram_orders) * cfg.engram_heads_eff, sub=cfg.engram_sub,
                taps=cfg.engram_taps, dil=cfg.engram_dilation,
                ering=(cfg.engram_taps - 1) * cfg.engram_dilation + 1)


def model_arrays(model) -> dict:
    """The NModel's per-model arrays by field name, as the C step reads them (per-layer parts
    stacked [L, ...]); the four big matrices are None for the packed form (codes instead)."""
    cfg, layers, mhc = model.cfg, model.layers, model.mhc
    per_layer = lambda name: stacked([getattr(lw, name) for lw in layers])
    dense = model.form != "packed"
    big = lambda get: get() if dense else None
    site_of = torch.tensor([-1 if cfg.site_of_layer(i) is None else cfg.site_of_layer(i)
                            for i in range(cfg.num_layers)], dtype=torch.int64)
    return dict(
        emb=big(lambda: model.embedding.table),
        qkvg=big(lambda: stacked([lw.qkvg.t() for lw in layers])),
        out=big(lambda: stacked([lw.out.t() for lw in layers])),
        router=big(lambda: mhc.router.transpose(1, 2)),
        qn=per_layer("q_norm"), kn=per_layer("k_norm"), pre=per_layer("pre_norm"),
        post=per_layer("post_norm"), pre_hada=per_layer("pre_hada_norm"),
        attn_gate=per_layer("attn_gate"), d1=per_layer("d1"), d2=per_layer("d2"),
        d3=per_layer("d3"), pre_bias=mhc.pre_bias, post_bias=mhc.post_bias, a_pre=mhc.a_pre,
        a_post=mhc.a_post, a_res=mhc.a_res, b_res=mhc.b_res, cos_t=model.cos,
        sin_t=model.sin, final_scale=model.final_norm, site_of_layer=site_of)


class NativeModel:
    """A V2Model's parts as the C step's NModel: the dense float32 matrices, or for the
    "packed" form (port/parts.py) the Cactus-Quants codes as stored. Per-layer parts are
    handed over stacked [L, ...] (views of the prepared weights where they are consecutive)."""

    def __init__(self, model):
        if model.form == "rotated":
            raise ValueError("backend='native' computes on dense float32 matrices or on the "
                             "packed codes; build it with weights='dense' or from a .cact")
        native.lib()                    # built (or refused) at load, not at the first step
        cfg, keep = model.cfg, []
        self.cfg = cfg
        self.packed = model.form == "packed"

        def p(t, kind=native._P):
            t = t.detach().contiguous()
            keep.append(t)
            return ptr(t, kind)

        sites = model.engrams
        self.T = len(cfg.engram_orders) * cfg.engram_heads_eff
        self.orders = [o for o in cfg.engram_orders for _ in range(cfg.engram_heads_eff)]
        arr = lambda ts: (native._P * max(1, len(ts)))(*[p(t) for t in ts])
        dense = not self.packed
        self._arrays = [arr([s.tables for s in sites] if dense else []),
                        arr([s.kv.t() for s in sites] if dense else []),
                        arr([s.taps for s in sites])]
        mats = {k: None if v is None else p(v, _I64P if k == "site_of_layer" else native._P)
                for k, v in model_arrays(model).items()}
        self.m = NModel(**model_scalars(model), **mats, tables=self._arrays[0],
                        eng_kv=self._arrays[1], eng_taps=self._arrays[2])
        self._keep = keep
        if self.packed:
            self._bind_packed(cfg, model)
        self.sizes = self._capture_sizes(cfg)

    def _bind_packed(self, cfg, model):
        from .cq import _level_table
        L, n = cfg.num_layers, cfg.mhc_lanes

        def pk(cw, row0=0, rows=None):
            return native.PackedCq(cw.packed, cw.norms, _level_table(cw.bits), cw.store_bits,
                                   cw.in_features, row0, rows)
        lay = lambda i, k: pk(model.layers[i].codes[k])
        band = lambda k, i, r: pk(model.mhc.codes[k], i * r, r)
        groups = {
            "cq_qkvg": [lay(i, k) for i in range(L) for k in ("q_proj", "k_proj", "v_proj",
                                                              "gate_proj")],
            "cq_out": [lay(i, "out_proj") for i in range(L)],
            "cq_router": [m for i in range(L) for m in (band("pre", i, n), band("post", i, n),
                                                        band("res", i, n * n))],
            "cq_emb": [pk(model.embedding.codes)],
            "cq_eng_kv": [pk(site.codes[k]) for site in model.engrams
                          for k in ("key_proj", "value_proj")],
            "cq_tables": [pk(site.codes["tables"]) for site in model.engrams],
        }
        self._packed = [m for ms in groups.values() for m in ms]      # keep the codes alive
        self._cq_arrays = {k: native.cq_array(ms) for k, ms in groups.items() if ms}
        for k, arr in self._cq_arrays.items():
            setattr(self.m, k, arr)
        self.m.cq = 1
        self.m.cq_max_in = max(m.in_pad for m in self._packed)

    @property
    def lib(self):
        """The library of each call: the clean build, or a planted fault's (ladder/sides/faults.py);
        the bound NModel is the same for both."""
        return native.lib()

    @staticmethod
    def _capture_sizes(cfg) -> dict:
        n, d, H, KV, hd = cfg.mhc_lanes, cfg.d_model, cfg.num_heads, cfg.num_kv_heads, \
            cfg.head_dim
        return {"nx": (n * d,), "hpre": (n,), "u": (d,), "alpha": (), "bx": (d,),
                "h_in": (d,), "q": (H, hd), "k": (KV, hd), "v": (KV, hd), "attn": (H * hd,),
                "gate": (H * hd,), "attn_out": (d,), "attn_post": (d,), "mlp_in": (d,),
                "mlp_out": (d,), "block_out": (d,), "y": (d,), "hpost": (n,),
                "res_logits": (n, n), "hres": (n, n), "x": (n, d), "lane_mean": (d,),
                "embed": (d,), "engram_k": (d,), "engram_v": (d,)}

    def buffers(self, state) -> "NativeBuffers":
        b = state.__dict__.get("_native")
        if b is None or b.model is not self:
            b = state._native = NativeBuffers(self, state)
        return b


class NativeBuffers:
    """One state's binding: NState over its tensors, scratch and host arrays."""

    def __init__(self, nm: NativeModel, state):
        self.model, self.cap = nm, 0
        self.s = NState(k=ptr(state.k), v=ptr(state.v), key_ok=ptr(state.key_ok, _U8P),
                        lanes=ptr(state.lanes), hidden=ptr(state.hidden), vraw=ptr(state.vraw),
                        R=state.ring, window=state.window)
        self.state = state
        self.grow(1)

    def grow(self, m: int):
        if m <= self.cap:
            return
        nm, cfg = self.model, self.model.cfg
        self.cap = m
        self.scratch = torch.zeros(int(nm.lib.nat_scratch_floats(ctypes.byref(nm.m), m)))
        self.tok = (ctypes.c_int64 * m)()
        self.flat = (ctypes.c_int64 * max(1, m * nm.T))()
        self.ok = (ctypes.c_float * max(1, m * nm.T))()
        self.tap_ok = (ctypes.c_uint8 * max(1, m * cfg.engram_taps))()
        self.valid = (ctypes.c_uint8 * m)()


def host_row(cfg, tokens, valid, p: int) -> tuple:
    """The host's part of position p as the C step reads it (port/host.py host_row; nothing
    for a model without Engram sites)."""
    if not cfg.num_sites:
        return [], [], []
    return host.host_row(cfg, tokens, valid, p)


def _host_rows(nm: NativeModel, b: "NativeBuffers", state, pos0: int, m: int):
    """The host's part of positions pos0..pos0+m-1 (tokens already in state.tokens/valid):
    token ids, the Engram n-gram table rows and their presence, tap and key presence."""
    cfg, valid = nm.cfg, state.valid
    for r in range(m):
        p = pos0 + r
        b.tok[r] = state.tokens[p]
        b.valid[r] = valid[p]
        flat, ok, taps = host_row(cfg, state.tokens, valid, p)
        for t, (row, present) in enumerate(zip(flat, ok)):
            b.flat[r * nm.T + t] = row
            b.ok[r * nm.T + t] = present
        for j, present in enumerate(taps):
            b.tap_ok[r * cfg.engram_taps + j] = present


def _capture_buffers(nm: NativeModel):
    """Zeroed capture tensors per point and the C array of their pointers (CAPTURES order)."""
    caps = {name: torch.zeros(_rows_of(name, nm.cfg), *shape)
            for name, shape in nm.sizes.items()}
    return caps, (native._P * len(native.CAPTURES))(*[ptr(caps[k]) for k in native.CAPTURES])


def run_rows(model, nm: NativeModel, tokens: list, state, pos0: int, logits, trace,
             want_logits: bool, pool=None):
    """Feed `tokens` (already appended to state.tokens/valid) at pos0 through the C step."""
    m = len(tokens)
    b = nm.buffers(state)
    b.grow(m)
    b.s.window = state.window
    _host_rows(nm, b, state, pos0, m)
    caps = caps_arr = None
    if trace or pool is not None:
        caps, caps_arr = _capture_buffers(nm)
    out = state.logits if logits is None else logits
    rc = nm.lib.nat_rows(ctypes.byref(nm.m), ctypes.byref(b.s), m, pos0, b.tok, b.flat, b.ok,
                         b.tap_ok, b.valid, ptr(b.scratch), caps_arr, int(want_logits),
                         ptr(out))
    if rc != 0:                          # the caller checked everything: a bug if reached
        raise RuntimeError(f"native step refused positions {pos0}..{pos0 + m - 1}")
    if caps is not None:
        _emit(model, caps, trace, pool, state, pos0, want_logits, out)
    return out if want_logits else None


def run_layer(model, nm: NativeModel, i: int, lanes, state, pos: int, engram, trace):
    """Injection on the C step: layer i alone at `pos` (already stepped into `state`) on
    `lanes` [n, d], through nat_layer: the same C code and scratch as a step. `engram`:
    [(k [d], v [d]) per site], or None to compute them in C from the state's tokens. Writes
    layer i's K/V at pos into `state` (pass a clone). Returns the lanes after the layer."""
    cfg = nm.cfg
    b = nm.buffers(state)
    b.s.window = state.window
    _host_rows(nm, b, state, pos, 1)
    X = lanes.detach().reshape(cfg.mhc_lanes, cfg.d_model).to(torch.float32).clone()
    ek = ev = None                       # None: nat_layer computes them
    if engram is not None:
        if len(engram) != cfg.num_sites:
            raise StepError(f"engram holds {len(engram)} sites; the model has "
                            f"{cfg.num_sites}")
        rows = lambda j: torch.stack([kv[j].reshape(cfg.d_model).float() for kv in engram]
                                     or [torch.zeros(cfg.d_model)]).contiguous()
        ek, ev = rows(0), rows(1)
    caps, caps_arr = _capture_buffers(nm) if trace else (None, None)
    rc = nm.lib.nat_layer(ctypes.byref(nm.m), ctypes.byref(b.s), i, pos, ptr(X),
                          ptr(ek) if ek is not None else None,
                          ptr(ev) if ev is not None else None, b.flat, b.ok, b.tap_ok,
                          b.valid[0], ptr(b.scratch), caps_arr)
    if rc != 0:
        raise RuntimeError(f"native layer refused layer {i} at position {pos}")
    if caps is not None:
        _emit_layer(cfg, caps, nm.sizes, trace, i)
    return X


def _rows_of(name: str, cfg) -> int:
    if name in ("engram_k", "engram_v"):
        return max(1, cfg.num_sites)
    return 1 if name in ("lane_mean", "embed") else cfg.num_layers


def _emit(model, caps, trace, pool, state, pos0, want_logits, out):
    """The captured row-0 values in the torch path's order and shapes."""
    cfg, sizes = model.cfg, model._native.sizes
    if pool is not None:
        keep = torch.tensor([state.valid[pos0]])
        pool.add(caps["embed"], keep)
        for i in range(cfg.num_layers):
            pool.add(caps["x"][i].mean(0, keepdim=True), keep)
    if not trace:
        return
    trace("embed", None, caps["embed"][0])
    for s in range(cfg.num_sites):
        trace(f"engram_k{s}", None, caps["engram_k"][s])
        trace(f"engram_v{s}", None, caps["engram_v"][s])
    for i in range(cfg.num_layers):
        _emit_layer(cfg, caps, sizes, trace, i)
    trace("lane_mean", None, caps["lane_mean"][0])
    trace("final_norm", None, state.hidden)
    if want_logits:
        trace("logits", None, out)



def _emit_layer(cfg, caps, sizes, trace, i):
    for name in native.CAPTURES[:native.CAPTURES.index("lane_mean")]:
        if name == "alpha" and cfg.site_of_layer(i) is None:
            continue
        trace(name, i, caps[name][i].reshape(sizes[name]))
