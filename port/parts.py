"""The model's weights as typed parts (after the seed's V2Model): the tied embedding, one
V2Layer per layer, the stack's mHC router (V2Mhc), one V2Engram per Engram site, and the final
norm. Every implementation (the eager step, the graph body, the C step's binding, planted
faults, locate's injection) reads these same parts.

A matrix is held in one of three forms, the same for the whole model:
- "dense":   float32 [in, out], so that `x @ w` is the product (views of row-major [out, in]);
- "rotated": the Cactus-Quants codes' pre-rotation rows, [in_pad, out]: every product first
             zero-pads its input to whole 128-groups and rotates it (the torch cq path). A cq
             model also keeps the codes beside the rows (`attach_codes`, checked alike): the
             triton backend's fused decode body streams those instead of the rows;
- "packed":  the codes as stored (CqWeight in `codes`), the matrix fields None: the C step
             computes on them directly and no float32 copy stays resident.

`check_parts` validates every shape (and float32) against the config and names the part that is
wrong.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from reference.config import V2Config
from .cq import GROUP, CqWeight

FORMS = ("dense", "rotated", "packed")


class PartError(ValueError):
    """A weight part that does not fit the config (names the part, expected and given)."""


@dataclass
class Embedding:
    table: torch.Tensor | None        # [vocab, d] float32: the token lookup (and dense LM head)
    head: torch.Tensor | None = None  # [d_pad, vocab]: the rotated LM head ("rotated" form)
    codes: CqWeight | None = None     # "packed": the stored codes (table and head are None)


@dataclass
class V2Layer:
    """One layer's own weights. Matrices per the model's form; vectors float32."""
    qkvg: torch.Tensor | None         # [in, attn | kv | kv | attn]: q, k, v, gate in one product
    out: torch.Tensor | None          # [in, d]: the attention output projection
    q_norm: torch.Tensor              # [hd]
    k_norm: torch.Tensor              # [hd]
    pre_norm: torch.Tensor            # [d] the ZC norm before attention
    post_norm: torch.Tensor           # [d] after attention
    pre_hada_norm: torch.Tensor       # [d] before the Hadamard MLP
    attn_gate: torch.Tensor           # [] sigmoid(attn_gate), applied once at load
    d1: torch.Tensor                  # [hada_n] the Hadamard MLP's diagonals
    d2: torch.Tensor
    d3: torch.Tensor
    codes: dict | None = None         # "packed": q_proj, k_proj, v_proj, gate_proj, out_proj


@dataclass
class V2Mhc:
    """The stack's mHC router, per layer on the leading axis."""
    router: torch.Tensor | None       # [L, in, 2n + n²]: pre | post | res logits in one product
    a_pre: torch.Tensor               # [L]
    a_post: torch.Tensor              # [L]
    a_res: torch.Tensor               # [L]
    pre_bias: torch.Tensor            # [L, n] with the lane offsets folded in
    post_bias: torch.Tensor           # [L, n] with the lane offsets folded in
    b_res: torch.Tensor               # [L, n, n]
    codes: dict | None = None         # "packed": pre, post, res (rows (layer, k))


@dataclass
class V2Engram:
    """One Engram site."""
    tables: torch.Tensor | None       # [tables * slots, sub]
    kv: torch.Tensor | None           # [in, 2d]: key | value in one product
    taps: torch.Tensor                # [taps, d]
    codes: dict | None = None         # "packed": tables, key_proj, value_proj


def part_tensors(part, path: str):
    """(path, tensor) of every tensor a part holds, codes included."""
    for f in fields(part):
        v = getattr(part, f.name)
        if isinstance(v, torch.Tensor):
            yield f"{path}.{f.name}", v
        elif isinstance(v, CqWeight):
            yield from _code_tensors(v, f"{path}.{f.name}")
        elif isinstance(v, dict):
            for k, cw in v.items():
                yield from _code_tensors(cw, f"{path}.{f.name}[{k}]")


def model_tensors(model):
    """(path, tensor) of every tensor a V2Model holds: parts, heads, RoPE and Walsh tables."""
    yield from part_tensors(model.embedding, "embedding")
    for i, lw in enumerate(model.layers):
        yield from part_tensors(lw, f"layers[{i}]")
    yield from part_tensors(model.mhc, "mhc")
    for s, site in enumerate(model.engrams):
        yield from part_tensors(site, f"engrams[{s}]")
    yield "final_norm", model.final_norm
    yield from ((f"heads[{k}]", v) for k, v in model.heads.items())
    yield from (("walsh", model.walsh), ("cos", model.cos), ("sin", model.sin))


def _code_tensors(cw: CqWeight, path):
    for name in ("packed", "norms", "rows"):
        if isinstance(getattr(cw, name, None), torch.Tensor):
            yield f"{path}.{name}", getattr(cw, name)


def form_of(embedding: Embedding) -> str:
    if embedding.codes is not None and embedding.table is None:
        return "packed"
    return "rotated" if embedding.head is not None else "dense"


