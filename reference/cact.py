"""The .cact container (spec §e.5): read, validate, dequantise, write. No pickle, no trust.

    f = read_cact("needle2.cact")      # f.config, f.params (float32, flax paths), f.tokenizer,
                                        # f.slots / f.directory (every record, codes and norms)
    f.to_bytes() == open(...).read()    # re-emitting what was read gives the same bytes
    write_cact("m.cact", params, cfg, bits_map="embedding=4,mhc=4,default=2", tokenizer=tok)

The reader accepts exactly the canonical layout upstream's exporter produces (positional slots,
blobs in slot order at 64-byte alignment, zero gaps, nothing after the last blob). Anything
else raises CactFormatError naming the slot, the field and the byte offset; every size the file
declares is checked against the real file size and the header geometry before it is allocated.
"""
from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field

import torch

from . import cq
from .cact_check import check_data, check_header, check_record
# The byte layout lives in cact_format.py (cact_check.py builds on it too); re-exported here,
# where a reader of the format looks for it.
from .cact_format import (  # noqa: F401
    _FP_TORCH, _HEADER, _KIND_DTYPES, _RECORD, ALIGN, CODEBOOK_AT, DIRECTORY_AT, DTYPE_CQ,
    DTYPE_FP16, DTYPE_FP32, DTYPE_RAW, HEADER_FIELDS, TAG, CactFormatError, Slot, _align)
from .cact_layout import CQ, RAW, HEADS, base_count, canon, heads_in, params_from_slots, \
    slot_tensors
from .config import V2Config
from .memory_budget import DEFAULT_MAX_MEMORY, cact_terms, check_memory
from .params import ParamsError, check_params, param_shapes
from bounded.io import read_capped
from .tokenizer import Tokenizer, TokenizerFormatError


# The CQ format constants and codec, re-exported: the port may import reference.cact (the
# format) but not the reference's other modules.
GROUP, TERNARY, WIDTHS, levels = cq.GROUP, cq.TERNARY, cq.WIDTHS, cq.levels
parse_bits_map, bits_for = cq.parse_bits_map, cq.bits_for


def encode_matrix(w: torch.Tensor, bits: int, name: str = "matrix") -> tuple:
    """W [out, in] -> (packed uint8 [out, in_pad*b/8], norms float16 [out, in_pad/128]),
    exactly the CQ record payload upstream's exporter writes."""
    idx, norms = cq.quantize(w, bits, name)
    return cq.pack(idx, bits), norms






@dataclass(eq=False)
class CactFile:
    """A .cact file in memory: config from the header, the slots as stored, the tokenizer."""
    config: V2Config
    slots: list = field(repr=False)
    header: dict = field(default_factory=dict, repr=False)
    tokenizer: Tokenizer | None = field(default=None, repr=False)
    _params: dict | None = field(default=None, repr=False)

    @property
    def params(self) -> dict:
        """Dequantised float32 parameters keyed by flax paths (probe heads when present)."""
        if self._params is None:
            t = {s.name: s.dequantize() for s in self.slots if s.dtype != DTYPE_RAW}
            self._params = params_from_slots(t, self.config)
        return self._params

    @property
    def directory(self) -> list:
        return [s.record() for s in self.slots]

    def slot(self, name: str) -> Slot:
        for s in self.slots:
            if s.name == name:
                return s
        raise KeyError(f"no slot named {name!r}; slots: {[s.name for s in self.slots][:8]}...")

    def to_bytes(self) -> bytes:
        cfg, h = self.config, self.header
        orders = list(cfg.engram_orders) + [0] * (4 - len(cfg.engram_orders))
        sites = list(cfg.engram_layers) + [0] * (4 - len(cfg.engram_layers))
        head = _HEADER.pack(TAG, len(self.slots), len(cq.HEADER_CODEBOOK), h["kv_window"],
                            h["kv_bits"], cfg.vocab_size, cfg.d_model, cfg.num_heads,
                            cfg.num_kv_heads, cfg.num_layers, cfg.head_dim, cfg.max_seq_len,
                            cfg.hada_n, cfg.mhc_lanes, cfg.engram_slots, cfg.engram_sub,
                            cfg.engram_tables, cfg.engram_taps, cfg.engram_dilation,
                            len(cfg.engram_orders), *orders, cfg.num_sites, *sites,
                            cfg.rope_theta)
        out = bytearray(head + cq.HEADER_CODEBOOK.numpy().tobytes())
        pos = DIRECTORY_AT + _RECORD.size * len(self.slots)
        blobs = []
        for s in self.slots:
            pos = _align(pos)
            s.offset, blob = pos, s.blob()
            s.nbytes = len(blob)
            blobs.append(blob)
            pos += len(blob)
        for s in self.slots:
            dims = (list(s.shape) + [0, 0, 0, 0])[:4]
            out += _RECORD.pack(s.dtype, len(s.shape), 0, *dims, s.offset, s.nbytes, s.group,
                                s.bits)
        for s, blob in zip(self.slots, blobs):
            out += bytes(s.offset - len(out)) + blob
        return bytes(out)

    def save(self, path) -> int:
        data = self.to_bytes()
        with open(path, "wb") as f:
            f.write(data)
        return len(data)




