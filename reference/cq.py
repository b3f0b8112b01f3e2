"""Cactus-Quants (CQ): codebooks, quantise, dequantise, LSB-first packing, bits maps (§e.1-4).

A CQ matrix `W [out, in]` is cut along its reduction axis into groups of 128 (zero-padded to
`in_pad`). Each group is rotated by the normalised Walsh-Hadamard matrix `Hg`, split into a norm
(stored as f16) and a unit direction, and the direction is replaced elementwise by the index of
the nearest codebook level. Width codes are the .cact record values: 2, 3, 4, or 5 = ternary
("1.58-bit", three analytic levels stored as 2-bit crumbs).

Arithmetic is chosen to be exact or deterministic on every machine, never "whatever BLAS does":

* dequantise: `w = (levels[idx] * norm) @ Hg` is returned *correctly rounded* to float32. Every
  entry of `Hg` is +-h (h = f32(1/sqrt 128)), so the exact value is `h * sum(+-v_k)`; the signed
  sum of one group's 128 float32 values (one norm times codebook levels spanning 5 binades:
  <= 36 significant bits) is exact in float64 in any order, and the final product by h is
  rounded once (error-free split plus round-to-odd). upstream's read_export computes the same
  product as a float32 numpy matmul, whose summation order is the BLAS kernel's (it changes
  with the matrix shape and the CPU): the two differ by that float32 rounding, <= 1e-6 of the
  matrix's max |w| (tests/reference/test_cact.py).
* quantise: the rotation uses the same exact-sum route; norms are a fixed-order tree sum. The
  index choice then reproduces upstream's f32 elementwise rule (ties -> the lower level).
"""
from __future__ import annotations

import math
import re

import torch

GROUP = 128
TERNARY = 5                      # record value of the ternary ("1.58-bit") width
TERNARY_BITS = 1.58              # how bits maps and upstream spell it
WIDTHS = (2, 3, 4, TERNARY)
_TERNARY_C = 1.2240064           # analytic 3-level Lloyd-Max centroid (unit Gaussian)

# The sampled Gaussian Lloyd-Max levels for group 128, as stored in every .cact header
# (cb2 | cb3 | cb4). They cannot be recomputed without upstream's exact sampling procedure.
_CODEBOOK_HEX = (
    "be085e47 bd237060 3d23fc09 3e08a9db "
    "be41cdbb bdf16db0 bd87797d bcac246c 3cb50d39 3d88c69c 3df23363 3e4261c1 "
    "be7547c2 be390b02 be105747 bddf41f9 bda6f045 bd67898a bd06eb34 bc25be0a "
    "3c5040f6 3d124277 3d738a80 3dae086f 3de6e514 3e142b6e 3e3ca926 3e781699")
# module constants: normal tensors even when first imported inside inference mode
with torch.inference_mode(False):
    HEADER_CODEBOOK = torch.tensor([int(h, 16) for h in _CODEBOOK_HEX.split()],
                                   dtype=torch.int64).to(torch.int32).view(torch.float32)


def _f32(x: float) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64).to(torch.float32)


def levels(bits: int) -> torch.Tensor:
    """The sorted float32 levels of width code `bits` (group 128)."""
    if bits == TERNARY:
        c = _f32(_TERNARY_C / math.sqrt(GROUP))
        return torch.stack([-c, torch.zeros((), dtype=torch.float32), c])
    if bits not in (2, 3, 4):
        raise ValueError(f"CQ width {bits!r} is not one of {WIDTHS} (5 = ternary)")
    start = {2: 0, 3: 4, 4: 12}[bits]
    return HEADER_CODEBOOK[start:start + (1 << bits)].clone()


def num_levels(bits: int) -> int:
    return 3 if bits == TERNARY else 1 << bits


def storage_bits(bits: int) -> int:
    """Bits each index occupies in the file (ternary crumbs take 2)."""
    return 2 if bits == TERNARY else bits