def check_parts(cfg: V2Config, embedding, layers, mhc, engrams, final_norm) -> str:
    """Every part's type and shape against `cfg`; returns the weight form. Raises PartError
    naming the first part that is wrong, with the expected and the given shape."""
    L, n, d, hd = cfg.num_layers, cfg.mhc_lanes, cfg.d_model, cfg.head_dim
    attn, kv = cfg.attn_dim_eff, cfg.kv_dim
    if not isinstance(embedding, Embedding):
        raise PartError(f"embedding: expected an Embedding, given {type(embedding).__name__}")
    form = form_of(embedding)
    packed = form == "packed"
    inner = (lambda k: -(-k // GROUP) * GROUP) if form == "rotated" else (lambda k: k)

    def shape(name, t, want):
        if not isinstance(t, torch.Tensor):
            raise PartError(f"{name}: expected a tensor {list(want)}, given {type(t).__name__}")
        if tuple(t.shape) != tuple(want):
            raise PartError(f"{name}: expected shape {list(want)}, given {list(t.shape)}")
        if t.dtype != torch.float32:
            raise PartError(f"{name}: expected float32, given {t.dtype}")

    def matrix(name, t, k, out):
        if packed:
            if t is not None:
                raise PartError(f"{name}: the packed form keeps only the codes, given a "
                                f"tensor {list(t.shape)}")
        else:
            shape(name, t, (inner(k), out))

    def codes(name, cw, out, k):
        if not isinstance(cw, CqWeight):
            raise PartError(f"{name}: expected a CqWeight [{out}, {k}], given "
                            f"{type(cw).__name__}")
        if (cw.out_features, cw.in_features) != (out, k):
            raise PartError(f"{name}: expected codes [{out}, {k}], given "
                            f"[{cw.out_features}, {cw.in_features}]")

    def code_set(name, got, want: dict):
        if not isinstance(got, dict) or set(got) != set(want):
            raise PartError(f"{name}: expected codes {sorted(want)}, given "
                            f"{sorted(got) if isinstance(got, dict) else type(got).__name__}")
        for k, (out, inn) in want.items():
            codes(f"{name}[{k}]", got[k], out, inn)

    if packed:
        if embedding.table is not None or embedding.head is not None:
            raise PartError("embedding: the packed form keeps only the codes (table and head "
                            "must be None)")
        codes("embedding.codes", embedding.codes, cfg.vocab_size, d)
    else:
        shape("embedding.table", embedding.table, (cfg.vocab_size, d))
        if form == "rotated":
            shape("embedding.head", embedding.head, (inner(d), cfg.vocab_size))
        elif embedding.codes is not None:
            raise PartError("embedding.codes: only the rotated (cq) and packed forms keep codes")
    # the rotated form may keep its codes beside the rows (attach_codes): checked alike
    with_codes = packed or embedding.codes is not None
    if with_codes and not packed:
        codes("embedding.codes", embedding.codes, cfg.vocab_size, d)
    if not isinstance(layers, (list, tuple)) or len(layers) != L:
        raise PartError(f"layers: expected {L} V2Layer, given "
                        f"{len(layers) if isinstance(layers, (list, tuple)) else layers!r}")
    for i, lw in enumerate(layers):
        p = f"layers[{i}]"
        if not isinstance(lw, V2Layer):
            raise PartError(f"{p}: expected a V2Layer, given {type(lw).__name__}")
        matrix(f"{p}.qkvg", lw.qkvg, d, 2 * attn + 2 * kv)
        matrix(f"{p}.out", lw.out, attn, d)
        for name, want in (("q_norm", (hd,)), ("k_norm", (hd,)), ("pre_norm", (d,)),
                           ("post_norm", (d,)), ("pre_hada_norm", (d,)), ("attn_gate", ()),
                           ("d1", (cfg.hada_n,)), ("d2", (cfg.hada_n,)),
                           ("d3", (cfg.hada_n,))):
            shape(f"{p}.{name}", getattr(lw, name), want)
        if with_codes:
            code_set(f"{p}.codes", lw.codes, {"q_proj": (attn, d), "k_proj": (kv, d),
                                              "v_proj": (kv, d), "gate_proj": (attn, d),
                                              "out_proj": (d, attn)})
    if not isinstance(mhc, V2Mhc):
        raise PartError(f"mhc: expected a V2Mhc, given {type(mhc).__name__}")
    if with_codes:
        code_set("mhc.codes", mhc.codes, {"pre": (L * n, n * d), "post": (L * n, n * d),
                                          "res": (L * n * n, n * d)})
    if packed:
        matrix("mhc.router", mhc.router, 0, 0)
    else:
        shape("mhc.router", mhc.router, (L, inner(n * d), 2 * n + n * n))
    for name, want in (("a_pre", (L,)), ("a_post", (L,)), ("a_res", (L,)),
                       ("pre_bias", (L, n)), ("post_bias", (L, n)), ("b_res", (L, n, n))):
        shape(f"mhc.{name}", getattr(mhc, name), want)
    if not isinstance(engrams, (list, tuple)) or len(engrams) != cfg.num_sites:
        raise PartError(f"engrams: expected {cfg.num_sites} V2Engram (one per site), given "
                        f"{len(engrams) if isinstance(engrams, (list, tuple)) else engrams!r}")
    rows = cfg.engram_tables * cfg.engram_slots
    for s, site in enumerate(engrams):
        p = f"engrams[{s}]"
        if not isinstance(site, V2Engram):
            raise PartError(f"{p}: expected a V2Engram, given {type(site).__name__}")
        if with_codes:
            code_set(f"{p}.codes", site.codes, {
                "tables": (rows, cfg.engram_sub), "key_proj": (d, cfg.engram_fetched),
                "value_proj": (d, cfg.engram_fetched)})
        if packed:
            matrix(f"{p}.tables", site.tables, 0, 0)
        else:
            shape(f"{p}.tables", site.tables, (rows, cfg.engram_sub))
        matrix(f"{p}.kv", site.kv, cfg.engram_fetched, 2 * d)
        shape(f"{p}.taps", site.taps, (cfg.engram_taps, d))
    shape("final_norm", final_norm, (d,))
    return form


def parts_from_weights(w: dict, cfg: V2Config):
    """The parts over prepare_weights' tensors (views: nothing is copied)."""
    rotated = w["rotate"]
    layers = [V2Layer(qkvg=w["qkvg_t"][i], out=w["out_t"][i], q_norm=w["qn"][i],
                      k_norm=w["kn"][i], pre_norm=w["pre"][i], post_norm=w["post"][i],
                      pre_hada_norm=w["pre_hada"][i], attn_gate=w["attn_gate"][i],
                      d1=w["d1"][i], d2=w["d2"][i], d3=w["d3"][i])
              for i in range(cfg.num_layers)]
    mhc = V2Mhc(router=w["router_t"], a_pre=w["a_pre"], a_post=w["a_post"], a_res=w["a_res"],
                pre_bias=w["pre_bias"], post_bias=w["post_bias"], b_res=w["b_res"])
    engrams = [V2Engram(tables=s["tables"], kv=s["kv"], taps=s["taps"]) for s in w["sites"]]
    embedding = Embedding(table=w["emb"], head=w["head_t"] if rotated else None)
    return embedding, layers, mhc, engrams, w["final"]


def pack_parts(parts, cqw: dict, cfg: V2Config):
    """Dense parts -> the "packed" form: the codes attached (slot name -> CqWeight, packed
    form), every float32 matrix dropped so only the codes stay resident."""
    embedding, layers, mhc, engrams, final_norm = parts
    for i, lw in enumerate(layers):
        lw.qkvg = lw.out = None
        lw.codes = {k: cqw[f"layer{i:02d}.{k}"]
                    for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "out_proj")}
    mhc.router = None
    mhc.codes = {k: cqw[f"mhc_phi_{k}"] for k in ("pre", "post", "res")}
    for s, site in enumerate(engrams):
        site.tables = site.kv = None
        site.codes = {k: cqw[f"engram{s}.{k}"] for k in ("tables", "key_proj", "value_proj")}
    return Embedding(None, None, cqw["embedding"]), layers, mhc, engrams, final_norm


def attach_codes(parts, cqw: dict, device):
    """Rotated parts -> the same parts keeping their codes beside the rows (slot name ->
    CqWeight, moved to `device` in the packed form: no second float32 copy). The torch paths
    compute on the rows; the triton backend's fused decode body streams the codes."""
    embedding, layers, mhc, engrams, final_norm = parts
    on = {k: CqWeight(cw.packed.to(device), cw.norms.to(device), cw.bits, cw.in_features,
                      "packed") for k, cw in cqw.items()}
    for i, lw in enumerate(layers):
        lw.codes = {k: on[f"layer{i:02d}.{k}"]
                    for k in ("q_proj", "k_proj", "v_proj", "gate_proj", "out_proj")}
    mhc.codes = {k: on[f"mhc_phi_{k}"] for k in ("pre", "post", "res")}
    for s, site in enumerate(engrams):
        site.codes = {k: on[f"engram{s}.{k}"] for k in ("tables", "key_proj", "value_proj")}
    embedding.codes = on["embedding"]
    return embedding, layers, mhc, engrams, final_norm


def stacked(ts: list) -> torch.Tensor:
    """Per-layer tensors as one [L, ...] tensor: a view when they are consecutive slices of
    one storage (as parts_from_weights makes them), else a copy."""
    t0 = ts[0]
    step = t0.numel()
    if t0.is_contiguous() and all(
            t.is_contiguous() and t.shape == t0.shape
            and t.untyped_storage().data_ptr() == t0.untyped_storage().data_ptr()
            and t.storage_offset() == t0.storage_offset() + i * step
            for i, t in enumerate(ts)):
        return torch.as_strided(t0, (len(ts), *t0.shape), (step, *t0.stride()),
                                t0.storage_offset())
    return torch.stack(ts)
