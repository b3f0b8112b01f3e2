"""An RMS norm folded into the matrix-vector product that reads it: Triton kernels and torch twins.

    xn = (1 + gain) · x / sqrt(mean(x²) + eps)     kind "zc"   (zero-centred, the block norms)
    xn = x · rsqrt(mean(x²) + eps)                 kind "unit" (the mHC router input)
    xn = x                                         kind "none" (a plain product)
    xn = x · gain                                  kind "mul"  (elementwise: attention's o·gate)
    y  = xn @ W

`out=` (a float32 [N] unit-stride tensor, e.g. a slice of a bigger buffer) receives y in place
of a fresh allocation.

Activations below float32 (kernels/narrow.py): x (and the "mul" gain) may be bfloat16 or float16,
the dense W float32, bfloat16 or float16. The norm and the dot run in float32 and y is rounded
once to the activation dtype `act` (default: x's; the LM head passes it for a float32 hidden
row), returned in that dtype or held in `out`'s.

The norm runs over the whole input, which may be a 2-D strided view [R, C] read as one vector
of K = R·C values (the mHC lanes [n, d], possibly one row expanded n times: no copy launched).
Every program re-reads the input for the mean: K is at most a few thousand floats, cheaper than
a second launch.

Two weight forms:
  dense   W is float32 [K or K_pad, N], any strides (the model keeps [in, out] views of
          [out, in] rows). With rotate=True, xn is zero-padded to K_pad (a multiple of 128) and
          rotated per 128-group (the orthonormal Walsh-Hadamard transform of kernels/fwht.py)
          before the product: the Cactus-Quants pre-rotation rows expanded to float32.
  cq      W is the packed codes (kernels/cq_gemv.py's contract: LSB-first bitstreams, one
          float16 norm per 128-group, a level table): always rotated, streamed code by code.
"""
from __future__ import annotations

import math

import torch

from .cq_gemv import GROUP, cq_gemv_torch, _check as _check_cq
from .fwht import fwht_torch
from .narrow import ACT_DTYPES, act_code, act_of, is_act, narrow_torch, wide

KINDS = ("zc", "unit", "none", "mul")     # the kernels' KIND is the index

try:
    import triton
    import triton.language as tl
    from .cq_gemv import group_codes
    from .narrow import narrow
except ImportError:                        # pragma: no cover
    triton = None


class NormGemvError(ValueError):
    """Inputs the fused norm + product cannot take (names the argument and the rule)."""


def _as_rows(x):
    if x.dim() == 1:
        return x[None]
    if x.dim() != 2:
        raise NormGemvError(f"x must be [K] or [R, C], got {list(x.shape)}")
    return x


def _check_norm(x, gain, kind):
    if kind not in KINDS:
        raise NormGemvError(f"kind={kind!r} is not one of {KINDS}")
    if not is_act(x) or x.numel() == 0:
        raise NormGemvError(f"x must be non-empty float32 (or bfloat16/float16), got {x.dtype} "
                            f"{list(x.shape)}")
    needs_gain = kind in ("zc", "mul")
    if needs_gain and (gain is None or gain.shape != (x.numel(),)
                       or gain.dtype not in (torch.float32, x.dtype)):
        raise NormGemvError(f"kind {kind!r} needs a float32 gain [{x.numel()}], got "
                            f"{None if gain is None else (gain.dtype, list(gain.shape))}")
    if not needs_gain and gain is not None:
        raise NormGemvError(f"kind {kind!r} takes no gain (gain must be None), got "
                            f"{gain.dtype} {list(gain.shape)}")


def _act(x, gain, act):
    """The dtype y is rounded to: `act` when given, else the activations' (x, a 16-bit gain)."""
    if act is None:
        return act_of(x, gain)
    if act not in ACT_DTYPES:
        raise NormGemvError(f"act={act} is not one of {ACT_DTYPES}")
    return act


def _check_out(out, n, x, act=torch.float32):
    """None, or where y goes: float32 (or act) [n], unit stride, on x's device."""
    if out is not None and (out.dim() != 1 or out.shape[0] != n
                            or out.dtype not in (torch.float32, act)
                            or not out.is_contiguous() or out.device != x.device):
        raise NormGemvError(f"out must be a contiguous float32 [{n}] on {x.device}, got "
                            f"{out.dtype} {list(out.shape)} stride {out.stride()} on "
                            f"{out.device}")


