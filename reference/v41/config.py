"""DeepSeek-V4.1 attention geometry (attn_v41 spec §1, §2.1): the official `ModelArgs` fields the
attention reads, the checks the runtime makes at construction, and each layer's role.

Geometry only, no math: both reference/v41/attn.py and port/v41/attn.py read it, as they read
reference/config.py for needle v2. Field names are the official ones (the official `ModelArgs`
takes its inference config.json keys as they are); any other field of the object or dict handed
in is ignored.

Layers follow the official model: `n_layers` backbone blocks, block i taking
`compress_ratios[i]`. Entries past `n_layers` belong to the MTP (DSpark draft) layers
`n_layers .. n_layers + n_mtp_layers - 1`; only backbone layers are ever kv or index sources
(official `is_backbone`), so source-list entries outside the backbone are ignored as the
official code ignores them. `mtp_layers_present` decides which MTP layers a runtime builds.
"""
from __future__ import annotations

import math
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
MAX_INT = 2 ** 31 - 1   # every integer field (sizes, positions, layer numbers) fits an int32
MAX_LIST = 4096         # entries of a per-layer list
# integer fields and their lower bound (the >= 1 ones are re-said below with their reasons)
_INT_FIELDS = {"dim": 1, "n_heads": 1, "head_dim": 1, "rope_head_dim": 1, "q_lora_rank": 1,
               "o_groups": 1, "o_lora_rank": 1, "window_size": 1,
               "candidate_source_layer": -MAX_INT, "candidate_topk_blocks": 0,
               "candidate_block_size": 0, "index_n_heads": 1, "index_head_dim": 1,
               "index_topk": 0, "original_seq_len": 0, "max_seq_len": 1, "n_layers": 1,
               "n_mtp_layers": 0}
# number fields: (bound, strict). A RoPE base must exceed 1 (YaRN divides by log(base)); the
# YaRN betas are rotation counts, > 0 (it takes log(original_seq_len / beta))
_NUMBER_FIELDS = {"rope_theta": (1, True), "compress_rope_theta": (1, True),
                  "rope_factor": (0, True), "beta_fast": (0, True), "beta_slow": (0, True),
                  "norm_eps": (0, False)}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def short_repr(v) -> str:
    """repr(v), cut to 80 characters (a hostile value may be a long list); lone surrogates from
    a JSON escape are shown escaped by repr already."""
    r = repr(v)
    return r if len(r) <= 80 else r[:77] + "..."
