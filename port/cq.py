"""CqWeight: the port's Cactus-Quants matrix, stored as in the .cact file, computed two ways.

Storage is always the file's payload: packed LSB-first codes (`packed`, uint8) and one float16
norm per 128-wide group (`norms`). A matvec never undoes the Hadamard rotation on the weights;
it rotates the activation instead, once per group, and that rotated input is shared by every
matrix reading the same vector (q/k/v/gate, the three mHC routers):

    y[o] = sum_g norm[o, g] * < levels[idx[o, g, :]], Hg x_g >

Compute forms (pick per backend):
  "packed"  reads the codes at call time through a per-input lookup table of byte -> partial dot
            product. Resident memory = the file's CQ bytes. The layout a GPU kernel reads; this
            is the PyTorch statement of that contract (runs on any device, slow on CPU).
  "dense"   expands the pre-rotation rows `levels[idx] * norm` to float32 once at load and runs
            a plain matmul. ~4 bytes per weight, the fast CPU path (per-call unpacking in
            PyTorch on CPU is several times slower than a dense matvec).
Both agree with the exactly dequantised matrix within float32 rounding (tests/port/test_cq.py states
the measured bound). The packing is decoded here independently of reference/cq.py.
"""
from __future__ import annotations

import math

import torch

from reference import cact

GROUP = cact.GROUP
FORMS = ("dense", "packed")
_ROW_CHUNK = 4096       # rows per slice of the packed path, to bound its temporaries
# module constants: normal tensors even when first imported inside inference mode
with torch.inference_mode(False):
    _H = torch.tensor(1.0 / math.sqrt(GROUP), dtype=torch.float64).to(torch.float32)


class CqError(ValueError):
    """A CqWeight built or called with inputs that do not fit (names the value and limit)."""