def rms_norm_torch(x, gain, kind: str, eps: float = 1e-6):
    """The model's input transforms over all of x (flattened), in its op order."""
    _check_norm(x, gain, kind)
    v = wide(x.reshape(-1))
    gain = None if gain is None else wide(gain)
    if kind == "none":
        return v
    if kind == "mul":
        return v * gain
    ms = (v * v).mean(-1, keepdim=True) + eps
    return (1.0 + gain) * v / torch.sqrt(ms) if kind == "zc" else v * torch.rsqrt(ms)


def _into(y, out, act=torch.float32):
    """y rounded to act: returned in act, or written into out."""
    return narrow_torch(y, act, into=out)


def _rotated(xn, k_pad):
    return fwht_torch(torch.nn.functional.pad(xn, (0, k_pad - xn.shape[0])))


def norm_gemv_torch(x, gain, w_t, kind: str, rotate: bool = False, eps: float = 1e-6,
                    out=None, act=None):
    """-> y [N] = norm(x) @ w_t (dense weight; see the module docstring)."""
    xn = rms_norm_torch(x, gain, kind, eps)
    act = _act(x, gain, act)
    _check_dense(xn.shape[0], w_t, rotate)
    _check_out(out, w_t.shape[1], x, act)
    if rotate:
        xn = _rotated(xn, w_t.shape[0])
    return _into(xn @ wide(w_t), out, act)


def norm_cq_gemv_torch(x, gain, kind, packed, norms, levels, bits: int, eps: float = 1e-6,
                       out=None, act=None):
    """-> y [out] = codes(W) · rotate(pad(norm(x))) (cq_gemv's contract after the norm)."""
    xn = rms_norm_torch(x, gain, kind, eps)
    act = _act(x, gain, act)
    _check_out(out, packed.shape[0], x, act)
    return _into(cq_gemv_torch(packed, norms, levels, bits,
                               _rotated(xn, _k_pad(xn.shape[0], packed, bits))), out, act)


def _k_pad(k, packed, bits):
    k_pad = packed.shape[1] * 8 // bits if bits in (2, 3, 4) else -1
    if k_pad < k or k_pad % GROUP:
        raise NormGemvError(f"packed rows of {packed.shape[1]} bytes hold {k_pad} {bits}-bit "
                            f"codes; need a multiple of {GROUP} >= K={k}")
    return k_pad