# fields the official ModelArgs defaults that only decide the MTP layers, not the backbone
OFFICIAL_DEFAULTS = {"n_mtp_layers": 1}
MTP_ATTN_NAMES = ("attn_sink", "wq_a.weight", "q_norm.weight", "wq_b.weight", "wkv.weight",
                  "kv_norm.weight", "wo_a.weight", "wo_b.weight")


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
    n_layers: int
    # official default; the MTP layers only exist in a runtime when their weights are given
    n_mtp_layers: int = 1

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
            if v is absent and f.name in OFFICIAL_DEFAULTS:
                v = OFFICIAL_DEFAULTS[f.name]
            if v is absent:
                raise V41ConfigError(f"args lack the field {f.name!r} (every one of "
                                     f"{len(fields(cls))} ModelArgs fields the attention reads "
                                     f"is required; none is defaulted)")
            if f.name in _TUPLE_FIELDS:
                # strict: a string would iterate its characters, a float would truncate
                if not (isinstance(v, (list, tuple)) and len(v) <= MAX_LIST
                        and all(_is_int(x) and abs(x) <= MAX_INT for x in v)):
                    raise V41ConfigError(f"{f.name}={short_repr(v)} must be a sequence of at most "
                                         f"{MAX_LIST} integers in -{MAX_INT}..{MAX_INT}")
                v = tuple(v)
            vals[f.name] = v
        return cls(**vals)

    def __post_init__(self):
        def need(cond, what):
            if not cond:
                raise V41ConfigError(what)
        for name in ("dim", "n_heads", "head_dim", "rope_head_dim", "q_lora_rank", "o_groups",
                     "o_lora_rank", "window_size", "index_n_heads", "index_head_dim",
                     "max_seq_len", "n_layers"):
            v = getattr(self, name)
            need(isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                 f"{name}={v!r} must be an integer >= 1")
        m = self.n_mtp_layers
        need(isinstance(m, int) and not isinstance(m, bool) and m >= 0,
             f"n_mtp_layers={short_repr(m)} must be an integer >= 0")
        # every layer, backbone or MTP, is one compress_ratios entry, and that list holds at
        # most MAX_LIST: a count past it names layers no config can describe, and the loops
        # over the layers and MTP stages (weights checked, stages built) would run that long
        need(self.n_layers <= MAX_LIST,
             f"n_layers={short_repr(self.n_layers)} outside 1..{MAX_LIST}: one compress_ratios "
             f"entry per layer, and that list holds at most {MAX_LIST}")
        need(self.n_layers + m <= MAX_LIST,
             f"n_mtp_layers={m} outside 0..{max(0, MAX_LIST - self.n_layers)}: n_layers + "
             f"n_mtp_layers = {self.n_layers + m} exceeds {MAX_LIST}, the most layers "
             f"compress_ratios can describe")
        # types and ranges of the rest (and upper bounds): the checks below and every table
        # size may then rely on them
        for name, lo in _INT_FIELDS.items():
            v = getattr(self, name)
            need(_is_int(v) and lo <= v <= MAX_INT,
                 f"{name}={short_repr(v)} ({type(v).__name__}) must be an integer in "
                 f"{lo}..{MAX_INT}")
        for name, (lo, strict) in _NUMBER_FIELDS.items():
            v = getattr(self, name)
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and \
                math.isfinite(v) and (v > lo if strict else v >= lo) and abs(v) <= 1e30
            need(ok, f"{name}={short_repr(v)} ({type(v).__name__}) must be a finite number "
                     f"{'>' if strict else '>='} {lo} (at most 1e30)")
        for name in _TUPLE_FIELDS:
            v = getattr(self, name)
            need(isinstance(v, tuple) and len(v) <= MAX_LIST
                 and all(_is_int(x) and abs(x) <= MAX_INT for x in v),
                 f"{name}={short_repr(v)} must be a sequence of at most {MAX_LIST} integers in "
                 f"-{MAX_INT}..{MAX_INT}")
        # YaRN (official precompute_freqs_cis) takes log(original_seq_len / beta); a frequency
        # f_k <= 1 turns at most original_seq_len / 2pi times over the original context, so a
        # rotation count past original_seq_len is none the table has, and the band runs from
        # beta_fast's dimension down to beta_slow's
        need(self.original_seq_len >= 1,
             f"original_seq_len={self.original_seq_len} outside 1..{MAX_INT} (YaRN divides the "
             f"original context by the betas and takes its log)")
        need(self.beta_slow <= self.beta_fast <= self.original_seq_len,
             f"beta_slow={short_repr(self.beta_slow)}, beta_fast={short_repr(self.beta_fast)}: "
             f"need 0 < beta_slow <= beta_fast <= original_seq_len={self.original_seq_len} "
             f"(YaRN rotation counts over the original context)")
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
        big = next((i for i, r in enumerate(self.compress_ratios) if r > self.max_seq_len), None)
        # a block longer than the sequence never completes, and its compressor's state holds
        # `ratio` rows
        need(big is None, f"compress_ratios[{big}]={self.compress_ratios[big] if big is not None else 0}"
                          f" outside 0..max_seq_len={self.max_seq_len} (a compression block "
                          f"cannot be longer than the sequence)")
        n = self.n_layers
        # the official Block takes compress_ratios[layer_id] for every backbone layer
        need(len(self.compress_ratios) >= n,
             f"compress_ratios has {len(self.compress_ratios)} entries; n_layers={n} needs one "
             f"per backbone layer (entries past n_layers belong to MTP layers)")
        for name in ("kv_source_layers", "index_source_layers"):
            for i in getattr(self, name):
                # official Compressor/Indexer size caches by max_seq_len // ratio
                need(not 0 <= i < n or self.compress_ratios[i] > 0,
                     f"{name} holds layer {i}, a ratio-0 layer (its caches would hold "
                     f"max_seq_len // 0 rows)")
        c = self.candidate_source_layer
        if 0 <= c < n:
            need(c in self.index_source_layers,
                 f"candidate_source_layer={c} is not an index source {self.index_source_layers}")
            need(self.candidate_topk_blocks >= 1 and self.candidate_block_size >= 1,
                 f"candidate_topk_blocks={self.candidate_topk_blocks} and "
                 f"candidate_block_size={self.candidate_block_size} must be >= 1")
            for i in self.index_sources:
                need(i <= c or self.compress_ratios[i] == self.compress_ratios[c],
                     f"layer {i} uses layer {c}'s candidates but its ratio "
                     f"{self.compress_ratios[i]} differs from {self.compress_ratios[c]}")
        need(self.window_size + self.index_topk <= MAX_SELECTION or
             not any(self.ratios),
             f"window_size + index_topk = {self.window_size + self.index_topk} exceeds "
             f"{MAX_SELECTION}")
        for i, r in enumerate(self.ratios):
            if r and i not in self.kv_sources:
                need(any(s < i for s in self.kv_sources),
                     f"layer {i} (ratio {r}) reads a compressed cache no earlier kv source "
                     f"publishes")

    @property
    def ratios(self) -> tuple:
        """The backbone layers' ratios (compress_ratios[:n_layers])."""
        return self.compress_ratios[:self.n_layers]

    @property
    def kv_sources(self) -> tuple:
        """kv_source_layers inside the backbone (the official code ignores the rest)."""
        return tuple(i for i in self.kv_source_layers if 0 <= i < self.n_layers)

    @property
    def index_sources(self) -> tuple:
        return tuple(i for i in self.index_source_layers if 0 <= i < self.n_layers)

    @property
    def candidate_source(self) -> int:
        """candidate_source_layer, or -1 when it names no backbone layer (filter off)."""
        c = self.candidate_source_layer
        return c if 0 <= c < self.n_layers else -1

    @property
    def group_width(self) -> int:
        return self.n_heads * self.head_dim // self.o_groups

    def role(self, layer: int) -> LayerRole:
        if not 0 <= layer < self.n_layers:
            raise V41ConfigError(f"layer={layer} outside 0..{self.n_layers - 1}")
        c = self.candidate_source
        return LayerRole(ratio=self.compress_ratios[layer],
                         is_kv_source=layer in self.kv_sources,
                         is_index_source=layer in self.index_sources,
                         is_candidate_source=layer == c,
                         uses_candidates=0 <= c < layer and layer in self.index_sources)

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


