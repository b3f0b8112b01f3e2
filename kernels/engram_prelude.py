"""One Engram site's decode prelude in one launch: Triton kernel and torch twin.

For the T n-gram tables of a site, at one position:

    e     = (tables[rows] · ok[:, None]).reshape(-1)        [F = T·sub]  the fetched rows
    kv    = e @ W                                           [2d]   the site's key|value product
    k     = kv[:d],  vraw = kv[d:]
    vring[eslot] = vraw                                     the value ring, written in place
    v     = Σ_j taps[j] · vring[tap_slots[j]] · tap_ok[j]   j = 0, 1, ... in that order
    ->  [k | v]  (kv with its value half replaced by the convolved value)

`rows` holds the flat row of each table's n-gram, `ok` its validity (1.0 / 0.0), `eslot` the
ring slot of this position, `tap_slots` / `tap_ok` the slot and validity of each tap (tap 0 is
this position: tap_slots[0] == eslot). All are device buffers the host fills before a graph
replay: nothing here reads a device value on the host.

Weight forms, as in kernels/norm_gemv.py:
  dense   W float32 [F, 2d], any strides; with rotate=True W is [F_pad, 2d] (the pre-rotation
          rows) and e is zero-padded to F_pad and rotated per 128-group first.
  cq      cq = (packed, norms, levels, bits), kernels/cq_gemv.py's contract; always rotated
          (rotate is not consulted).

The kernel gives each program a block of output columns. The program that computes value
columns c writes them into the ring and convolves exactly those columns, so no program reads a
ring entry another one writes; the fresh row it takes from registers (tap slot == eslot), every
other tap from the ring.

Below float32 (kernels/narrow.py): the ring and `out` may be bfloat16 or float16, the tables and
a dense W float32, bfloat16 or float16. The product and the convolution run in float32; the
product is rounded once to the activation dtype `act` (default: the ring's) before it is stored
and before its fresh row enters the convolution (the ring holds that rounded row, and every tap
reads what the ring holds), and the convolved value is rounded once on its store.
"""
from __future__ import annotations

import math

import torch

from .cq_gemv import GROUP, _check as _check_cq, cq_gemv_torch
from .fwht import fwht_torch
from .narrow import ACT_DTYPES, act_code, is_act, narrow_torch, wide

try:
    import triton
    import triton.language as tl
    from .cq_gemv import group_codes
    from .norm_gemv import _rotate128
    from .narrow import narrow
except ImportError:                        # pragma: no cover
    triton = None


class EngramPreludeError(ValueError):
    """Inputs that do not describe one Engram site's prelude (names the argument and rule)."""


def _need(ok, what):
    if not ok:
        raise EngramPreludeError(what)


def _desc(t):
    return f"{t.dtype} {list(t.shape)}"


