"""The AttnV41-style attention runtime, window class (the only class needle v2 uses).

Every needle layer is of the window-only class (compress ratio 0, plain RoPE, no compressor or
indexer: it publishes nothing and consumes nothing), so each layer attends over a ring of
`window` slots through `sparse_attn`. The runtime keeps the V4.1 shape so compressed classes
(issue #8) can be added as more entries of `CLASSES` without reshaping the calls:

  forward(layer, q, k, v, start_pos)   m tokens at start_pos (a prefill chunk or one token);
                                       eager, host arithmetic allowed
  decode_capturable(layer)             True: the window class has no host decision mid-layer
  decode_fixed_topk(layer)             the widest selection of the layer's class: the window
  decode_prep(layer_or_class, pos)     host: position, ring slot and the -1-padded selection
                                       into static buffers, uploading only what changed
  decode_body(layer, h, cos, sin)      device only: projections, norms, RoPE, the ring write
                                       at the slot read from the device, sparse attention
                                       over the static selection, gate, output projection
  invalidate_decode_uploads()          forget what was uploaded (after any eager forward)

The selection lists ring slots oldest first, always `window` wide, `-1` before position 0 (and
for pad keys of the probe heads), so eager and captured calls hand the kernel identical tiles.
"""
from __future__ import annotations

import math

import torch

from kernels.sparse_attn import BLOCK, sparse_attn_torch, sparse_attn_triton

WINDOW_CLASS = 0                 # compress ratio 0
CLASSES = (WINDOW_CLASS,)
TORCH_TILE = 256                 # one tile per shipped window: fewest ops for the torch twin


class AttnError(ValueError):
    """A call the runtime refuses (names the value and the limit)."""


class AttnRuntime:
    def __init__(self, model, state, max_tokens: int | None = None):
        cfg = model.cfg
        self.model, self.cfg, self.state, self.backend = model, cfg, state, model.backend
        self.kernel = model.impl.attend        # the backend's attention kernel
        self.max_tokens = max_tokens or cfg.max_seq_len
        self.scale = 1.0 / math.sqrt(cfg.head_dim)
        dev = state.k.device
        self.pos = torch.zeros(1, dtype=torch.int64, device=dev)        # decode position
        self.slot = torch.zeros(1, dtype=torch.int64, device=dev)       # pos % ring
        # The selection, -1-padded to whole kernel tiles (the fused body hands the kernel this,
        # so its wrapper pads nothing); idx_win is its first `window` entries.
        win = max(state.window, 1)
        self.idx_tile = torch.full((-(-win // BLOCK) * BLOCK,), -1, dtype=torch.int64,
                                   device=dev)
        self.idx_win = self.idx_tile[:win]
        self._uploaded = {}

    # ---- classes ----
    def layer_class(self, layer: int) -> int:
        if not 0 <= layer < self.cfg.num_layers:
            raise AttnError(f"layer {layer} outside 0..{self.cfg.num_layers - 1}")
        return WINDOW_CLASS

    def decode_capturable(self, layer: int) -> bool:
        return self.layer_class(layer) == WINDOW_CLASS

    def decode_fixed_topk(self, layer: int) -> int:
        self.layer_class(layer)
        if not self.state.window:
            raise AttnError("a full-causal state has no fixed selection width (window 0)")
        return self.state.window

    # ---- eager ----
    def selection(self, pos: int):
        """Ring slots of the window ending at `pos`, oldest first, -1 for absent keys."""
        st = self.state
        width = st.window or pos + 1                     # full causal: every position so far
        positions = torch.arange(pos - width + 1, pos + 1, device=st.k.device)
        sel = torch.where(positions >= 0, positions % st.ring, -1)
        if st.pad_aware:                                 # pad keys are absent keys
            sel = torch.where(st.key_ok[sel.clamp_min(0)], sel, -1)
        return sel

    def forward(self, layer: int, q, k, v, start_pos: int):
        """q [m, H, hd], k/v [m, KV, hd] for positions start_pos.. -> o [m, H*hd]. Each row
        writes its K/V, then attends: a row never reads a slot a later row overwrites."""
        m, st = q.shape[0], self.state
        if not 1 <= m <= self.max_tokens:
            raise AttnError(f"m={m} tokens outside 1..max_tokens={self.max_tokens}")
        if not 0 <= start_pos or start_pos + m > self.cfg.max_seq_len:
            raise AttnError(f"positions {start_pos}..{start_pos + m - 1} outside "
                            f"0..max_seq_len-1={self.cfg.max_seq_len - 1}")
        self._uploaded.pop("window", None)               # this state changed under the graph
        out = []
        for r in range(m):
            pos = start_pos + r
            slot = pos % st.ring
            st.k[layer, :, slot] = k[r]
            st.v[layer, :, slot] = v[r]
            st.key_ok[slot] = st.valid[pos]
            out.append(self._attend(layer, q[r], self.selection(pos)))
        return torch.stack(out)

    # ---- capturable decode ----
    def decode_prep(self, layer_or_class, start_pos: int) -> None:
        """Host half of a one-token decode step for a layer (or a whole class)."""
        cls = layer_or_class if isinstance(layer_or_class, str) else \
            self.layer_class(layer_or_class)
        if cls not in (WINDOW_CLASS, "window"):
            raise AttnError(f"unknown layer class {layer_or_class!r}")
        if not 1 <= start_pos < self.cfg.max_seq_len:
            raise AttnError(f"decode start_pos={start_pos} outside 1..max_seq_len-1="
                            f"{self.cfg.max_seq_len - 1} (position 0 is a prefill)")
        st = self.state
        if not st.window or self.idx_win.shape[0] != st.window or st.pad_aware:
            raise AttnError(f"capturable decode needs a windowed ring state without pad keys "
                            f"(window={st.window}, selection width {self.idx_win.shape[0]})")
        if self._uploaded.get("window") == start_pos:
            return
        self.pos.fill_(start_pos)
        self.slot.fill_(start_pos % st.ring)
        self.idx_win.copy_(self.selection(start_pos))
        self._uploaded["window"] = start_pos

    def decode_body(self, layer: int, h, cos, sin):
        """Device half of one layer's attention for one token: the q|k|v|gate product, norms,
        RoPE (cos/sin rows gathered by the caller from `self.pos`), the ring write at the slot
        read from the device, sparse attention over the static selection, the gate and the
        output product. Per-token values come only from the static buffers, so a graph
        captured once replays at any position. Returns the model's (q, k, v, o, gate, out)."""
        return self.model.attention(layer, h, cos, sin, self.state, 0, attend=self._ring_attend)

    def _ring_attend(self, layer: int, q, k, v):
        st = self.state
        st.k[layer].index_copy_(1, self.slot, k[:, None, :])
        st.v[layer].index_copy_(1, self.slot, v[:, None, :])
        return self._attend(layer, q, self.idx_win)

    def invalidate_decode_uploads(self) -> None:
        self._uploaded.clear()

    def _attend(self, layer, q, sel):
        st = self.state
        k_rows, v_rows = st.k[layer].transpose(0, 1), st.v[layer].transpose(0, 1)  # [R, KV, hd]
        return self.kernel(q[None], k_rows, v_rows, sel[None], self.scale).reshape(-1)
