"""The port's elementwise and per-row operations, each written so a row's bits do not depend
on how many rows share the call (step and batched prefill stay bit-identical)."""
from __future__ import annotations

import torch

EPS = 1e-6


def _lanewise(fn, x):
    """fn applied through torch's SIMD body only. Its vector and scalar-tail code paths for
    sigmoid/silu round differently, and which one an element takes depends on how many
    elements share the call; padding to a multiple of 64 sends every element down the vector
    path, so a value's bits do not depend on the rows batched with it."""
    flat = x.reshape(-1)
    n = flat.numel()
    buf = torch.zeros(-(-n // 64) * 64, dtype=x.dtype, device=x.device)
    buf[:n] = flat
    return fn(buf)[:n].view(x.shape)


def sigmoid(x):
    return _lanewise(torch.sigmoid, x)


def silu(x):
    return _lanewise(torch.nn.functional.silu, x)


def zc(x, g):
    return (1.0 + g) * x / torch.sqrt((x * x).mean(-1, keepdim=True) + EPS)


def unit_rms(x):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS)


def log_sinkhorn(z, iters: int = 20):
    for _ in range(iters):
        z = z - torch.logsumexp(z, -1, keepdim=True)
        z = z - torch.logsumexp(z, -2, keepdim=True)
    return z.exp()


def rowvecs(x, wt):
    """x [m, k] @ wt [k, n] as m independent M=1 products (bmm over an expanded weight).

    A plain [m, k] @ [k, n] picks BLAS kernels by m, so a row's bits would depend on how
    many rows travel with it; one product per row keeps step and prefill bit-identical.
    With more than one thread that is not enough: a batch of one lets the BLAS split the row's
    own reduction across threads (measured with 2 threads: [1, 2048] @ [2048, 24] and
    [1, 512] @ [512, 512]), a larger batch hands each thread whole rows. So then every row is
    its own call, the shape a decode step makes."""
    if x.shape[0] > 1 and torch.get_num_threads() > 1:
        return torch.cat([rowvecs(x[r:r + 1], wt) for r in range(x.shape[0])])
    return torch.bmm(x[:, None, :], wt.expand(x.shape[0], *wt.shape))[:, 0]
