"""The packed Cactus-Quants matvec on a pre-rotated activation: Triton kernel and torch twin.

    y[o] = Σ_g norm[o, g] · Σ_k level[code(o, g·128 + k)] · xr[g·128 + k]

`packed` holds each row's codes as one LSB-first bitstream of `bits` per code (code k occupies
bits [k·bits, (k+1)·bits), byte k·bits >> 3); `levels` maps a stored code to its level (the
caller folds in the ternary crumb mapping); `xr` is the activation already rotated per 128-group
(kernels/fwht.py), shared by every matrix that reads the same input. The weights are never
expanded: the kernel extracts each code from at most two bytes.
"""
from __future__ import annotations

import torch

GROUP = 128

try:
    import triton
    import triton.language as tl
except ImportError:                        # pragma: no cover
    triton = None


class CqGemvError(ValueError):
    """Shapes that do not describe a packed CQ matrix (names the argument and the rule)."""


def _check(packed, norms, levels, bits, xr):
    if bits not in (2, 3, 4):
        raise CqGemvError(f"bits={bits} is not a stored code width (2, 3, 4)")
    if xr.dim() != 1 or xr.shape[0] % GROUP or xr.dtype != torch.float32:
        raise CqGemvError(f"xr must be float32 [in_pad], in_pad a multiple of {GROUP}; got "
                          f"{xr.dtype} {list(xr.shape)}")
    in_pad = xr.shape[0]
    if packed.dtype != torch.uint8 or packed.dim() != 2 or packed.shape[1] * 8 != in_pad * bits:
        raise CqGemvError(f"packed must be uint8 [out, {in_pad * bits // 8}] for {in_pad} "
                          f"{bits}-bit codes, got {packed.dtype} {list(packed.shape)}")
    if tuple(norms.shape) != (packed.shape[0], in_pad // GROUP):
        raise CqGemvError(f"norms must be [{packed.shape[0]}, {in_pad // GROUP}], got "
                          f"{list(norms.shape)}")
    if levels.numel() < (1 << bits):
        raise CqGemvError(f"levels has {levels.numel()} entries; {bits}-bit codes need "
                          f"{1 << bits}")


def unpack_codes(packed, bits: int, in_pad: int):
    """[out, in_pad] int64 codes from LSB-first bitstreams (bit arithmetic on int64)."""
    out = packed.shape[0]
    k = torch.arange(in_pad, device=packed.device)
    off = k * bits
    byte, shift = off >> 3, off & 7
    p = packed.to(torch.int64)
    lo = p[:, byte]
    hi = p[:, (byte + 1).clamp_max(packed.shape[1] - 1)]
    word = lo | (hi << 8)
    return (word >> shift) & ((1 << bits) - 1)


def cq_gemv_torch(packed, norms, levels, bits: int, xr):
    _check(packed, norms, levels, bits, xr)
    in_pad = xr.shape[0]
    lev = levels.to(torch.float32)[unpack_codes(packed, bits, in_pad)]
    dots = (lev.reshape(packed.shape[0], -1, GROUP) * xr.reshape(-1, GROUP)).sum(-1)
    return (norms.to(torch.float32) * dots).sum(-1)


if triton is not None:
    @triton.jit
    def group_codes(p_ptr, r, rmask, row_bytes, g, BITS: tl.constexpr, G: tl.constexpr):
        """[BLOCK_R, G] int32 codes of group g of rows r: each code from at most two bytes
        (the second byte masked off past the row's end). Shared with kernels/norm_gemv.py."""
        off = (g * G + tl.arange(0, G)) * BITS
        byte, shift = off >> 3, off & 7
        m2 = rmask[:, None] & (byte[None, :] + 1 < row_bytes)
        lo = tl.load(p_ptr + r[:, None] * row_bytes + byte[None, :], mask=rmask[:, None],
                     other=0).to(tl.int32)
        hi = tl.load(p_ptr + r[:, None] * row_bytes + byte[None, :] + 1, mask=m2,
                     other=0).to(tl.int32)
        return ((lo | (hi << 8)) >> shift[None, :]) & ((1 << BITS) - 1)

    @triton.jit
    def _cq_gemv_kernel(p_ptr, n_ptr, l_ptr, x_ptr, y_ptr, out, row_bytes, groups,
                        BITS: tl.constexpr, BLOCK_R: tl.constexpr, G: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = r < out
        k = tl.arange(0, G)
        acc = tl.zeros((BLOCK_R,), tl.float32)
        for g in range(0, groups):
            lev = tl.load(l_ptr + group_codes(p_ptr, r, rmask, row_bytes, g, BITS, G))
            xg = tl.load(x_ptr + g * G + k)
            dot = tl.sum(lev * xg[None, :], axis=1)
            nrm = tl.load(n_ptr + r * groups + g, mask=rmask, other=0.0).to(tl.float32)
            acc += nrm * dot
        tl.store(y_ptr + r, acc, mask=rmask)


def cq_gemv_triton(packed, norms, levels, bits: int, xr, block_rows: int = 16):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    _check(packed, norms, levels, bits, xr)
    out = packed.shape[0]
    y = torch.empty(out, dtype=torch.float32, device=xr.device)
    _cq_gemv_kernel[(triton.cdiv(out, block_rows),)](
        packed.contiguous(), norms.contiguous(), levels.to(torch.float32).contiguous(),
        xr.contiguous(), y, out, packed.shape[1], xr.shape[0] // GROUP,
        BITS=bits, BLOCK_R=block_rows, G=GROUP)
    return y
