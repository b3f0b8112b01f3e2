"""The .cact container's byte layout (spec §e.5): the header and directory record structs, the
dtype codes, where the codebook and the directory start, the error every malformed file raises,
and one slot as stored. A leaf of the format: reference/cact.py (read, write) and
reference/cact_check.py (the checks) both build on it, so neither imports the other's back."""
from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from . import cq
from .cact_layout import CQ, FP16, RAW

TAG = 0x05E12A83
ALIGN = 64
DTYPE_FP16, DTYPE_FP32, DTYPE_CQ, DTYPE_RAW = 1, 2, 3, 4
_HEADER = struct.Struct("<29If")
_RECORD = struct.Struct("<BBHIIIIQQII")
HEADER_FIELDS = (("tag", "num_tensors", "codebook_len", "kv_window", "kv_bits", "vocab",
                  "d_model", "num_heads", "num_kv_heads", "num_layers", "head_dim",
                  "max_seq_len", "hada_n", "mhc_lanes", "engram_slots", "engram_sub_dim",
                  "num_engram_tables", "engram_conv_taps", "engram_conv_dilation",
                  "num_engram_orders") + tuple(f"engram_orders[{i}]" for i in range(4))
                 + ("num_engram_sites",) + tuple(f"engram_sites[{i}]" for i in range(4))
                 + ("rope_theta",))
CODEBOOK_AT = _HEADER.size                                    # 120
DIRECTORY_AT = CODEBOOK_AT + 4 * len(cq.HEADER_CODEBOOK)      # 232
_KIND_DTYPES = {CQ: (DTYPE_CQ,), FP16: (DTYPE_FP16, DTYPE_FP32), RAW: (DTYPE_RAW,)}
_FP_TORCH = {DTYPE_FP16: torch.float16, DTYPE_FP32: torch.float32}


class CactFormatError(ValueError):
    """A malformed .cact file; the message names the slot, field and byte offset."""


@dataclass(eq=False)
class Slot:
    """One directory record and its data, exactly as stored."""
    index: int
    name: str
    dtype: int                 # 1 FP16, 2 FP32, 3 CQ, 4 RAW
    shape: tuple               # stored shape ([out, in] for CQ)
    group: int = 0
    bits: int = 0              # CQ width code: 2, 3, 4 or 5 (ternary)
    offset: int = 0
    nbytes: int = 0
    packed: torch.Tensor | None = None   # CQ: uint8 [out, in_pad*b/8]
    norms: torch.Tensor | None = None    # CQ: float16 [out, in_pad/128]
    values: torch.Tensor | None = None   # FP16/FP32, stored dtype and shape
    raw: bytes | None = None             # RAW

    def codes(self) -> torch.Tensor:
        return cq.unpack(self.packed, self.bits, cq.padded(self.shape[1]))

    def dequantize(self) -> torch.Tensor:
        """float32 tensor in the stored layout."""
        if self.dtype == DTYPE_CQ:
            return cq.dequantize(self.codes(), self.norms, self.bits, self.shape[1])
        if self.dtype == DTYPE_RAW:
            raise TypeError(f"slot {self.index} ({self.name}) is RAW bytes, not a tensor")
        return self.values.to(torch.float32)

    def blob(self) -> bytes:
        if self.dtype == DTYPE_CQ:
            return self.packed.numpy().tobytes() + self.norms.view(torch.int16).numpy().tobytes()
        if self.dtype == DTYPE_RAW:
            return self.raw
        return self.values.contiguous().view(torch.uint8).numpy().tobytes()

    def record(self) -> dict:
        return dict(slot=self.index, name=self.name, dtype=self.dtype, shape=list(self.shape),
                    group=self.group, bits=self.bits, offset=self.offset, nbytes=self.nbytes)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN
