"""Validation of .cact bytes: every error names the slot, the field and the absolute byte offset.

Order matters: the header's sizes are checked against the real file size before any list or
tensor they imply is built, and each directory record is checked against the geometry and the
file before its blob is copied out.
"""
from __future__ import annotations

import math

import torch

from . import cq
from .cact_format import (_HEADER, _RECORD, ALIGN, CODEBOOK_AT, DIRECTORY_AT, DTYPE_CQ, DTYPE_FP16,
                   DTYPE_FP32, DTYPE_RAW, HEADER_FIELDS, TAG, _FP_TORCH, _KIND_DTYPES,
                   CactFormatError, Slot, _align)
from .cact_layout import CQ, LAYER_SLOTS, MHC_SLOTS, RAW
from .config import ConfigError, V2Config
from .params import first_flat

_REC_FIELDS = (("dtype", 0), ("ndim", 1), ("pad", 2), ("shape[0]", 4), ("shape[1]", 8),
               ("shape[2]", 12), ("shape[3]", 16), ("offset", 20), ("nbytes", 28),
               ("group", 36), ("bits", 40))
_SLOT_COUNTS = {0: (), 1: ("tokenizer",), 4: ("1 probe head",), 5: ("1 probe head", "tokenizer"),
                7: ("2 probe heads",), 8: ("2 probe heads", "tokenizer")}


def _fail(where, what):
    raise CactFormatError(f"{where}: {what}")


