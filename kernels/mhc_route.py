"""One layer's mHC routing from its router logits, in one launch: Triton kernel and torch twin.

Given the router output r = [pre (n) | post (n) | res (n·n)] of one token and the lanes X [n, d]:

    hpre  = sigmoid(a_pre · r_pre + b_pre)                  [n]
    u     = hpre · X                                        [d]   (the lane mix fed to the block)
    hpost = 2 · sigmoid(a_post · r_post + b_post)           [n]
    P     = Sinkhorn(a_res · r_res + b_res)                 [n, n]

With an Engram site on the layer, its key ek and convolved value ev [d] gate the block input:

    alpha = sigmoid(Σ unit_rms(u) · unit_rms(ek) / sqrt(d))   []    (a 0-d view)
    bx    = u + alpha · ev                                  [d]   (without a site: bx = u)

with unit_rms(x) = x · rsqrt(mean(x²) + 1e-6).

Sinkhorn is the log-domain one of the model (spec b.7): 20 fixed iterations of "subtract each
row's max-shifted logsumexp, then each column's", then exp. Unfused that is ~80 device launches
per layer; here the n x n matrix lives in registers of a single program for all iterations.

Scalars a_* are 0-d device tensors (read in the kernel, never on the host: capturable). X may be
any strided view (the first layer's lanes are one row expanded n times): the kernel reads it
through its strides, so no copy is launched. Results come back as views of one buffer. The
kernel computes u twice when gated (once for the dot products that make alpha, once for bx),
by the same code, rather than reading back its own stores.

r, X, ek and ev may be bfloat16 or float16 (kernels/narrow.py): the arithmetic stays float32
and each result is rounded once to their dtype on the store (bx from u and alpha before their
rounding, as registers hold them).
"""
from __future__ import annotations

import math

import torch

from .narrow import act_code, act_of, is_act, narrow_torch, wide

EPS = 1e-6
MAX_LANES = 16          # the n x n matrix must fit one program's registers

try:
    import triton
    import triton.language as tl
    from .narrow import narrow
except ImportError:                        # pragma: no cover
    triton = None


class MhcRouteError(ValueError):
    """Inputs that do not describe one layer's routing (names the argument and the rule)."""


def _check(r, X, a_pre, b_pre, a_post, b_post, a_res, b_res, iters):
    if X.dim() != 2 or not is_act(X):
        raise MhcRouteError(f"X must be float32 [n, d] (or bfloat16/float16), got {X.dtype} "
                            f"{list(X.shape)}")
    n = X.shape[0]
    if not 1 <= n <= MAX_LANES:
        raise MhcRouteError(f"n={n} lanes outside 1..{MAX_LANES}")
    if r.dim() != 1 or r.shape[0] != 2 * n + n * n or r.dtype not in (torch.float32, X.dtype):
        raise MhcRouteError(f"r must be float32 [2n + n*n] = [{2 * n + n * n}] (or X's dtype), "
                            f"got {r.dtype} {list(r.shape)}")
    for name, t, shape in (("a_pre", a_pre, ()), ("a_post", a_post, ()), ("a_res", a_res, ()),
                           ("b_pre", b_pre, (n,)), ("b_post", b_post, (n,)),
                           ("b_res", b_res, (n, n))):
        if tuple(t.shape) != shape or t.dtype != torch.float32:
            raise MhcRouteError(f"{name} must be float32 {list(shape)}, got {t.dtype} "
                                f"{list(t.shape)}")
    if not isinstance(iters, int) or not 1 <= iters <= 64:
        raise MhcRouteError(f"iters={iters!r} outside 1..64")


def _check_gate(ek, ev, d):
    if (ek is None) != (ev is None):
        raise MhcRouteError("ek and ev come together (an Engram site's key and value) or not "
                            f"at all; got ek={'None' if ek is None else 'a tensor'}, "
                            f"ev={'None' if ev is None else 'a tensor'}")
    for name, t in (("ek", ek), ("ev", ev)):
        if t is not None and (tuple(t.shape) != (d,) or not is_act(t)):
            raise MhcRouteError(f"{name} must be float32 [d={d}] (or bfloat16/float16), got "
                                f"{t.dtype} {list(t.shape)}")


