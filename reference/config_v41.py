"""DeepSeek-V4.1 attention geometry (attn_v41 spec §1, §2.1): the official `ModelArgs` fields the
attention reads, the checks the runtime makes at construction, and each layer's role.

Geometry only, no math: both reference/attn_v41.py and port/attn_v41.py read it, as they read
reference/config.py for needle v2. Field names are the official ones; any other field of the
object or dict handed in is ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

FP8_BLOCK = 32          # window kv fp8 round trip (spec §3.4)
FP4_INDEX_BLOCK = 32    # indexer q / keys, e8m0 scales (spec §3.5)
FP4_LATENT_BLOCK = 16   # compressed latents, e4m3 scales (spec §3.5)
MAX_SELECTION = 2048    # the widest selection a decode step may launch (spec §2.3)


class V41ConfigError(ValueError):
    """A V4.1 geometry the runtime cannot run (names the field, its value and the limit)."""


@dataclass(frozen=True)
class LayerRole:
    ratio: int
    is_kv_source: bool
    is_index_source: bool
    is_candidate_source: bool
    uses_candidates: bool


_TUPLE_FIELDS = ("compress_ratios", "kv_source_layers", "index_source_layers")


@dataclass(frozen=True)
class V41Args:
    """Every field is required: a geometry read from a checkpoint's config must say each value
    (a silently filled default would run some other model). The tiny fixture model's values live
    in tests/fixtures/attn_v41_official.json ("model_args")."""
    dim: int
    n_heads: int
    head_dim: int
    rope_head_dim: int
    q_lora_rank: int
    o_groups: int
    o_lora_rank: int
    window_size: int
    compress_ratios: tuple
    kv_source_layers: tuple
    index_source_layers: tuple
    candidate_source_layer: int
    candidate_topk_blocks: int
    candidate_block_size: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    rope_theta: float
    compress_rope_theta: float
    rope_factor: float
    original_seq_len: int
    beta_fast: int
    beta_slow: int
    norm_eps: float
    max_seq_len: int

    @classmethod
    def from_any(cls, args) -> "V41Args":
        """From a V41Args, an official ModelArgs (or any object with those attributes) or a dict.
        Fields this attention does not read (vocab_size, moe_*, hc_*, dtype, ...) are ignored;
        a missing field the attention reads is refused, naming it."""
        if isinstance(args, cls):
            return args
        absent = object()
        if isinstance(args, dict):
            def get(name):
                return args.get(name, absent)
        else:
            def get(name):
                return getattr(args, name, absent)
        vals = {}
        for f in fields(cls):
            v = get(f.name)
            if v is absent:
                raise V41ConfigError(f"args lack the field {f.name!r} (every one of "
                                     f"{len(fields(cls))} ModelArgs fields the attention reads "
                                     f"is required; none is defaulted)")
            if f.name in _TUPLE_FIELDS:
                try:
                    v = tuple(int(x) for x in v)
                except (TypeError, ValueError):
                    raise V41ConfigError(f"{f.name}={v!r} must be a sequence of integers") \
                        from None
            vals[f.name] = v
        return cls(**vals)

    def __post_init__(self):
        def need(cond, what):
            if not cond:
                raise V41ConfigError(what)
        for name in ("dim", "n_heads", "head_dim", "rope_head_dim", "q_lora_rank", "o_groups",
                     "o_lora_rank", "window_size", "index_n_heads", "index_head_dim",
                     "max_seq_len"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                 f"{name}={v!r} must be an integer >= 1")
        rd = self.rope_head_dim
        need(rd % 2 == 0 and rd // 2 <= 256, f"rope_head_dim={rd} must be even and <= 512")
        need(rd <= self.head_dim and rd <= self.index_head_dim,
             f"rope_head_dim={rd} exceeds head_dim={self.head_dim} or "
             f"index_head_dim={self.index_head_dim}")
        need(self.head_dim % FP8_BLOCK == 0,
             f"head_dim={self.head_dim} must be a multiple of {FP8_BLOCK} (fp8 block)")
        need(self.index_head_dim % FP4_INDEX_BLOCK == 0,
             f"index_head_dim={self.index_head_dim} must be a multiple of {FP4_INDEX_BLOCK}")
        need((self.n_heads * self.head_dim) % self.o_groups == 0,
             f"n_heads*head_dim={self.n_heads * self.head_dim} not divisible by "
             f"o_groups={self.o_groups}")
        need(self.n_heads % self.o_groups == 0,
             f"n_heads={self.n_heads} not divisible by o_groups={self.o_groups}")
        need(all(r >= 0 for r in self.compress_ratios),
             f"compress_ratios={self.compress_ratios} must be >= 0")
        n = len(self.compress_ratios)
        need(n >= 1, "compress_ratios is empty: no layers")
        for name in ("kv_source_layers", "index_source_layers"):
            for i in getattr(self, name):
                need(0 <= i < n and self.compress_ratios[i] > 0,
                     f"{name} holds layer {i}: outside 0..{n - 1} or a ratio-0 layer")
        c = self.candidate_source_layer
        if c >= 0:
            need(c in self.index_source_layers,
                 f"candidate_source_layer={c} is not an index source {self.index_source_layers}")
            need(self.candidate_topk_blocks >= 1 and self.candidate_block_size >= 1,
                 f"candidate_topk_blocks={self.candidate_topk_blocks} and "
                 f"candidate_block_size={self.candidate_block_size} must be >= 1")
            for i in self.index_source_layers:
                need(i <= c or self.compress_ratios[i] == self.compress_ratios[c],
                     f"layer {i} uses layer {c}'s candidates but its ratio "
                     f"{self.compress_ratios[i]} differs from {self.compress_ratios[c]}")
        need(self.window_size + self.index_topk <= MAX_SELECTION or
             not any(self.compress_ratios),
             f"window_size + index_topk = {self.window_size + self.index_topk} exceeds "
             f"{MAX_SELECTION}")
        for i, r in enumerate(self.compress_ratios):
            if r and i not in self.kv_source_layers:
                need(any(s < i for s in self.kv_source_layers),
                     f"layer {i} (ratio {r}) reads a compressed cache no earlier kv source "
                     f"publishes")

    @property
    def n_layers(self) -> int:
        return len(self.compress_ratios)

    @property
    def group_width(self) -> int:
        return self.n_heads * self.head_dim // self.o_groups

    def role(self, layer: int) -> LayerRole:
        if not 0 <= layer < self.n_layers:
            raise V41ConfigError(f"layer={layer} outside 0..{self.n_layers - 1}")
        c = self.candidate_source_layer
        return LayerRole(ratio=self.compress_ratios[layer],
                         is_kv_source=layer in self.kv_source_layers,
                         is_index_source=layer in self.index_source_layers,
                         is_candidate_source=layer == c,
                         uses_candidates=0 <= c < layer and layer in self.index_source_layers)

    def to_dict(self) -> dict:
        return {f.name: (list(getattr(self, f.name)) if f.name in _TUPLE_FIELDS
                         else getattr(self, f.name)) for f in fields(self)}


def weight_names(args: V41Args, layer: int) -> list:
    """The official parameter names one layer's attention reads (spec §2.1 table)."""
    role = args.role(layer)
    p = f"layers.{layer}.attn."
    names = [p + n for n in ("attn_sink", "wq_a.weight", "q_norm.weight", "wq_b.weight",
                             "wkv.weight", "kv_norm.weight", "wo_a.weight", "wo_b.weight")]
    if role.is_kv_source:
        names += [p + "compressor.wkv.weight", p + "compressor.norm.weight"]
        if role.ratio > 1:
            names.append(p + "compressor.wgate.weight")
    if role.is_index_source:
        names += [p + "indexer.wq_b.weight", p + "indexer.weights_proj.weight"]
        if role.is_kv_source:
            names += [p + "indexer.wk.weight", p + "indexer.k_norm.weight"]
    return names


def forward_call_problem(args: V41Args, layer, x, start_pos: int, max_tokens: int):
    """Why `forward(layer, x, start_pos)` cannot run on this geometry (naming the value and
    the limit), or None. Both the reference and the port refuse with it before any write."""
    if not isinstance(layer, int) or not 0 <= layer < args.n_layers:
        return f"layer={layer!r} outside 0..{args.n_layers - 1}"
    if x.dim() != 2 or x.shape[1] != args.dim or str(x.dtype) != "torch.bfloat16":
        return f"x must be bf16 [m, dim={args.dim}], got {x.dtype} {list(x.shape)}"
    m = x.shape[0]
    if not 1 <= m <= max_tokens:
        return f"m={m} tokens outside 1..max_tokens={max_tokens}"
    if start_pos < 0 or start_pos + m > args.max_seq_len:
        return (f"positions {start_pos}..{start_pos + m - 1} outside "
                f"0..max_seq_len-1={args.max_seq_len - 1}")
    if start_pos > 0 and m != 1:
        return f"start_pos={start_pos} > 0 takes one token (a decode step), got m={m}"
    return None