# ---------------------------------------------------------------- writing
def build_cact(params: dict, cfg: V2Config, bits_map: str = "embedding=4,mhc=4,default=2",
               tokenizer=None, kv_window: int | None = None) -> CactFile:
    """Quantise and lay out `params` (flax paths) as a CactFile.

    `tokenizer`: None, a reference Tokenizer, a SentencePieceProcessor (or upstream's wrapper
    of one) or a RAW blob. `kv_window`: the header's window, default cfg.kv_window (upstream's
    `needle export` writes cfg.effective_kv_window, the same for the shipped and tiny presets).
    Probe heads are written for each head whose parameters are present.
    """
    _check_representable(cfg)
    table, default = cq.parse_bits_map(bits_map)
    heads = heads_in(params)          # each probe head is optional on its own, as upstream
    want = param_shapes(cfg, heads=True)
    checked = check_params(params, cfg, heads=False)
    for key, _ in heads:
        for path in (k for k in want if k.startswith(key + "/")):
            checked[path] = _checked(params, path, want[path])
    tensors = slot_tensors(checked, cfg)
    tok = _as_tokenizer(tokenizer)
    if tok is not None and tok.vocab_size != cfg.vocab_size:
        raise ValueError(f"tokenizer has {tok.vocab_size} pieces but vocab_size="
                         f"{cfg.vocab_size}")
    slots = []
    for i, spec in enumerate(canon(cfg, heads, tok is not None)):
        if spec.kind == RAW:
            slots.append(Slot(i, spec.name, DTYPE_RAW, (), raw=tok.to_blob()))
        elif spec.kind == CQ:
            bits = cq.bits_for(spec.name, table, default)
            idx, norms = cq.quantize(tensors[spec.name], bits, spec.name)
            slots.append(Slot(i, spec.name, DTYPE_CQ, spec.shape, cq.GROUP, bits,
                              packed=cq.pack(idx, bits), norms=norms))
        else:
            slots.append(Slot(i, spec.name, DTYPE_FP16, spec.shape,
                              values=_to_fp16(tensors[spec.name], spec.name)))
    window = cfg.kv_window if kv_window is None else int(kv_window)
    header = {"kv_window": window, "kv_bits": int(cfg.kv_bits or 8)}
    if not 0 <= window <= cfg.kv_budget:
        raise ValueError(f"kv_window={window} must be in 0..{cfg.kv_budget} (the KV budget: "
                         f"upstream's export writes min(budget, kv_window))")
    if header["kv_bits"] not in (2, 3, 4, 8):
        raise ValueError(f"kv_bits={cfg.kv_bits} must be 8 (int8) or 2, 3, 4")
    return CactFile(cfg.replace(kv_window=window, kv_bits=header["kv_bits"]), slots, header, tok)


def write_cact(path, params: dict, cfg: V2Config, bits_map: str = "embedding=4,mhc=4,default=2",
               tokenizer=None, kv_window: int | None = None) -> CactFile:
    """build_cact, then write the bytes to `path`; returns the CactFile."""
    f = build_cact(params, cfg, bits_map, tokenizer, kv_window)
    f.save(path)
    return f


def _checked(params: dict, path: str, shape: tuple) -> torch.Tensor:
    t = params.get(path)
    if t is None:
        raise ParamsError(f"probe head parameter {path!r} is missing (expected shape "
                          f"{list(shape)})")
    if tuple(t.shape) != shape:
        raise ParamsError(f"parameter {path!r} has shape {list(t.shape)}, config needs "
                          f"{list(shape)}")
    return t


def _check_representable(cfg: V2Config):
    for what, seq in (("engram_orders", cfg.engram_orders), ("engram_layers", cfg.engram_layers)):
        if len(seq) > 4:
            raise ValueError(f"{what}={seq}: the .cact header holds at most 4 entries")
    if cfg.engram_tables % len(cfg.engram_orders):
        raise ValueError(f"engram tables {cfg.engram_tables} not a multiple of the orders")


def _to_fp16(t: torch.Tensor, name: str) -> torch.Tensor:
    h = t.to(torch.float32).to(torch.float16)
    bad = ~torch.isfinite(h)
    if bad.any():
        pos = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: value {float(t[pos])} at {list(pos)} is not a finite float16 "
                         f"(limit +-65504)")
    return h


def _as_tokenizer(tok):
    if tok is None or isinstance(tok, Tokenizer):
        return tok
    if isinstance(tok, (bytes, bytearray)):
        return Tokenizer.from_blob(tok)
    sp = getattr(tok, "sp", tok)          # upstream's SANTokenizer wraps the processor as .sp
    if hasattr(sp, "GetPieceSize"):
        return Tokenizer.from_sentencepiece(sp)
    raise TypeError(f"tokenizer must be None, bytes, a Tokenizer or a SentencePieceProcessor, "
                    f"got {type(tok).__name__}")