def _unit_rms(x):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)


def mhc_route_torch(r, X, a_pre, b_pre, a_post, b_post, a_res, b_res, iters: int = 20, *,
                    ek=None, ev=None):
    """-> (hpre [n], u [d], hpost [n], P [n, n], alpha [] or None, bx [d]), in the model's op
    order; without ek/ev, alpha is None and bx is u."""
    _check(r, X, a_pre, b_pre, a_post, b_post, a_res, b_res, iters)
    _check_gate(ek, ev, X.shape[1])
    act = act_of(r, X, ek, ev)
    if act != torch.float32:
        outs = mhc_route_torch(*(wide(t) for t in (r, X)), a_pre, b_pre, a_post, b_post, a_res,
                               b_res, iters, ek=None if ek is None else wide(ek),
                               ev=None if ev is None else wide(ev))
        return tuple(None if t is None else narrow_torch(t, act) for t in outs)
    n = X.shape[0]
    hpre = torch.sigmoid(a_pre * r[:n] + b_pre)
    u = hpre @ X
    hpost = 2 * torch.sigmoid(a_post * r[n:2 * n] + b_post)
    z = a_res * r[2 * n:].view(n, n) + b_res
    for _ in range(iters):
        z = z - torch.logsumexp(z, -1, keepdim=True)
        z = z - torch.logsumexp(z, -2, keepdim=True)
    alpha, bx = None, u
    if ek is not None:
        alpha = torch.sigmoid((_unit_rms(u) * _unit_rms(ek)).sum(-1) / math.sqrt(X.shape[1]))
        bx = u + alpha * ev
    return hpre, u, hpost, z.exp(), alpha, bx


