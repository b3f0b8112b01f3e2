"""The V4.1 runtime's objects besides the runtime itself (attn_v41 spec §2, the seed's split):

  LayerWeightsV41  one layer's official parameters and its role; built once per model
  LayerStateV41    one layer's per-sequence buffers: the window ring, and on kv sources the
                   compressed cache, the index key cache (index sources too) and the tokens of
                   a group still filling (ratio > 1)
  SharedV41        what sources publish to the layers after them within a sequence: the
                   compressed cache, the index keys, the selection and the candidate filter
  SequenceV41      one sequence: a LayerStateV41 per layer and its SharedV41

One runtime (port/v41/attn.py's AttnV41) serves any number of SequenceV41: everything a
sequence writes lives in its own objects, so sequences can be interleaved call by call.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference.v41.config import LayerRole, V41Args

PUBLISHED = ("compress_kv", "index_k", "topk_idxs", "candidates")


@dataclass
class LayerWeightsV41:
    layer: int
    role: LayerRole
    w: dict                      # name under "layers.{i}.attn." -> tensor on the device


class SharedV41(dict):
    """The four published slots (None until a source publishes); no other key is accepted."""

    def __init__(self, **published):
        super().__init__({k: None for k in PUBLISHED})
        for k, v in published.items():
            self[k] = v

    def __setitem__(self, key, value):
        if key not in PUBLISHED:
            raise KeyError(f"SharedV41 holds {PUBLISHED}; not {key!r}")
        super().__setitem__(key, value)


class LayerStateV41:
    def __init__(self, args: V41Args, role: LayerRole, dev):
        bf, f32 = torch.bfloat16, torch.float32
        self.ring = torch.zeros(args.window_size, args.head_dim, dtype=bf, device=dev)
        self.cache = self.kcache = self.kv_state = self.score_state = None
        if role.is_kv_source:
            rows = args.max_seq_len // role.ratio
            self.cache = torch.zeros(rows, args.head_dim, dtype=bf, device=dev)
            if role.is_index_source:
                self.kcache = torch.zeros(rows, args.index_head_dim, dtype=bf, device=dev)
            if role.ratio > 1:
                self.kv_state = torch.zeros(role.ratio, args.head_dim, dtype=f32, device=dev)
                self.score_state = torch.empty_like(self.kv_state)
        self.reset()

    def reset(self) -> None:
        """In place, so pointers a captured graph baked stay valid."""
        for t in (self.ring, self.cache, self.kcache, self.kv_state):
            if t is not None:
                t.zero_()
        if self.score_state is not None:
            self.score_state.fill_(-torch.inf)     # an empty slot weighs nothing in the pool


class SequenceV41:
    def __init__(self, args: V41Args, dev):
        self.layers = [LayerStateV41(args, args.role(i), dev) for i in range(args.n_layers)]
        self.shared = SharedV41()

    def reset(self) -> None:
        for st in self.layers:
            st.reset()
        self.shared = SharedV41()

    def by_layer(self, name: str) -> dict:
        """{layer: buffer} for the layers that hold `name` (cache, kcache, kv_state, ...)."""
        return {i: getattr(st, name) for i, st in enumerate(self.layers)
                if getattr(st, name) is not None}