def padded(n: int) -> int:
    return -(-n // GROUP) * GROUP


def blob_size(out: int, in_dim: int, bits: int) -> tuple:
    """(packed index bytes, norm bytes) of a CQ record."""
    in_pad = padded(in_dim)
    return out * in_pad * storage_bits(bits) // 8, out * (in_pad // GROUP) * 2


# ---------------------------------------------------------------- exact Hadamard arithmetic
with torch.inference_mode(False):      # a module constant (see HEADER_CODEBOOK)
    _H32 = _f32(1.0 / math.sqrt(GROUP))                               # every |Hg| entry
_H_HI = float(torch.tensor(int(_H32.view(torch.int32)) & ~0xFFF,
                           dtype=torch.int32).view(torch.float32))    # top 12 bits of h
_H_LO = float(_H32) - _H_HI                                           # the other 12, exact


def walsh_sum64(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Walsh-Hadamard transform over the last axis (length 128), in float64.

    Natural (Sylvester) order, so out[j] = sum_k (-1)^popcount(j&k) x[k]; fixed butterfly order.
    """
    y = x.to(torch.float64)
    shape = y.shape
    h = 1
    while h < shape[-1]:
        y = y.reshape(*shape[:-1], -1, 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return y.reshape(shape)


def times_h_to_f32(s: torch.Tensor) -> torch.Tensor:
    """float32(h * s) for float64 `s`, correctly rounded when `s` has <= 41 significant bits.

    h is split into two 12-bit halves so both products are exact; their sum is formed with an
    error-free TwoSum and rounded to odd, after which one rounding to float32 is correct.
    """
    a, b = s * _H_HI, s * _H_LO
    t = a + b
    bb = t - a
    err = (a - (t - bb)) + (b - bb)
    bits = t.view(torch.int64)
    bump = (err != 0) & ((bits & 1) == 0)
    toward = torch.where((err > 0) == (t > 0), 1, -1)
    return (bits + bump.to(torch.int64) * toward).view(torch.float64).to(torch.float32)


def _tree_sum64(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last axis (a power of two) by halving: an order fixed on every machine."""
    x = x.to(torch.float64)
    while x.shape[-1] > 1:
        half = x.shape[-1] // 2
        x = x[..., :half] + x[..., half:]
    return x[..., 0]


_CHUNK = 1 << 20     # elements per slice of the float64 work, to bound temporaries


def _rows_in_chunks(n_rows: int, row_elems: int):
    step = max(1, _CHUNK // max(1, row_elems))
    for r0 in range(0, n_rows, step):
        yield r0, min(n_rows, r0 + step)


# ---------------------------------------------------------------- quantise / dequantise
def quantize(w: torch.Tensor, bits: int, name: str = "matrix") -> tuple:
    """W [out, in] -> (idx uint8 [out, in_pad], norms float16 [out, in_pad/128])."""
    if w.dim() != 2:
        raise ValueError(f"{name}: CQ needs a 2-D [out, in] matrix, got shape {list(w.shape)}")
    cb = levels(bits)
    w = w.detach().to(torch.float32)       # upstream casts to float32 before quantising
    bad = ~torch.isfinite(w)
    if bad.any():
        pos = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"{name}: non-finite weight {float(w[pos])} at {list(pos)}")
    out, in_dim = w.shape
    in_pad = padded(in_dim)
    wp = torch.nn.functional.pad(w, (0, in_pad - in_dim)).reshape(out, in_pad // GROUP, GROUP)
    idx = torch.empty(out, in_pad // GROUP, GROUP, dtype=torch.uint8)
    norms = torch.empty(out, in_pad // GROUP, dtype=torch.float16)
    for r0, r1 in _rows_in_chunks(out, in_pad):
        rot = times_h_to_f32(walsh_sum64(wp[r0:r1]))
        norm64 = _tree_sum64(rot.to(torch.float64) ** 2).sqrt()
        norm = norm64.to(torch.float32)
        # The stored f16 norm is rounded once from the (nearly exact) float64 norm: going
        # through float32 first can land on an f16 midpoint and round the wrong way.
        norms[r0:r1] = round_to_f16(norm64)
        unit = rot / norm.clamp_min(1e-12)[..., None]
        idx[r0:r1] = nearest(unit, cb)
    too_big = torch.isinf(norms)
    if too_big.any():
        r, g = (int(i) for i in too_big.nonzero()[0])
        raise ValueError(f"{name}: the norm of group {g} of row {r} overflows float16 "
                         f"(limit 65504); scale the weights down")
    return idx.reshape(out, in_pad), norms


def nearest(unit: torch.Tensor, cb: torch.Tensor) -> torch.Tensor:
    """Index (uint8) of the nearest level; a value exactly between two levels (distances
    compared in float32, as upstream does) takes the lower index."""
    flat = unit.reshape(-1)
    pos = torch.searchsorted(cb, flat).clamp(1, len(cb) - 1)
    left, right = cb[pos - 1], cb[pos]
    pick = torch.where((flat - left).abs() <= (flat - right).abs(), pos - 1, pos)
    return pick.reshape(unit.shape).to(torch.uint8)


def round_to_f16(x: torch.Tensor) -> torch.Tensor:
    """float64 -> float16 with one round-to-nearest-even (torch converts via float32)."""
    h = x.to(torch.float32).to(torch.float16)
    bits = h.view(torch.int16)
    best, best_err = h, (h.to(torch.float64) - x).abs()
    for step in (-1, 1):               # the neighbours of a double-rounded result
        c = (bits + step).view(torch.float16)
        err = (c.to(torch.float64) - x).abs()
        even = (c.view(torch.int16) & 1) == 0
        better = (err < best_err) | ((err == best_err) & even)
        take = torch.isfinite(h) & torch.isfinite(c) & better
        best, best_err = torch.where(take, c, best), torch.where(take, err, best_err)
    return best


def prerotation(idx: torch.Tensor, norms: torch.Tensor, bits: int) -> torch.Tensor:
    """levels[idx] * norm in float32, [out, in_pad]: the rotated rows before Hg is undone."""
    out, in_pad = idx.shape
    v = levels(bits)[idx.long()].reshape(out, in_pad // GROUP, GROUP)
    return (v * norms.to(torch.float32)[..., None]).reshape(out, in_pad)


def dequantize(idx: torch.Tensor, norms: torch.Tensor, bits: int, in_dim: int) -> torch.Tensor:
    """The float32 matrix [out, in_dim] a CQ record encodes (correctly rounded, see above)."""
    out, in_pad = idx.shape
    w = torch.empty(out, in_pad, dtype=torch.float32)
    for r0, r1 in _rows_in_chunks(out, in_pad):
        v = prerotation(idx[r0:r1], norms[r0:r1], bits).reshape(r1 - r0, -1, GROUP)
        w[r0:r1] = times_h_to_f32(walsh_sum64(v)).reshape(r1 - r0, in_pad)
    return w[:, :in_dim].contiguous()


# ---------------------------------------------------------------- LSB-first packing
def pack(idx: torch.Tensor, bits: int) -> torch.Tensor:
    """Indices [out, in_pad] -> bytes [out, in_pad*b/8]; index k at bits [k*b, (k+1)*b)."""
    if bits == TERNARY:   # crumbs 3, 0, 1 for levels -c, 0, +c: sign-extension gives -1/0/+1
        idx = torch.tensor([3, 0, 1], dtype=torch.uint8)[idx.long()]
    b = storage_bits(bits)
    out, n = idx.shape
    word = torch.zeros(out, n // 8, dtype=torch.int64)
    codes = idx.to(torch.int64).reshape(out, n // 8, 8)
    for i in range(8):
        word |= codes[..., i] << (i * b)
    byte = torch.stack([(word >> (8 * j)) & 0xFF for j in range(b)], dim=-1)
    return byte.to(torch.uint8).reshape(out, n * b // 8)


def unpack(packed: torch.Tensor, bits: int, in_pad: int) -> torch.Tensor:
    """Inverse of `pack`. Ternary crumbs come back as level indices; an unused crumb value (2)
    comes back as 255 so the caller can report where it sits. The int64 working copies are
    made a slice of rows at a time (about _CHUNK indices), so unpacking a matrix allocates
    its uint8 result and a bounded remainder, not 17 bytes per weight."""
    b = storage_bits(bits)
    out = packed.shape[0]
    idx = torch.empty(out, in_pad, dtype=torch.uint8)
    crumb = torch.tensor([1, 2, 255, 0], dtype=torch.uint8) if bits == TERNARY else None
    mask = (1 << b) - 1
    for r0, r1 in _rows_in_chunks(out, in_pad):
        n = r1 - r0
        chunks = packed[r0:r1].to(torch.int64).reshape(n, in_pad // 8, b)
        word = torch.zeros(n, in_pad // 8, dtype=torch.int64)
        for j in range(b):
            word |= chunks[..., j] << (8 * j)
        part = torch.stack([(word >> (i * b)) & mask for i in range(8)], dim=-1).reshape(n, in_pad)
        idx[r0:r1] = crumb[part] if crumb is not None else part.to(torch.uint8)
    return idx


# ---------------------------------------------------------------- bits maps
def canonical_name(name: str) -> str:
    """Upstream's canonical tensor names: layerNN.x -> attn.x, engram params -> engram{s}.*."""
    n = re.sub(r"^layer\d+\.", "attn.", name)
    n = re.sub(r"^engrams?_?(\d+)[./]?", r"engram\1.", n)
    n = n[len("stack/"):] if n.startswith("stack/") else n
    n = n.replace("layers/block/self_attn/", "attn.").replace("mtp_block/self_attn/", "mtp.")
    n = n[:-len("/kernel")] if n.endswith("/kernel") else n
    n = "embedding" if n == "embedding/embedding" else n
    n = re.sub(r"^(engram\d+\.)embedding$", r"\1tables", n)
    return n.replace("/", ".")


def parse_bits_map(spec: str) -> tuple:
    """'prefix=bits,...,default=bits' -> ({canonical prefix: width code}, default width code)."""
    table, default = {}, None
    for part in str(spec or "").split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ValueError(f"bits map {spec!r}: entry {part.strip()!r} is not prefix=bits")
        key, value = (s.strip() for s in part.split("=", 1))
        odd = next((i for i, ch in enumerate(key) if not (ch.isascii() and (ch.isalnum()
                                                                            or ch in "_./"))),
                   None)
        if odd is not None or not key:
            # a look-alike (fullwidth 'ｅmbedding') would match no tensor and pass unnoticed
            raise ValueError(f"bits map {spec!r}: key {key!r} " + (
                "is empty" if odd is None else
                f"holds {key[odd]!r} (U+{ord(key[odd]):04X}) at character {odd}") +
                "; keys are ASCII tensor-name prefixes (letters, digits, _ . /)")
        try:
            num = float(value)
        except ValueError:
            raise ValueError(f"bits map {spec!r}: {key}={value!r} is not a number") from None
        if num == TERNARY_BITS:
            code = TERNARY
        elif num in (2, 3, 4) and value.lstrip("+").isdigit():
            code = int(num)
        else:
            raise ValueError(f"bits map {spec!r}: {key}={value} is not one of 2, 3, 4, 1.58")
        if key == "default":
            default = code
        else:
            table[canonical_name(key)] = code
    if default is None:
        raise ValueError(f"bits map {spec!r} needs a default=<bits> entry")
    return table, default


def bits_for(name: str, table: dict, default: int) -> int:
    """Width of tensor `name`: the longest matching canonical prefix, else the default."""
    canon = canonical_name(name)
    hits = [k for k in table if canon.startswith(k)]
    return table[max(hits, key=len)] if hits else default