def _check_dense(k, w_t, rotate):
    if w_t.dim() != 2 or not is_act(w_t):
        raise NormGemvError(f"w_t must be float32 [K, N] (or bfloat16/float16), got "
                            f"{w_t.dtype} {list(w_t.shape)}")
    want = -(-k // GROUP) * GROUP if rotate else k
    if w_t.shape[0] != want:
        raise NormGemvError(f"w_t has {w_t.shape[0]} rows; K={k} needs {want}"
                            f"{' (padded to whole 128-groups for rotate)' if rotate else ''}")


if triton is not None:
    @triton.jit
    def _load_flat(x_ptr, k, K, C, sx0, sx1):
        return tl.load(x_ptr + (k // C) * sx0 + (k % C) * sx1, mask=k < K,
                       other=0.0).to(tl.float32)

    @triton.jit
    def _normed(x_ptr, g_ptr, k, K, C, sx0, sx1, ms, KIND: tl.constexpr):
        x = _load_flat(x_ptr, k, K, C, sx0, sx1)
        if KIND == 0:                                                   # zc
            x = (1.0 + tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)) * x / tl.sqrt(ms)
        elif KIND == 1:                                                 # unit
            x = x * (1.0 / tl.sqrt(ms))
        elif KIND == 3:                                                 # mul
            x = x * tl.load(g_ptr + k, mask=k < K, other=0.0).to(tl.float32)
        return x

    @triton.jit
    def _input_ms(x_ptr, K, C, sx0, sx1, eps, KIND: tl.constexpr, BLOCK_K: tl.constexpr):
        """mean(x²) + eps for the two norms; the other kinds never read it."""
        if KIND <= 1:
            ms = _mean_square(x_ptr, K, C, sx0, sx1, eps, BLOCK_K)
        else:
            ms = tl.full((), 1.0, tl.float32)                 # same type as the norms' ms
        return ms

    @triton.jit
    def _mean_square(x_ptr, K, C, sx0, sx1, eps, BLOCK_K: tl.constexpr):
        ss = tl.zeros((BLOCK_K,), tl.float32)
        for k0 in range(0, K, BLOCK_K):
            x = _load_flat(x_ptr, k0 + tl.arange(0, BLOCK_K), K, C, sx0, sx1)
            ss += x * x
        return tl.sum(ss, 0) / K + eps

    @triton.jit
    def _rotate128(x, scale, G: tl.constexpr):
        """The orthonormal Walsh-Hadamard transform of one 128-group held in registers."""
        i = tl.arange(0, G)
        p = i[:, None] & i[None, :]
        p = p ^ (p >> 4)
        p = p ^ (p >> 2)
        p = p ^ (p >> 1)
        sign = 1.0 - 2.0 * (p & 1).to(tl.float32)
        return tl.sum(x[:, None] * sign, axis=0) * scale

    @triton.jit
    def _norm_gemv_kernel(x_ptr, g_ptr, w_ptr, y_ptr, K, C, sx0, sx1, KW, N, swk, swn, eps,
                          scale, KIND: tl.constexpr, ROTATE: tl.constexpr,
                          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr):
        o = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        omask = o < N
        ms = _input_ms(x_ptr, K, C, sx0, sx1, eps, KIND, BLOCK_K)
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for k0 in range(0, KW, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            xn = _normed(x_ptr, g_ptr, k, K, C, sx0, sx1, ms, KIND)
            if ROTATE:
                xn = _rotate128(xn, scale, BLOCK_K)
            w = tl.load(w_ptr + k[:, None] * swk + o[None, :] * swn,
                        mask=(k[:, None] < KW) & omask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(xn[:, None] * w, 0)
        tl.store(y_ptr + o, narrow(acc, ACT), mask=omask)

    @triton.jit
    def _norm_cq_gemv_kernel(x_ptr, g_ptr, p_ptr, n_ptr, l_ptr, y_ptr, K, C, sx0, sx1, out,
                             row_bytes, groups, eps, scale, KIND: tl.constexpr,
                             BITS: tl.constexpr, BLOCK_R: tl.constexpr, G: tl.constexpr,
                             ACT: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = r < out
        ms = _input_ms(x_ptr, K, C, sx0, sx1, eps, KIND, G)
        kk = tl.arange(0, G)
        acc = tl.zeros((BLOCK_R,), tl.float32)
        for g in range(0, groups):
            xr = _rotate128(_normed(x_ptr, g_ptr, g * G + kk, K, C, sx0, sx1, ms, KIND),
                            scale, G)
            code = group_codes(p_ptr, r, rmask, row_bytes, g, BITS, G)
            dot = tl.sum(tl.load(l_ptr + code) * xr[None, :], axis=1)
            nrm = tl.load(n_ptr + r * groups + g, mask=rmask, other=0.0).to(tl.float32)
            acc += nrm * dot
        tl.store(y_ptr + r, narrow(acc, ACT), mask=rmask)


def _need_triton():
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")


def norm_gemv_triton(x, gain, w_t, kind: str, rotate: bool = False, eps: float = 1e-6,
                     block_n: int = 32, out=None, act=None):
    _need_triton()
    _check_norm(x, gain, kind)
    act = _act(x, gain, act)
    rows = _as_rows(x)
    K = rows.numel()
    _check_dense(K, w_t, rotate)
    N = w_t.shape[1]
    _check_out(out, N, x, act)
    y = torch.empty(N, dtype=act, device=x.device) if out is None else out
    _norm_gemv_kernel[(triton.cdiv(N, block_n),)](       # "unit"/"none" never read the gain
        rows, gain if gain is not None else rows, w_t, y, K, rows.shape[1], rows.stride(0),
        rows.stride(1), w_t.shape[0], N, w_t.stride(0), w_t.stride(1), eps,
        1.0 / math.sqrt(GROUP), KIND=KINDS.index(kind), ROTATE=rotate, BLOCK_N=block_n,
        BLOCK_K=GROUP, ACT=act_code(act))
    return y


def norm_cq_gemv_triton(x, gain, kind, packed, norms, levels, bits: int, eps: float = 1e-6,
                        block_rows: int = 16, out=None, act=None):
    _need_triton()
    _check_norm(x, gain, kind)
    act = _act(x, gain, act)
    rows = _as_rows(x)
    k_pad = _k_pad(rows.numel(), packed, bits)
    _check_cq(packed, norms, levels, bits, torch.empty(k_pad, device="meta"))  # shapes only
    n_out = packed.shape[0]
    _check_out(out, n_out, x, act)
    y = torch.empty(n_out, dtype=act, device=x.device) if out is None else out
    _norm_cq_gemv_kernel[(triton.cdiv(n_out, block_rows),)](
        rows, gain if gain is not None else rows, packed.contiguous(), norms.contiguous(),
        levels.to(torch.float32).contiguous(), y, rows.numel(), rows.shape[1], rows.stride(0),
        rows.stride(1), n_out, packed.shape[1], k_pad // GROUP, eps, 1.0 / math.sqrt(GROUP),
        KIND=KINDS.index(kind), BITS=bits, BLOCK_R=block_rows, G=GROUP, ACT=act_code(act))
    return y
