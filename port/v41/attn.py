"""The AttnV41 runtime with every V4.1 layer class (attn_v41 spec §2): window-only, and the
compressed classes (ratio 2 and 1) whose kv sources publish a compressed cache, whose index
sources publish a selection (the candidate source also a block filter) and whose other layers
reuse what was last published.

The seed's split: the runtime is built once per model (RoPE tables, the decode static buffers,
the static bf16 [max_tokens, dim] output buffer `out`) and holds one LayerWeightsV41 per layer;
everything a sequence writes lives in a SequenceV41 (per-layer LayerStateV41, its SharedV41;
port/v41/state.py), so one runtime serves many sequences. `AttnStackV41` is the same type.

  AttnV41(args, weights, backend="torch"|"triton", decode="eager"|"graph", device=None,
          max_tokens=None)
  new_sequence()                        a SequenceV41 of its own
  reset(seq=None)                       start a sequence over (layer 0 at position 0 also does)
  forward(layer, x, start_pos, trace=None, seq=None)
                                        x [m, dim] bf16 -> out[:m] (a view of the static output
                                        buffer, valid until the next call); layers in order;
                                        seq defaults to the runtime's own sequence
  decode_capturable(layer)             False on kv and index sources (host decisions mid-layer)
  decode_fixed_topk(layer)             ratio > 0: min(window + index_topk, 2048); ratio 0: window
  decode_prep(layer, start_pos)        host: position and the -1-padded selection (window slots,
  decode_prep_role(ratio>0, start_pos)   then the shared selection) into static buffers, each
                                       uploaded only when it changed; returns the compressed rows
                                       the body reads (None for ratio 0)
  decode_body(layer, x, rows_b)        device only: projections, RoPE from the device position,
                                       the ring write at pos % window, sparse attention over
                                       [ring | rows_b] with the fixed-width selection, output
                                       into the static buffer
  invalidate_decode_uploads()          forget what the static buffers hold

Limit: past position 0 a call takes one token. A chunked prefill (m > 1 at start_pos > 0) is
refused before any write ("start_pos=.. > 0 takes one token"): the ring write, the window
indices and the compressors' group filling past position 0 are the official decode's, one
token at a time; generalising them is not done here.

A capturable one-token step runs the same arithmetic eagerly and in the body (the eager step
hands sparse attention the unpadded selection, the body the -1-padded one, which changes no
bit), so decode="graph" output bytes equal decode="eager". With decode="graph" forward routes
those steps through port/v41/graph.py (a CUDA graph per layer on CUDA).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels.ring import ring_put_torch, ring_put_triton, window_topk_idxs
from kernels.v41.sparse_attn import sparse_attn_v41
from reference.v41.config import (MAX_SELECTION, V41Args, V41ConfigError,
                                   forward_call_problem, mtp_layers_present, mtp_weight_names,
                                   weight_names)

from .compress import check_sources, compressed_part
from .ops import AttnV41Error, emit, fp8_rt, grouped_projection, rms, rope, rope_cis  # noqa: F401
from .state import LayerWeightsV41, SequenceV41, SharedV41

__all__ = ["AttnV41", "AttnStackV41", "AttnV41Error"]


class AttnStackV41:
    def __init__(self, args, weights: dict, backend: str = "torch", decode: str = "eager",
                 device=None, max_tokens: int | None = None):
        try:
            self.args = a = V41Args.from_any(args)
            self.mtp = mtp_layers_present(a, weights)
        except V41ConfigError as e:
            raise AttnV41Error(str(e)) from None
        if backend not in ("torch", "triton"):
            raise AttnV41Error(f"backend={backend!r} is not 'torch' or 'triton'")
        if decode not in ("eager", "graph"):
            raise AttnV41Error(f"decode={decode!r} is not 'eager' or 'graph'")
        self.backend, self.decode = backend, decode
        self._ring_put = ring_put_triton if backend == "triton" else ring_put_torch
        try:
            self.dev = dev = torch.device(device or "cpu")
        except RuntimeError as e:
            raise AttnV41Error(f"device={device!r}: {e}") from None
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise AttnV41Error(f"device={device!r}: torch.cuda.is_available() is False "
                               f"(torch {torch.__version__})")
        self.max_tokens = max_tokens or a.max_seq_len
        if not 1 <= self.max_tokens <= a.max_seq_len:
            raise AttnV41Error(f"max_tokens={self.max_tokens} outside 1..{a.max_seq_len}")
        self.layers, self.w = [], {}          # per-layer weights; `w` the flat official view
        for i in range(a.n_layers):
            own = {}
            for n in weight_names(a, i):
                if n not in weights:
                    raise AttnV41Error(f"weights lack {n!r} (layer {i}'s role needs it)")
                self.w[n] = own[n.split(".attn.", 1)[1]] = weights[n].to(dev)
            self.layers.append(LayerWeightsV41(i, a.role(i), own))
        for k in self.mtp:                  # held, not run: DSpark attention reads main_x
            self.w.update({n: weights[n].to(dev) for n in mtp_weight_names(k)})
        self.plain = rope_cis(a.rope_head_dim, a.max_seq_len, a.rope_theta).to(dev)
        self.yarn = rope_cis(a.rope_head_dim, a.max_seq_len, a.compress_rope_theta, True,
                             a.rope_factor, a.original_seq_len, a.beta_fast,
                             a.beta_slow).to(dev)
        self.scale = a.head_dim ** -0.5
        i64 = dict(dtype=torch.int64, device=dev)
        self.pos = torch.zeros(1, **i64)                                  # decode position
        self.idx_dev = torch.full((1, min(a.window_size + a.index_topk, MAX_SELECTION)), -1,
                                  **i64)                                  # ratio > 0 class
        self.idx_dev_win = torch.full((1, a.window_size), -1, **i64)     # ratio 0 class
        # the seed's out_ptr: every path writes its output rows here and returns them as a
        # view (valid until the next call), so a captured step bakes one output address
        self.out = torch.zeros(self.max_tokens, a.dim, dtype=torch.bfloat16, device=dev)
        self._uploaded = {}
        self.seq = self._active = self.new_sequence()      # the default sequence
        self.graphs = None
        if decode == "graph":
            from .graph import DecodeGraphsV41
            self.graphs = DecodeGraphsV41(self)

    # ---- sequences ----
    def new_sequence(self) -> SequenceV41:
        """A sequence of its own (per-layer state and SharedV41) that this runtime serves when
        passed as forward(..., seq=)."""
        return SequenceV41(self.args, self.dev)

    def reset(self, seq: SequenceV41 | None = None):
        """Start `seq` (default: the default sequence) over, zeroing its buffers in place
        (captured graphs keep their pointers)."""
        (seq or self.seq).reset()
        self.invalidate_decode_uploads()

    # the buffers of the sequence being served (the default one outside a call)
    ring = property(lambda self: [st.ring for st in self._active.layers])
    cache = property(lambda self: self._active.by_layer("cache"))
    kcache = property(lambda self: self._active.by_layer("kcache"))
    kv_state = property(lambda self: self._active.by_layer("kv_state"))
    score_state = property(lambda self: self._active.by_layer("score_state"))

    @property
    def shared(self) -> SharedV41:
        return self._active.shared

    @shared.setter
    def shared(self, published):
        self._active.shared = SharedV41(**published)

    def _p(self, layer, name):
        return self.layers[layer].w[name]

    # ---- decode classes ----
    def decode_capturable(self, layer: int) -> bool:
        r = self._role(layer)
        return not (r.is_kv_source or r.is_index_source)

    def decode_fixed_topk(self, layer: int) -> int:
        return self._fixed(self._role(layer).ratio > 0)

    def _fixed(self, ratio_positive: bool) -> int:
        a = self.args
        return min(a.window_size + a.index_topk, MAX_SELECTION) if ratio_positive \
            else a.window_size

    def _role(self, layer):
        if not isinstance(layer, int) or not 0 <= layer < self.args.n_layers:
            raise AttnV41Error(f"layer={layer!r} outside 0..{self.args.n_layers - 1}")
        return self.args.role(layer)

    def invalidate_decode_uploads(self) -> None:
        self._uploaded = {}

    def decode_prep(self, layer: int, start_pos: int):
        if not self.decode_capturable(layer):
            raise AttnV41Error(f"layer {layer} is a kv or index source: its decode step decides "
                               f"on the host mid-layer and is not capturable")
        return self.decode_prep_role(self._role(layer).ratio > 0, start_pos)

    def decode_prep_role(self, ratio_positive: bool, start_pos: int):
        a = self.args
        if not 1 <= start_pos < a.max_seq_len:
            raise AttnV41Error(f"decode start_pos={start_pos} outside 1..max_seq_len-1="
                               f"{a.max_seq_len - 1} (position 0 is a prefill)")
        sel = window_topk_idxs(a.window_size, 1, start_pos)[0].tolist()
        rows_b = None
        if ratio_positive:
            shared, rows_b = self.shared["topk_idxs"], self.shared["compress_kv"]
            if rows_b is None or shared is None:
                raise AttnV41Error("decode_prep for a compressed layer before any source "
                                   "published a compressed cache and a selection")
            if shared.shape[0] != 1:
                raise AttnV41Error(f"the shared selection holds {shared.shape[0]} queries; a "
                                   f"decode step takes 1")
            sel += shared[0].tolist()
        fixed, key = self._fixed(ratio_positive), "idx" if ratio_positive else "idx_win"
        if len(sel) > fixed:
            raise AttnV41Error(f"selection of {len(sel)} entries exceeds the fixed decode width "
                               f"{fixed}")
        # every check passed: only now touch the static buffers and what they are known to hold
        if self._uploaded.get("pos") != start_pos:
            self.pos.fill_(start_pos)
            self._uploaded["pos"] = start_pos
        padded = sel + [-1] * (fixed - len(sel))
        if self._uploaded.get(key) != padded:
            buf = self.idx_dev if ratio_positive else self.idx_dev_win
            buf.copy_(torch.tensor([padded], dtype=torch.int64))
            self._uploaded[key] = padded
        self.last_selection = torch.tensor([sel], dtype=torch.int64)
        return rows_b

    def decode_body(self, layer: int, x, rows_b):
        """Device half of a capturable one-token step; returns the step's tensors (`out` and the
        trace points computed on the device)."""
        role = self._role(layer)
        if not self.decode_capturable(layer):
            raise AttnV41Error(f"layer {layer} is a kv or index source: no capturable body")
        if (rows_b is not None) != (role.ratio > 0):
            raise AttnV41Error(f"layer {layer} (ratio {role.ratio}) needs rows_b "
                               f"{'present' if role.ratio else 'absent'}")
        idx = self.idx_dev if role.ratio else self.idx_dev_win
        return self._step(layer, x, self.pos, idx, rows_b)

    # ---- shared arithmetic ----
    def _qkv(self, layer, x, cis):
        a = self.args
        qr = rms(F.linear(x, self._p(layer, "wq_a.weight")), self._p(layer, "q_norm.weight"),
                 a.norm_eps)
        q = rope(F.linear(qr, self._p(layer, "wq_b.weight")).view(-1, a.n_heads, a.head_dim),
                 cis)
        kv = rms(F.linear(x, self._p(layer, "wkv.weight")), self._p(layer, "kv_norm.weight"),
                 a.norm_eps)
        return qr, q, fp8_rt(rope(kv, cis))

    def _attend(self, layer, q, rows_a, rows_b, idx, cis):
        a = self.args
        o = sparse_attn_v41(q, rows_a, rows_b, idx, self.scale, self._p(layer, "attn_sink"),
                            self.backend).to(torch.bfloat16)
        o_rot = rope(o, cis, inverse=True)
        og, out = grouped_projection(o_rot, self._p(layer, "wo_a.weight"),
                                     self._p(layer, "wo_b.weight"), a.o_groups,
                                     out=self.out[:q.shape[0]])
        return {"o": o, "o_rot": o_rot, "og": og, "out": out}

    def _step(self, layer, x, pos, idx, rows_b):
        """One token at the device position `pos`: the capturable arithmetic."""
        role = self.args.role(layer)
        cis = (self.yarn if role.ratio else self.plain).index_select(0, pos)
        qr, q, kv = self._qkv(layer, x, cis)
        self._ring_put(self.ring[layer], kv, pos, self.args.window_size)      # slot read on the device
        res = self._attend(layer, q, self.ring[layer], rows_b, idx, cis)
        res.update(qr=qr, q=q, kv=kv)
        return res

    # ---- eager ----
    def _check(self, layer, x, start_pos):
        problem = forward_call_problem(self.args, layer, x, start_pos, self.max_tokens)
        if problem:
            raise AttnV41Error(problem)

    def forward(self, layer: int, x, start_pos: int, trace=None, seq=None):
        """Layer `layer`'s attention for `seq` (default: the default sequence). The result is
        a view of the static output buffer: read or copy it before the next call."""
        if seq is not None and not isinstance(seq, SequenceV41):
            raise AttnV41Error(f"seq={type(seq).__name__} is not a SequenceV41 "
                               f"(make one with new_sequence())")
        self._active = seq or self.seq
        try:
            return self._forward(layer, x, start_pos, trace)
        finally:
            self._active = self.seq

    def segments(self) -> list:
        """The runs of consecutive capturable layers (what forward_segment takes)."""
        runs, cur = [], []
        for i in range(self.args.n_layers):
            if self.decode_capturable(i):
                cur.append(i)
            elif cur:
                runs, cur = runs + [tuple(cur)], []
        return runs + ([tuple(cur)] if cur else [])

    def check_segment(self, layers, xs, start_pos) -> tuple:
        layers = tuple(layers)
        if not layers or not any(layers == run[i:i + len(layers)]
                                 for run in self.segments() for i in range(len(run))):
            raise AttnV41Error(f"layers {list(layers)} are not consecutive capturable layers "
                               f"(runs: {self.segments()})")
        if start_pos < 1:
            raise AttnV41Error(f"forward_segment start_pos={start_pos}: a segment is a decode "
                               f"step (position 0 is a prefill)")
        if xs.dim() != 2 or xs.shape[0] != len(layers):
            raise AttnV41Error(f"xs must be [{len(layers)}, dim] (one input row per layer), got "
                               f"{list(xs.shape)}")
        for j, layer in enumerate(layers):
            self._check(layer, xs[j:j + 1], start_pos)
            check_sources(self, layer, 1, start_pos)
        return layers

    def forward_segment(self, layers, xs, start_pos: int, seq=None):
        """One decode step of consecutive capturable layers (none of them a source, so what
        they read is fixed before the first runs), inputs xs [n, dim] bf16 -> [n, dim]: with
        decode="graph" one graph holds the whole run, both selection classes; eager runs the
        layers one by one. Equal bytes either way, and equal to forward() layer by layer."""
        if seq is not None and not isinstance(seq, SequenceV41):
            raise AttnV41Error(f"seq={type(seq).__name__} is not a SequenceV41 "
                               f"(make one with new_sequence())")
        self._active = seq or self.seq
        try:
            layers = self.check_segment(layers, xs, start_pos)
            xs = xs.to(self.dev)
            if self.graphs is not None:
                return self.graphs.segment_step(layers, xs, start_pos)
            tr = lambda name, lay, v: None  # noqa: E731
            return torch.cat([self._eager_step(layer, xs[j:j + 1], start_pos, tr).clone()
                              for j, layer in enumerate(layers)])
        finally:
            self._active = self.seq

    def _forward(self, layer, x, start_pos, trace):
        self._check(layer, x, start_pos)
        check_sources(self, layer, x.shape[0], start_pos)       # refuse before any write
        x = x.to(self.dev)
        if layer == 0 and start_pos == 0:
            self.reset(self._active)
        tr = trace or (lambda name, lay, v: None)
        if start_pos > 0 and self.decode_capturable(layer):
            if self.graphs is not None:
                return self.graphs.step(layer, x, start_pos, trace)
            return self._eager_step(layer, x, start_pos, tr)
        return self._general(layer, x, start_pos, tr)

    def _eager_step(self, layer, x, start_pos, tr):
        role, a = self.args.role(layer), self.args
        widx = window_topk_idxs(a.window_size, 1, start_pos).to(self.dev)
        idx, rows_b = widx, None
        if role.ratio:                           # published, one row: vetted by check_sources
            rows_b = self.shared["compress_kv"]
            idx = torch.cat([widx, self.shared["topk_idxs"].to(self.dev)], dim=1)
        res = self._step(layer, x, torch.tensor([start_pos], device=self.dev), idx, rows_b)
        clen = (start_pos + 1) // role.ratio if role.ratio else 0
        emit(tr, layer, res, widx, idx, rows_b[:clen] if role.ratio else None)
        return res["out"]

    def _general(self, layer, x, start_pos, tr):
        a, role, m = self.args, self.args.role(layer), x.shape[0]
        cis = (self.yarn if role.ratio else self.plain)[start_pos:start_pos + m]
        qr, q, kv = self._qkv(layer, x, cis)
        ring, win = self.ring[layer], a.window_size
        for t in range(max(0, m - win), m):
            ring[(start_pos + t) % win] = kv[t]
        rows_a = kv if start_pos == 0 else ring
        widx = window_topk_idxs(win, m, start_pos).to(self.dev)
        idx, rows_b, shown = widx, None, None
        if role.ratio:
            rows_b, sel, clen = compressed_part(self, layer, role, x, qr, start_pos,
                                                rows_a.shape[0], tr)
            idx, shown = torch.cat([widx, sel.to(self.dev)], dim=1), rows_b[:clen]
        res = self._attend(layer, q, rows_a, rows_b, idx, cis)
        res.update(qr=qr, q=q, kv=kv)
        emit(tr, layer, res, widx, idx, shown)
        return res["out"]


AttnV41 = AttnStackV41