def mtp_weight_names(mtp: int) -> list:
    """The attention parameters of MTP stage `mtp` (official `mtp.{k}.attn.*`: a window-only
    DSpark attention, no compressor or indexer)."""
    return [f"mtp.{mtp}.attn.{n}" for n in MTP_ATTN_NAMES]


def mtp_layers_present(args: V41Args, weights) -> list:
    """The MTP stages a runtime builds: those of 0..n_mtp_layers-1 whose attention weights are
    all given (none given: the stage is ignored, as the official model ignores it without
    `dspark_block_size`). A stage built must have its compress_ratios entry, and it must be 0
    (the official DSparkAttention asserts it); a stage given only part of its weights is
    refused, naming the first one missing."""
    built = []
    for k in range(args.n_mtp_layers):
        names = mtp_weight_names(k)
        have = [n in weights for n in names]
        if not any(have):
            continue
        if not all(have):
            missing = names[have.index(False)]
            raise V41ConfigError(f"weights lack {missing!r} (MTP layer {args.n_layers + k} "
                                 f"has some of its attention weights but not all)")
        i = args.n_layers + k
        if i >= len(args.compress_ratios):
            raise V41ConfigError(f"MTP layer {i} has weights but compress_ratios has "
                                 f"{len(args.compress_ratios)} entries (needs n_layers + "
                                 f"n_mtp_layers = {args.n_layers + args.n_mtp_layers})")
        if args.compress_ratios[i]:
            raise V41ConfigError(f"MTP layer {i}: compress_ratios[{i}]="
                                 f"{args.compress_ratios[i]} must be 0 (DSpark attention is "
                                 f"window-only)")
        built.append(k)
    return built


def forward_call_problem(args: V41Args, layer, x, start_pos: int, max_tokens: int):
    """Why `forward(layer, x, start_pos)` cannot run on this geometry (naming the value and
    the limit), or None. Both the reference and the port refuse with it before any write."""
    if not isinstance(layer, int) or not 0 <= layer < args.n_layers:
        mtp = (f" (layers {args.n_layers}.. are MTP layers: DSpark attention, not run here)"
               if isinstance(layer, int) and layer >= args.n_layers and args.n_mtp_layers else "")
        return f"layer={layer!r} outside 0..{args.n_layers - 1}{mtp}"
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