def _check(tables, rows, ok, w, vring, eslot, taps, tap_slots, tap_ok, rotate, cq, out):
    """-> (d, F, F_pad or F): the model width, fetched features and the product's input rows."""
    _need(tables.dim() == 2 and is_act(tables),
          f"tables must be float32 [T*S, sub] (or bfloat16/float16), got {_desc(tables)}")
    _need(rows.dim() == 1 and rows.dtype == torch.int64 and rows.numel() >= 1,
          f"rows must be int64 [T], got {_desc(rows)}")
    T = rows.shape[0]
    F = T * tables.shape[1]
    _need(tuple(ok.shape) == (T,) and ok.dtype == torch.float32,
          f"ok must be float32 [T={T}], got {_desc(ok)}")
    _need(vring.dim() == 2 and is_act(vring),
          f"vring must be float32 [R, d] (or bfloat16/float16), got {_desc(vring)}")
    d = vring.shape[1]
    _need(tuple(eslot.shape) == (1,) and eslot.dtype == torch.int64,
          f"eslot must be int64 [1], got {_desc(eslot)}")
    _need(taps.dim() == 2 and taps.shape[1] == d and taps.dtype == torch.float32,
          f"taps must be float32 [J, d={d}], got {_desc(taps)}")
    J = taps.shape[0]
    _need(tuple(tap_slots.shape) == (J,) and tap_slots.dtype == torch.int64,
          f"tap_slots must be int64 [J={J}], got {_desc(tap_slots)}")
    _need(tuple(tap_ok.shape) == (J,) and tap_ok.dtype == torch.float32,
          f"tap_ok must be float32 [J={J}], got {_desc(tap_ok)}")
    _need((w is None) != (cq is None), "give exactly one weight form: w (dense) or cq (packed)")
    if cq is not None:
        packed, norms, levels, bits = cq
        k_in = packed.shape[1] * 8 // bits if bits in (2, 3, 4) and packed.dim() == 2 else -1
        _need(k_in >= F and k_in % GROUP == 0,
              f"cq packed rows ({_desc(packed)}, bits={bits}) must hold a multiple of "
              f"{GROUP} codes >= F={F}")
        _check_cq(packed, norms, levels, bits, torch.empty(k_in, device="meta"))
        _need(packed.shape[0] == 2 * d, f"cq has {packed.shape[0]} rows; 2d = {2 * d} needed")
    else:
        k_in = -(-F // GROUP) * GROUP if rotate else F
        _need(w.dim() == 2 and is_act(w) and tuple(w.shape) == (k_in, 2 * d),
              f"w must be float32 [{k_in}, 2d={2 * d}] (F={F}"
              f"{', padded to whole 128-groups for rotate' if rotate else ''}), got {_desc(w)}")
    _need(out is None or (tuple(out.shape) == (2 * d,) and is_act(out)
                          and out.is_contiguous() and out.device == vring.device),
          f"out must be a contiguous float32 [2d={2 * d}] on {vring.device}, got "
          f"{None if out is None else (_desc(out), out.stride(), str(out.device))}")
    return d, F, k_in


def _act(act, vring):
    act = vring.dtype if act is None else act
    _need(act in ACT_DTYPES, f"act={act} is not one of {ACT_DTYPES}")
    return act


def engram_prelude_torch(tables, rows, ok, w, vring, eslot, taps, tap_slots, tap_ok, *,
                         rotate=False, cq=None, out=None, act=None):
    """-> kv [2d] = [k | v]; writes vring[eslot] (see the module docstring)."""
    d, F, k_in = _check(tables, rows, ok, w, vring, eslot, taps, tap_slots, tap_ok, rotate,
                        cq, out)
    act = _act(act, vring)
    e = (wide(tables[rows]) * ok[:, None]).reshape(-1)
    if cq is not None or rotate:
        e = fwht_torch(torch.nn.functional.pad(e, (0, k_in - F)))
    kv = e @ wide(w) if cq is None else cq_gemv_torch(*cq, e)
    if act != torch.float32:
        kv = narrow_torch(kv, act).float()
    vring.index_copy_(0, eslot, kv[None, d:].to(vring.dtype))
    tapped = wide(vring.index_select(0, tap_slots))        # after the write: tap 0 is vraw
    v = torch.zeros_like(kv[d:])
    for j in range(taps.shape[0]):
        v = v + taps[j] * tapped[j] * tap_ok[j]
    kv = narrow_torch(torch.cat([kv[:d], v]), act)
    return kv if out is None else out.copy_(kv)


if triton is not None:
    @triton.jit
    def _fetched(tb_ptr, rows_ptr, ok_ptr, k, F, SUB, st0, st1):
        """e[k] for one tile of k: table k // SUB, column k % SUB, times that n-gram's ok."""
        kmask = k < F
        t = k // SUB
        row = tl.load(rows_ptr + t, mask=kmask, other=0)
        x = tl.load(tb_ptr + row * st0 + (k % SUB) * st1, mask=kmask, other=0.0).to(tl.float32)
        return x * tl.load(ok_ptr + t, mask=kmask, other=0.0)

    @triton.jit
    def _finish(acc, o, omask, d, out_ptr, ring_ptr, sr0, sr1, es_ptr, taps_ptr, stj, stc,
                ts_ptr, tok_ptr, J, ACT: tl.constexpr):
        """Store the key columns; write the value columns into the ring and convolve them."""
        acc = narrow(acc, ACT)
        is_v = omask & (o >= d)
        c = o - d
        tl.store(out_ptr + o, acc, mask=omask & (o < d))
        es = tl.load(es_ptr)
        tl.store(ring_ptr + es * sr0 + c * sr1, acc, mask=is_v)
        v = tl.zeros(acc.shape, tl.float32)
        for j in range(0, J):
            slot = tl.load(ts_ptr + j) + 0 * c                   # one slot, column-shaped
            fresh = slot == es
            row = tl.load(ring_ptr + slot * sr0 + c * sr1, mask=is_v & (slot != es),
                          other=0.0).to(tl.float32)
            row = tl.where(fresh, acc, row)
            tap = tl.load(taps_ptr + j * stj + c * stc, mask=is_v, other=0.0)
            v = v + tap * row * tl.load(tok_ptr + j)
        tl.store(out_ptr + o, narrow(v, ACT), mask=is_v)

    @triton.jit
    def _engram_dense_kernel(tb_ptr, rows_ptr, ok_ptr, w_ptr, out_ptr, ring_ptr, es_ptr,
                             taps_ptr, ts_ptr, tok_ptr, F, SUB, st0, st1, KW, d, swk, swn,
                             sr0, sr1, stj, stc, J, scale, ROTATE: tl.constexpr,
                             BLOCK_N: tl.constexpr, G: tl.constexpr, ACT: tl.constexpr):
        o = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        omask = o < 2 * d
        acc = tl.zeros((BLOCK_N,), tl.float32)
        for k0 in range(0, KW, G):
            k = k0 + tl.arange(0, G)
            e = _fetched(tb_ptr, rows_ptr, ok_ptr, k, F, SUB, st0, st1)
            if ROTATE:
                e = _rotate128(e, scale, G)
            w = tl.load(w_ptr + k[:, None] * swk + o[None, :] * swn,
                        mask=(k[:, None] < KW) & omask[None, :], other=0.0).to(tl.float32)
            acc += tl.sum(e[:, None] * w, 0)
        _finish(acc, o, omask, d, out_ptr, ring_ptr, sr0, sr1, es_ptr, taps_ptr, stj, stc,
                ts_ptr, tok_ptr, J, ACT)

    @triton.jit
    def _engram_cq_kernel(tb_ptr, rows_ptr, ok_ptr, p_ptr, n_ptr, l_ptr, out_ptr, ring_ptr,
                          es_ptr, taps_ptr, ts_ptr, tok_ptr, F, SUB, st0, st1, d, row_bytes,
                          groups, sr0, sr1, stj, stc, J, scale, BITS: tl.constexpr,
                          BLOCK_R: tl.constexpr, G: tl.constexpr, ACT: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rmask = r < 2 * d
        kk = tl.arange(0, G)
        acc = tl.zeros((BLOCK_R,), tl.float32)
        for g in range(0, groups):
            xr = _rotate128(_fetched(tb_ptr, rows_ptr, ok_ptr, g * G + kk, F, SUB, st0, st1),
                            scale, G)
            code = group_codes(p_ptr, r, rmask, row_bytes, g, BITS, G)
            dot = tl.sum(tl.load(l_ptr + code) * xr[None, :], axis=1)
            nrm = tl.load(n_ptr + r * groups + g, mask=rmask, other=0.0).to(tl.float32)
            acc += nrm * dot
        _finish(acc, r, rmask, d, out_ptr, ring_ptr, sr0, sr1, es_ptr, taps_ptr, stj, stc,
                ts_ptr, tok_ptr, J, ACT)


def engram_prelude_triton(tables, rows, ok, w, vring, eslot, taps, tap_slots, tap_ok, *,
                          rotate=False, cq=None, out=None, block_n: int = 32,
                          block_rows: int = 16, act=None):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    d, F, k_in = _check(tables, rows, ok, w, vring, eslot, taps, tap_slots, tap_ok, rotate,
                        cq, out)
    # Device buffers the host fills are contiguous already: these are no-ops then.
    rows, ok, eslot, tap_slots, tap_ok = (t.contiguous()
                                          for t in (rows, ok, eslot, tap_slots, tap_ok))
    act = _act(act, vring)
    out = torch.empty(2 * d, dtype=act, device=vring.device) if out is None else out
    common = (tables.shape[1], tables.stride(0), tables.stride(1))
    ring = (vring.stride(0), vring.stride(1), taps.stride(0), taps.stride(1),
            taps.shape[0], 1.0 / math.sqrt(GROUP))
    if cq is None:
        _engram_dense_kernel[(triton.cdiv(2 * d, block_n),)](
            tables, rows, ok, w, out, vring, eslot, taps, tap_slots, tap_ok, F, *common, k_in,
            d, w.stride(0), w.stride(1), *ring, ROTATE=rotate, BLOCK_N=block_n, G=GROUP,
            ACT=act_code(act))
    else:
        packed, norms, levels, bits = cq
        _engram_cq_kernel[(triton.cdiv(2 * d, block_rows),)](
            tables, rows, ok, packed.contiguous(), norms.contiguous(),
            levels.to(torch.float32).contiguous(), out, vring, eslot, taps, tap_slots, tap_ok,
            F, *common, d, packed.shape[1], k_in // GROUP, *ring, BITS=bits,
            BLOCK_R=block_rows, G=GROUP, ACT=act_code(act))
    return out