if triton is not None:
    @triton.jit
    def _lse_rows_out(z, valid):
        """z minus each row's max-shifted logsumexp; entries outside `valid` stay -inf."""
        mx = tl.max(z, 1)
        mx = tl.where(mx == float("-inf"), 0.0, mx)          # an all-padding row
        # A real row's sum is >= 1 (its max term is exp(0)), so the clamp only keeps padding
        # rows (sum 0) away from log(0); they stay -inf through `valid`.
        s = tl.maximum(tl.sum(tl.exp(z - mx[:, None]), 1), 1.0)
        return tl.where(valid, z - (mx + tl.log(s))[:, None], float("-inf"))

    @triton.jit
    def _mhc_route_kernel(r_ptr, x_ptr, apre_ptr, bpre_ptr, apost_ptr, bpost_ptr, ares_ptr,
                          bres_ptr, ek_ptr, ev_ptr, out_ptr, n, d, sx0, sx1, sek, sev, eps,
                          inv_sqrt_d, ITERS: tl.constexpr, N: tl.constexpr,
                          BLOCK_D: tl.constexpr, HAS_GATE: tl.constexpr, ACT: tl.constexpr):
        i = tl.arange(0, N)
        lane = i < n
        hpre = tl.sigmoid(tl.load(apre_ptr) * tl.load(r_ptr + i, mask=lane, other=0.0)
                          .to(tl.float32) + tl.load(bpre_ptr + i, mask=lane, other=0.0))
        hpre = tl.where(lane, hpre, 0.0)
        hpost = 2.0 * tl.sigmoid(tl.load(apost_ptr) * tl.load(r_ptr + n + i, mask=lane, other=0.0)
                                 .to(tl.float32) + tl.load(bpost_ptr + i, mask=lane, other=0.0))
        tl.store(out_ptr + i, narrow(hpre, ACT), mask=lane)
        tl.store(out_ptr + n + i, narrow(hpost, ACT), mask=lane)

        rc = i[:, None] * n + i[None, :]
        valid = lane[:, None] & lane[None, :]
        z = (tl.load(ares_ptr) * tl.load(r_ptr + 2 * n + rc, mask=valid, other=0.0).to(tl.float32)
             + tl.load(bres_ptr + rc, mask=valid, other=0.0))
        z = tl.where(valid, z, float("-inf"))
        for _ in tl.static_range(ITERS):
            z = _lse_rows_out(z, valid)                                  # rows
            z = tl.trans(_lse_rows_out(tl.trans(z), tl.trans(valid)))    # columns
        tl.store(out_ptr + 2 * n + rc, narrow(tl.exp(z), ACT), mask=valid)

        base = out_ptr + 2 * n + n * n
        uu = tl.zeros((BLOCK_D,), tl.float32)
        ee = tl.zeros((BLOCK_D,), tl.float32)
        ue = tl.zeros((BLOCK_D,), tl.float32)
        for d0 in range(0, d, BLOCK_D):
            j = d0 + tl.arange(0, BLOCK_D)
            u = _lane_mix(x_ptr, hpre, i, lane, j, d, sx0, sx1)
            tl.store(base + j, narrow(u, ACT), mask=j < d)
            if HAS_GATE:
                ek = tl.load(ek_ptr + j * sek, mask=j < d, other=0.0).to(tl.float32)
                uu += u * u
                ee += ek * ek
                ue += u * ek
        if HAS_GATE:
            ru = 1.0 / tl.sqrt(tl.sum(uu, 0) / d + eps)
            re = 1.0 / tl.sqrt(tl.sum(ee, 0) / d + eps)
            alpha = tl.sigmoid(tl.sum(ue, 0) * ru * re * inv_sqrt_d)
            tl.store(base + d, narrow(alpha, ACT))
            for d0 in range(0, d, BLOCK_D):
                j = d0 + tl.arange(0, BLOCK_D)
                u = _lane_mix(x_ptr, hpre, i, lane, j, d, sx0, sx1)     # the bits stored above
                ev = tl.load(ev_ptr + j * sev, mask=j < d, other=0.0).to(tl.float32)
                tl.store(base + d + 1 + j, narrow(u + alpha * ev, ACT), mask=j < d)

    @triton.jit
    def _lane_mix(x_ptr, hpre, i, lane, j, d, sx0, sx1):
        """u[j] = Σ_i hpre[i] · X[i, j] for one tile of columns j."""
        x = tl.load(x_ptr + i[:, None] * sx0 + j[None, :] * sx1,
                    mask=lane[:, None] & (j[None, :] < d), other=0.0).to(tl.float32)
        return tl.sum(hpre[:, None] * x, 0)


def mhc_route_triton(r, X, a_pre, b_pre, a_post, b_post, a_res, b_res, iters: int = 20,
                     block_d: int = 128, *, ek=None, ev=None):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    _check(r, X, a_pre, b_pre, a_post, b_post, a_res, b_res, iters)
    n, d = X.shape
    _check_gate(ek, ev, d)
    gated = ek is not None
    act = act_of(r, X, ek, ev)
    base = 2 * n + n * n                 # [hpre | hpost | P | u | alpha | bx], the last two gated
    out = torch.empty(base + d + (1 + d if gated else 0), dtype=act, device=X.device)
    r, b_pre, b_post, b_res = (t.contiguous() for t in (r, b_pre, b_post, b_res))  # no-ops
    ek_t, ev_t = (ek, ev) if gated else (out, out)                  # unread without a gate
    _mhc_route_kernel[(1,)](r, X, a_pre, b_pre, a_post, b_post, a_res, b_res, ek_t, ev_t, out,
                            n, d, X.stride(0), X.stride(1), ek_t.stride(0), ev_t.stride(0),
                            EPS, 1.0 / math.sqrt(d), ITERS=iters,
                            N=triton.next_power_of_2(n), BLOCK_D=block_d, HAS_GATE=gated,
                            ACT=act_code(act))
    u = out[base:base + d]
    alpha, bx = (out[base + d], out[base + d + 1:]) if gated else (None, u)
    return out[:n], u, out[n:2 * n], out[2 * n:base].view(n, n), alpha, bx
