"""Per-sequence state of the port: ring KV cache, Engram value ring, token history, scratch.

The KV cache holds `ring` slots per layer (slot = pos % ring): the model's own window for
generation, `max_seq_len` for full causal attention (the probe heads). The Engram ring keeps
the un-convolved value rows the dilated taps reach back to, so a step never recomputes them.

`act_dtype` (the triton backend at a 16-bit precision, port/fused.py): the KV ring, the Engram
value ring and the lanes are held in that dtype, as a 16-bit decode body keeps them; the final
hidden row and the logits stay float32 buffers (holding the rounded values).
"""
from __future__ import annotations

import torch


class StateError(ValueError):
    """A request the state cannot honour (names the value and the limit); state untouched."""


class V2State:
    def __init__(self, cfg, ring: int, window: int, device="cpu", dtype=torch.float32,
                 act_dtype=None):
        if ring < 1 or ring > cfg.max_seq_len:
            raise StateError(f"ring={ring} must lie in 1..max_seq_len={cfg.max_seq_len}")
        self.cfg = cfg
        self.ring = ring
        self.window = 0
        self._set_window(window)
        L, KV, hd, d, n = cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, cfg.d_model, cfg.mhc_lanes
        act = dtype if act_dtype is None else act_dtype
        self.k = torch.zeros(L, KV, ring, hd, device=device, dtype=act)
        self.v = torch.zeros(L, KV, ring, hd, device=device, dtype=act)
        # Taps reach (taps-1)*dilation back; one more slot for the current position.
        self.engram_ring = (cfg.engram_taps - 1) * cfg.engram_dilation + 1
        self.vraw = torch.zeros(cfg.num_sites, self.engram_ring, d, device=device, dtype=act)
        self.lanes = torch.zeros(n, d, device=device, dtype=act)
        self.hidden = torch.zeros(d, device=device, dtype=dtype)      # post-final-norm vector
        self.logits = torch.zeros(cfg.vocab_size, device=device, dtype=dtype)
        self.tokens: list = []
        self.valid: list = []               # per position: counts as a key / Engram source
        self.key_ok = torch.ones(ring, dtype=torch.bool, device=device)
        self.pad_aware = False              # probe heads: pad tokens are not valid
        self.device = torch.device(device)

    @property
    def pos(self) -> int:
        """The position the next token will occupy."""
        return len(self.tokens)

    def history(self) -> list:
        """Every token fed so far, in order."""
        return list(self.tokens)

    def _set_window(self, window: int):
        if window < 0:
            raise StateError(f"kv_window={window} must be >= 0")
        if window == 0 and self.ring < self.cfg.max_seq_len:
            raise StateError(f"kv_window=0 (full causal) needs a ring of max_seq_len="
                             f"{self.cfg.max_seq_len} slots; this state has {self.ring}")
        if window > self.ring:
            raise StateError(f"kv_window={window} is wider than the ring ({self.ring} slots): "
                             f"it would read slots already overwritten")
        self.window = window

    def set_kv_window(self, window: int, model=None):
        """Attend to the `window` most recent positions (0: all). Refuses windows the ring
        cannot hold."""
        if model is not None and model.cfg is not self.cfg and model.cfg != self.cfg:
            raise StateError("state belongs to a model of another geometry")
        self._set_window(int(window))

    def attn_runtime(self, model):
        """This state's attention runtime (port/attn.py), remade when the backend or the
        window width changes."""
        rt = self.__dict__.get("_attn")
        if rt is None or rt.model is not model or rt.idx_win.shape[0] != max(self.window, 1):
            from .attn import AttnRuntime
            rt = self._attn = AttnRuntime(model, self)
        return rt

    def decode_graph(self, model):
        """This state's prep/body pair (port/graph.py), made on first use."""
        g = self.__dict__.get("_graph")
        if g is None or g.model is not model or g.window != self.window:
            from .graph import DecodeGraph
            g = self._graph = DecodeGraph(model, self)
        return g

    def clone(self) -> "V2State":
        other = V2State.__new__(V2State)
        for k, v in self.__dict__.items():
            if k in ("_graph", "_attn", "_native"):    # buffers bound to the original state
                continue
            other.__dict__[k] = v.clone() if isinstance(v, torch.Tensor) else \
                (list(v) if isinstance(v, list) else v)
        return other

    def reset(self):
        self.tokens.clear()
        self.valid.clear()
        self.key_ok.fill_(True)
        for t in (self.k, self.v, self.vraw, self.lanes, self.hidden, self.logits):
            t.zero_()