# ---------------------------------------------------------------- reading
def read_cact(path, max_memory: int | None = None) -> CactFile:
    """Read and validate a .cact file: a regular file no larger than the memory budget
    (`max_memory`, default DEFAULT_MAX_MEMORY), whose header geometry fits the budget too."""
    budget = DEFAULT_MAX_MEMORY if max_memory is None else max_memory
    data = read_capped(path, budget, CactFormatError, ".cact file")
    return parse_cact(data, os.fspath(path), budget)


# Header byte of each config field a geometry's memory follows (for the budget's message).
_FIELD_AT = {cfg_name: 4 * HEADER_FIELDS.index(name) for cfg_name, name in (
    ("max_seq_len", "max_seq_len"), ("vocab_size", "vocab"), ("d_model", "d_model"),
    ("num_layers", "num_layers"), ("engram_slots", "engram_slots"),
    ("engram_orders", "engram_conv_dilation"))}


def parse_cact(data: bytes, where: str = "<bytes>", max_memory: int | None = None) -> CactFile:
    data = bytes(data)
    h, cfg, n, tokenized = check_header(data, where)
    check_memory(cfg, max_memory, where, _FIELD_AT, CactFormatError,
                 extra=cact_terms(cfg, len(data)))
    heads = _read_heads(data, where, cfg, n, tokenized)
    if dict(heads).get("contrastive_head"):       # the only header-less geometry field
        cfg = cfg.replace(contrastive_dim=dict(heads)["contrastive_head"])
    specs = canon(cfg, heads, tokenized)
    slots, end = [], DIRECTORY_AT + _RECORD.size * n
    for i, spec in enumerate(specs):
        at = DIRECTORY_AT + _RECORD.size * i
        rec = _RECORD.unpack_from(data, at)
        slot, end = check_record(data, where, i, spec, rec, at, end)
        slots.append(slot)
    if end != len(data):
        raise CactFormatError(f"{where}: {len(data) - end} bytes follow the last blob (slot "
                              f"{n - 1}) at byte {end}; the file must end there")
    tok = None
    for slot in slots:
        check_data(data, where, slot)
        if slot.dtype == DTYPE_RAW:
            try:
                tok = Tokenizer.from_blob(slot.raw)
            except TokenizerFormatError as e:
                raise CactFormatError(f"{where}: slot {slot.index} (tokenizer) field {e.field} "
                                      f"at byte {slot.offset + e.offset}: {e}") from None
            if tok.vocab_size != cfg.vocab_size:
                raise CactFormatError(f"{where}: slot {slot.index} (tokenizer) field n_pieces="
                                      f"{tok.vocab_size} at byte {slot.offset} differs from "
                                      f"header vocab={cfg.vocab_size}")
    return CactFile(cfg, slots, h, tok)


def _read_heads(data, where, cfg, n, tokenized) -> tuple:
    """The probe heads the slot count and manifest declare: ((key, out_dim), ...)."""
    extra = n - base_count(cfg) - int(tokenized)
    if extra == 0:
        return ()
    first = base_count(cfg)
    at = DIRECTORY_AT + _RECORD.size * first
    count = (extra - 1) // 3
    if extra < 4 or (extra - 1) % 3 or count > len(HEADS):
        raise CactFormatError(f"{where}: header field num_tensors={n} at byte 4 leaves {extra} "
                              f"slots after final_norm; probe heads need 1 + 3*H with H in 1..2")
    rec = _RECORD.unpack_from(data, at)
    if rec[0] != DTYPE_FP16 or rec[1] != 1 or rec[3] != count or rec[8] != 2 * count:
        raise CactFormatError(f"{where}: slot {first} (heads.manifest) record at byte {at} must "
                              f"be FP16 of shape [{count}] ({2 * count} bytes), got dtype={rec[0]}"
                              f" ndim={rec[1]} shape[0]={rec[3]} nbytes={rec[8]}")
    off = rec[7]
    if off + 2 * count > len(data):
        raise CactFormatError(f"{where}: slot {first} (heads.manifest) field offset={off} at "
                              f"byte {at + 20} runs past the end of the file ({len(data)} bytes)")
    codes = [float(v) for v in struct.unpack_from(f"<{count}e", data, off)]
    known = {float(c): (key, p) for key, c, p in HEADS}
    if any(c not in known for c in codes) or codes != sorted(set(codes)):
        raise CactFormatError(f"{where}: slot {first} (heads.manifest) values {codes} at byte "
                              f"{off} must be distinct codes from {sorted(known)} in order")
    heads = []
    for j, c in enumerate(codes):        # the proj record declares the head's output width
        key = known[c][0]
        at_proj = DIRECTORY_AT + _RECORD.size * (first + 2 + 3 * j)
        width = _RECORD.unpack_from(data, at_proj)[3]
        if not 1 <= width <= len(data):
            raise CactFormatError(f"{where}: slot {first + 2 + 3 * j} ({key}.proj) field "
                                  f"shape[0]={width} at byte {at_proj + 4} is out of range")
        heads.append((key, width))
    return tuple(heads)