def check_header(data: bytes, where: str):
    """(header dict, V2Config, num_tensors, has_tokenizer) after checking the fixed part."""
    if len(data) < _HEADER.size:
        field = HEADER_FIELDS[len(data) // 4]
        _fail(where, f"header field {field} at byte {len(data) // 4 * 4} is truncated: the file "
                     f"is {len(data)} bytes, the header needs {_HEADER.size}")
    vals = _HEADER.unpack_from(data, 0)
    h = dict(zip(HEADER_FIELDS, vals))
    at = {name: 4 * i for i, name in enumerate(HEADER_FIELDS)}

    def bad(name, why):
        _fail(where, f"header field {name}={h[name]} at byte {at[name]} {why}")

    if h["tag"] != TAG:
        bad("tag", f"is not the .cact tag 0x{TAG:08X} (got 0x{h['tag']:08X})")
    if h["codebook_len"] != len(cq.HEADER_CODEBOOK):
        bad("codebook_len", f"must be {len(cq.HEADER_CODEBOOK)} (cb2|cb3|cb4 for group 128)")
    if len(data) < DIRECTORY_AT:
        _fail(where, f"codebook at byte {CODEBOOK_AT} is truncated: the file is {len(data)} "
                     f"bytes, header and codebook need {DIRECTORY_AT}")
    got = torch.frombuffer(bytearray(data[CODEBOOK_AT:DIRECTORY_AT]), dtype=torch.int32)
    want = cq.HEADER_CODEBOOK.view(torch.int32)
    if not torch.equal(got, want):
        k = int((got != want).nonzero()[0])
        _fail(where, f"header field codebook[{k}] at byte {CODEBOOK_AT + 4 * k} is "
                     f"0x{int(got[k]) & 0xFFFFFFFF:08X}, not upstream's level "
                     f"0x{int(want[k]) & 0xFFFFFFFF:08X}")
    n = h["num_tensors"]
    if DIRECTORY_AT + _RECORD.size * n > len(data):
        bad("num_tensors", f"needs a {_RECORD.size * n}-byte directory at byte {DIRECTORY_AT}, "
                           f"past the end of the {len(data)}-byte file")
    for name in ("vocab", "d_model", "num_heads", "num_kv_heads", "num_layers", "head_dim",
                 "max_seq_len", "mhc_lanes", "engram_slots", "engram_sub_dim",
                 "num_engram_tables"):
        if h[name] < 1:
            bad(name, "must be >= 1")
    if h["kv_bits"] not in (2, 3, 4, 8):
        bad("kv_bits", "must be 8 (int8) or 2, 3, 4")
    n_orders, n_sites = h["num_engram_orders"], h["num_engram_sites"]
    if not 1 <= n_orders <= 4:
        bad("num_engram_orders", "must be in 1..4")
    if n_sites > 4:
        bad("num_engram_sites", "must be in 0..4")
    for i in range(4):
        name = f"engram_orders[{i}]"
        if (i < n_orders) != (h[name] != 0):
            bad(name, f"must be {'>= 1' if i < n_orders else '0'} "
                      f"(num_engram_orders={n_orders})")
        name = f"engram_sites[{i}]"
        if i >= n_sites and h[name] != 0:
            bad(name, f"must be 0 (num_engram_sites={n_sites})")
    orders = tuple(h[f"engram_orders[{i}]"] for i in range(n_orders))
    sites = tuple(h[f"engram_sites[{i}]"] for i in range(n_sites))
    d, T = h["d_model"], h["num_engram_tables"]
    checks = (("hada_n", 1 << (d - 1).bit_length(), "next power of two >= d_model"),
              ("engram_conv_taps", 4, "the fixed tap count"),
              ("engram_conv_dilation", max(orders), "max(engram_orders)"),
              ("engram_sub_dim", d // T, "d_model // num_engram_tables"))
    for name, value, rule in checks:
        if h[name] != value:
            bad(name, f"must be {value} ({rule})")
    if T % n_orders:
        bad("num_engram_tables", f"must be a multiple of num_engram_orders={n_orders}")
    if not (math.isfinite(h["rope_theta"]) and h["rope_theta"] > 0):
        bad("rope_theta", "must be finite and > 0")
    base = base_count_from(h, n_sites)
    tokenized = n > 0 and data[DIRECTORY_AT + _RECORD.size * (n - 1)] == DTYPE_RAW
    if n - base not in _SLOT_COUNTS or (n - base - tokenized) not in (0, 4, 7):
        bad("num_tensors", f"does not fit the canon: {base} slots through final_norm "
                           f"(num_layers={h['num_layers']}, {n_sites} Engram sites), then "
                           f"optionally 1+3*H probe-head slots (H=1,2) and a RAW tokenizer")
    heads = T // n_orders
    auto = max(1, d // (n_orders * 128))
    try:
        cfg = V2Config(vocab_size=h["vocab"], d_model=d, attn_dim=h["head_dim"] * h["num_heads"],
                       num_heads=h["num_heads"], num_kv_heads=h["num_kv_heads"],
                       num_layers=h["num_layers"], max_seq_len=h["max_seq_len"],
                       engram_orders=orders, engram_heads=0 if heads == auto else heads,
                       engram_slots=h["engram_slots"], engram_layers=sites,
                       mhc_lanes=h["mhc_lanes"], kv_window=h["kv_window"],
                       kv_bits=h["kv_bits"], rope_theta=float(h["rope_theta"]), dtype="float32")
    except ConfigError as e:
        _fail(where, f"header geometry (bytes 0..{_HEADER.size}) is not a valid needle v2 "
                     f"config: {e}")
    if h["kv_window"] > cfg.kv_budget:
        # Upstream's export writes min(budget, kv_window) (spec §a.2); a wider window is no
        # file it makes, and the ring and every step's attention would scale with it.
        bad("kv_window", f"exceeds the KV budget of {cfg.kv_budget} positions (11.5 MiB at "
                         f"{cfg.kv_bytes_per_pos} bytes per position, at least 160, at most "
                         f"max_seq_len)")
    return h, cfg, n, bool(tokenized)


def base_count_from(h: dict, n_sites: int) -> int:
    """Slots through final_norm, from header integers (cact_layout.base_count needs a config,
    which must not be built before the count is known to fit the file)."""
    return 1 + len(LAYER_SLOTS) * h["num_layers"] + len(MHC_SLOTS) + 4 * n_sites + 1


def check_record(data: bytes, where: str, i: int, spec, rec: tuple, at: int, end: int):
    """Validate directory record `i` (at byte `at`) against its canonical spec and the file;
    `end` is where the previous blob ended. Returns (Slot, end of this blob)."""
    r = dict(zip((f for f, _ in _REC_FIELDS), rec))
    off = {f: at + o for f, o in _REC_FIELDS}

    def bad(name, why):
        _fail(where, f"slot {i} ({spec.name}) field {name}={r[name]} at byte {off[name]} {why}")

    if r["dtype"] not in _KIND_DTYPES[spec.kind]:
        bad("dtype", f"must be {' or '.join(map(str, _KIND_DTYPES[spec.kind]))} "
                     f"(1 FP16, 2 FP32, 3 CQ, 4 RAW)")
    if r["ndim"] != len(spec.shape):
        bad("ndim", f"must be {len(spec.shape)}")
    if r["pad"]:
        bad("pad", "must be 0")
    for k in range(4):
        want = spec.shape[k] if k < len(spec.shape) else 0
        if r[f"shape[{k}]"] != want:
            bad(f"shape[{k}]", f"must be {want} (stored shape {list(spec.shape)} for this "
                               f"geometry)")
    if spec.kind == CQ:
        if r["group"] != cq.GROUP:
            bad("group", f"must be {cq.GROUP} (the only group the header codebook is for)")
        if r["bits"] not in cq.WIDTHS:
            bad("bits", f"must be one of {cq.WIDTHS} (5 = ternary)")
        need = sum(cq.blob_size(spec.shape[0], spec.shape[1], r["bits"]))
    else:
        for name in ("group", "bits"):
            if r[name]:
                bad(name, "must be 0 for a non-CQ slot")
        item = {DTYPE_FP16: 2, DTYPE_FP32: 4}.get(r["dtype"], 0)
        need = math.prod(spec.shape) * item if spec.kind != RAW else r["nbytes"]
    if r["nbytes"] != need:
        bad("nbytes", f"must be {need} for this dtype/shape/bits")
    if r["offset"] != _align(end):
        bad("offset", f"must be {_align(end)}: blobs follow the directory in slot order, each "
                      f"at the next multiple of {ALIGN}")
    if r["offset"] + need > len(data):
        bad("nbytes", f"runs past the end of the file: blob [{r['offset']}, "
                      f"{r['offset'] + need}) but the file is {len(data)} bytes")
    gap = data[end:r["offset"]]
    if any(gap):
        k = next(j for j, b in enumerate(gap) if b)
        _fail(where, f"slot {i} ({spec.name}): alignment padding byte at {end + k} is "
                     f"0x{gap[k]:02X}, must be 0")
    blob = data[r["offset"]:r["offset"] + need]
    slot = Slot(i, spec.name, r["dtype"], spec.shape, r["group"], r["bits"], r["offset"], need)
    if spec.kind == CQ:
        out, in_pad = spec.shape[0], cq.padded(spec.shape[1])
        n_packed, _ = cq.blob_size(out, spec.shape[1], r["bits"])
        slot.packed = torch.frombuffer(bytearray(blob[:n_packed]), dtype=torch.uint8) \
            .reshape(out, n_packed // out)
        slot.norms = torch.frombuffer(bytearray(blob[n_packed:]), dtype=torch.int16) \
            .view(torch.float16).reshape(out, in_pad // cq.GROUP)
    elif spec.kind == RAW:
        slot.raw = bytes(blob)
    else:
        slot.values = torch.frombuffer(bytearray(blob), dtype=torch.uint8) \
            .view(_FP_TORCH[r["dtype"]]).reshape(spec.shape)
    return slot, r["offset"] + need


def check_data(data: bytes, where: str, s: Slot):
    """Values the format rules out: non-finite or negative norms, the unused ternary crumb,
    non-finite float values, a non-zero contrastive bias (the reference has no such term)."""
    def bad(what, byte):
        _fail(where, f"slot {s.index} ({s.name}) {what} at byte {byte}")

    if s.dtype == DTYPE_CQ:
        out, G = s.norms.shape
        n_packed = s.packed.numel()
        # first_flat scans in slices: no whole-matrix mask, no int64 nonzero() of it
        at = first_flat(s.norms, lambda v: ~torch.isfinite(v) | torch.signbit(v))
        if at is not None:
            r, g = divmod(at, G)
            bad(f"field norms[{r}, {g}]={float(s.norms[r, g])} is not a finite norm >= 0",
                s.offset + n_packed + 2 * (r * G + g))
        if s.bits == cq.TERNARY:
            codes = s.codes()
            at = first_flat(codes, lambda v: v == 255)
            if at is not None:
                r, k = divmod(at, codes.shape[1])
                bad(f"field codes[{r}, {k}] holds crumb 2, which ternary never uses",
                    s.offset + r * s.packed.shape[1] + (2 * k) // 8)
    elif s.dtype in (DTYPE_FP16, DTYPE_FP32):
        flat = s.values.reshape(-1)
        item = flat.element_size()
        k = first_flat(flat, lambda v: ~torch.isfinite(v))
        if k is not None:
            bad(f"field values[{k}]={float(flat[k])} is not finite", s.offset + item * k)
        if s.name == "contrastive_head.bias" and flat.any():
            k = int(flat.nonzero()[0])
            bad(f"field values[{k}]={float(flat[k])} must be 0 (the contrastive head has no "
                f"bias; upstream writes zeros)", s.offset + item * k)