def _sylvester(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


# Sylvester matrices factor as Kronecker products, H128 = H8 (x) H16, so the transform of a
# group viewed as [8, 16] is H8 @ X @ H16: a mixed-radix fast Walsh-Hadamard transform of
# 128 * (8 + 16) add/subtracts (the +-1 products are exact), in two small matmuls.
with torch.inference_mode(False):      # module constants, as _H
    _H8, _H16 = _sylvester(8), _sylvester(16)
_CONSTANTS = {}


def _const(key: tuple, device, make) -> torch.Tensor:
    """The constant `make()` on `device`, built once per (key, device): no per-call
    host-to-device copies, and weights of one width share their tables."""
    k = key + (str(torch.device(device)),)
    if k not in _CONSTANTS:
        # a normal tensor even if the first caller runs in inference mode (a sweep's case):
        # later callers may use it outside it
        with torch.inference_mode(False):
            _CONSTANTS[k] = make().to(device)
    return _CONSTANTS[k]


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Orthonormal Walsh-Hadamard transform of every 128-group of the last axis (float32):
    y_g = Hg x_g with Hg = Walsh(128)/sqrt(128) in natural (Sylvester) order."""
    lead, n = x.shape[:-1], x.shape[-1]
    h8, h16 = (_const((f"H{k}",), x.device, lambda: m) for k, m in ((8, _H8), (16, _H16)))
    y = torch.matmul(h8, torch.matmul(x.reshape(-1, 8, 16), h16))
    return y.mul_(_const(("h",), x.device, lambda: _H)).reshape(*lead, n)


def _level_table(bits: int) -> torch.Tensor:
    """Level of each code value as stored (ternary crumbs 3, 0, 1 -> -c, 0, +c; 2 unused)."""
    lev = cact.levels(bits)
    if bits == cact.TERNARY:
        return torch.stack([lev[1], lev[2], torch.tensor(float("nan")), lev[0]])
    return lev


def _byte_table(bits: int) -> torch.Tensor:
    """[codes per byte, 256]: the level in each code position of every byte value (3-bit
    codes straddle bytes: empty, they take the unpack path)."""
    b = 2 if bits == cact.TERNARY else bits
    if 8 % b:
        return torch.empty(0)
    shift = (torch.arange(8 // b) * b)[:, None]
    return _level_table(bits)[(torch.arange(256)[None, :] >> shift) & ((1 << b) - 1)]


class CqWeight:
    """One CQ matrix [out_features, in_features] (see the module docstring).

    `packed`/`norms` are the record payload exactly as stored; `bits` is the width code
    (2, 3, 4, or 5 = ternary); `form` picks the compute form. Inputs to the *_prepared methods
    come from prepare_input of the same in_features (float32, zero-padded to in_pad).
    """

    def __init__(self, packed: torch.Tensor, norms: torch.Tensor, bits: int, in_features: int,
                 form: str = "dense"):
        if form not in FORMS:
            raise CqError(f"form={form!r} is not one of {FORMS}")
        if bits not in cact.WIDTHS:
            raise CqError(f"bits={bits!r} is not one of {cact.WIDTHS} (5 = ternary)")
        if packed.dtype != torch.uint8 or packed.dim() != 2:
            raise CqError(f"packed must be a 2-D uint8 tensor, got {packed.dtype} "
                          f"{list(packed.shape)}")
        out, in_pad = packed.shape[0], -(-in_features // GROUP) * GROUP
        self.store_bits = 2 if bits == cact.TERNARY else bits
        if in_features < 1 or packed.shape[1] * 8 != in_pad * self.store_bits:
            raise CqError(f"packed rows of {packed.shape[1]} bytes do not hold "
                          f"{in_pad} {self.store_bits}-bit codes (in_features={in_features})")
        if norms.dtype != torch.float16 or tuple(norms.shape) != (out, in_pad // GROUP):
            raise CqError(f"norms must be float16 [{out}, {in_pad // GROUP}], got "
                          f"{norms.dtype} {list(norms.shape)}")
        self.bits, self.form = bits, form
        self.out_features, self.in_features, self.in_pad = out, in_features, in_pad
        self.groups = in_pad // GROUP
        self.packed, self.norms = packed.contiguous(), norms.contiguous()
        self._lev = _const(("levels", bits), packed.device, lambda: _level_table(bits))
        # dense: the pre-rotation rows, float32 [out, in_pad], expanded once (raises on a
        # ternary crumb 2); packed: only the shared byte table, after the same check.
        self.rows = self._prerotation(0, out) if form == "dense" else None
        self._byte_levels = (_const(("bytes", bits), packed.device, lambda: _byte_table(bits))
                             if form == "packed" else None)
        if form == "packed" and bits == cact.TERNARY:
            for r0 in range(0, out, _ROW_CHUNK):
                self._prerotation(r0, min(out, r0 + _ROW_CHUNK))

    # ---- construction ----
    @classmethod
    def from_slot(cls, slot, form: str = "dense") -> "CqWeight":
        if slot.dtype != cact.DTYPE_CQ:
            raise CqError(f"slot {slot.index} ({slot.name}) is not a CQ record")
        return cls(slot.packed, slot.norms, slot.bits, slot.shape[1], form)

    @classmethod
    def from_dense(cls, w: torch.Tensor, bits: int, form: str = "dense") -> "CqWeight":
        packed, norms = cact.encode_matrix(w, bits)
        return cls(packed, norms, bits, w.shape[1], form)

    @property
    def nbytes(self) -> int:
        """Resident bytes of this weight in its form (canonical storage included)."""
        held = [self.packed, self.norms] + ([self.rows] if self.rows is not None else [])
        return sum(t.numel() * t.element_size() for t in held)

    def kernel_operands(self, device=None):
        """(packed, norms, levels, code bits) on `device` (default: where the codes are): the
        packed-CQ operands of kernels/cq_gemv.py and kernels/norm_gemv.py, the form a GPU
        streams. Ternary codes travel as 2-bit crumbs with their crumb-to-level table."""
        dev = self.packed.device if device is None else torch.device(device)
        return (self.packed.to(dev), self.norms.to(dev), self._lev.to(dev), self.store_bits)

    # ---- codes ----
    def codes(self, r0: int, r1: int) -> torch.Tensor:
        """Stored code values (before the ternary crumb mapping) of rows r0..r1-1, int64."""
        b = self.store_bits
        lcm = 8 * b // math.gcd(8, b)       # the shortest run of whole bytes and whole codes
        per_word, nbytes = lcm // b, lcm // 8
        words = self.packed[r0:r1].to(torch.int64).reshape(r1 - r0, -1, nbytes)
        word = sum(words[..., j] << (8 * j) for j in range(nbytes))
        shifts = torch.arange(per_word, dtype=torch.int64, device=self.packed.device) * b
        return ((word[..., None] >> shifts) & ((1 << b) - 1)).reshape(r1 - r0, self.in_pad)

    def _prerotation(self, r0: int, r1: int) -> torch.Tensor:
        lev = self._lev[self.codes(r0, r1)].reshape(r1 - r0, self.groups, GROUP)
        bad = torch.isnan(lev)
        if bad.any():
            r, g, k = (int(i) for i in bad.nonzero()[0])
            raise CqError(f"row {r0 + r}, column {g * GROUP + k}: ternary crumb 2 is not a code")
        return (lev * self.norms[r0:r1].to(torch.float32)[..., None]).reshape(r1 - r0, -1)

    # ---- compute ----
    def prepare_input(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in_features] -> the rotated, zero-padded activation [..., in_pad] (float32)."""
        if x.shape[-1] != self.in_features:
            raise CqError(f"input has {x.shape[-1]} features, this weight takes "
                          f"{self.in_features}")
        x = torch.nn.functional.pad(x.to(torch.float32), (0, self.in_pad - self.in_features))
        return fwht(x)

    def _check_prepared(self, xp: torch.Tensor, batched: bool):
        want = 2 if batched else 1
        if xp.dim() != want or xp.shape[-1] != self.in_pad or xp.dtype != torch.float32:
            raise CqError(f"prepared input must be float32 {'[B, ' if batched else '['}"
                          f"{self.in_pad}], got {xp.dtype} {list(xp.shape)}")

    def _band(self, row0: int, n: int):
        if not (0 <= row0 and n >= 0 and row0 + n <= self.out_features):
            raise CqError(f"rows {row0}..{row0 + n - 1} are outside 0..{self.out_features - 1}")

    def matvec_prepared(self, xp: torch.Tensor) -> torch.Tensor:
        self._check_prepared(xp, batched=False)
        return self._rows_times(xp[None], 0, self.out_features)[0]

    def matvec_rows_prepared(self, xp: torch.Tensor, row0: int, out: torch.Tensor) -> torch.Tensor:
        """out[:] = rows row0 .. row0+len(out)-1 of W @ x (e.g. one layer's mHC router rows)."""
        self._check_prepared(xp, batched=False)
        if out.dim() != 1 or out.dtype != torch.float32:
            raise CqError(f"out must be a 1-D float32 tensor, got {out.dtype} {list(out.shape)}")
        self._band(row0, out.shape[0])
        out.copy_(self._rows_times(xp[None], row0, row0 + out.shape[0])[0])
        return out

    def matmat_prepared(self, xp: torch.Tensor) -> torch.Tensor:
        """Batched (prefill) form: xp [B, in_pad] -> [B, out]."""
        self._check_prepared(xp, batched=True)
        return self._rows_times(xp, 0, self.out_features)

    def matmat_rows_prepared(self, xp: torch.Tensor, row0: int, out: torch.Tensor) -> torch.Tensor:
        self._check_prepared(xp, batched=True)
        if out.dim() != 2 or out.dtype != torch.float32 or out.shape[0] != xp.shape[0]:
            raise CqError(f"out must be float32 [{xp.shape[0]}, n], got {out.dtype} "
                          f"{list(out.shape)}")
        self._band(row0, out.shape[1])
        out.copy_(self._rows_times(xp, row0, row0 + out.shape[1]))
        return out

    def matvec(self, x: torch.Tensor) -> torch.Tensor:
        return self.matvec_prepared(self.prepare_input(x))

    def dequantize_row(self, r: int) -> torch.Tensor:
        """Row r of the dequantised matrix [in_features] (float32)."""
        self._band(r, 1)
        row = self.rows[r] if self.rows is not None else self._prerotation(r, r + 1)[0]
        return fwht(row)[: self.in_features]

    def _rows_times(self, xp: torch.Tensor, r0: int, r1: int) -> torch.Tensor:
        if self.form == "dense":
            return xp @ self.rows[r0:r1].T
        out = torch.empty(xp.shape[0], r1 - r0, dtype=torch.float32, device=xp.device)
        if self._byte_levels.numel():
            per = self._byte_levels.shape[0]
            # table[b, p, v]: the dot of byte p's codes (if the byte held v) with xp.
            table = xp.reshape(xp.shape[0], -1, per) @ self._byte_levels
            flat = table.reshape(xp.shape[0], -1)
            # int32 indices: index_select gathers ~2.5x faster than with int64 on CPU.
            base = torch.arange(table.shape[1], dtype=torch.int32, device=xp.device) * 256
        for c0 in range(r0, r1, _ROW_CHUNK):
            c1 = min(r1, c0 + _ROW_CHUNK)
            if self._byte_levels.numel():
                idx = (self.packed[c0:c1].to(torch.int32) + base).reshape(-1)
                part = flat.index_select(1, idx).reshape(xp.shape[0], c1 - c0, self.groups, -1)
                group_dots = part.sum(-1)
            else:
                lev = self._prerotation_unit(c0, c1)
                group_dots = torch.einsum("rgk,bgk->brg", lev,
                                          xp.reshape(xp.shape[0], self.groups, GROUP))
            out[:, c0 - r0:c1 - r0] = (group_dots * self.norms[c0:c1].to(torch.float32)).sum(-1)
        return out

    def _prerotation_unit(self, r0: int, r1: int) -> torch.Tensor:
        return self._lev[self.codes(r0, r1)].reshape(r1 - r0, self.groups, GROUP)
