"""The floor a decode step is held against: the bytes of weights the step reads, streamed once.

A one-token step must read every weight matrix it multiplies (the LM head included), so no
step can be faster than a plain pass over a buffer of that many bytes on the same core. Two
passes are timed, a sum and a float32 matrix-vector product over a [rows, 1024] buffer of the
same size, warm (the step's weights are as warm: it reads the same ones every step), medians
on the calling thread count; the faster is the floor. The Engram tables are left out: a step
reads T of their rows, not the tables (tools/bench/bench_decode.py, bench_native_stages.py).
"""
from __future__ import annotations

import statistics
import time

import torch


def median_ms(fn, n):
    """Milliseconds, the median of n calls (every bench of tools/bench/ times with it)."""
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def tensor_mb(tensors) -> float:
    """MiB of the distinct storages among `tensors`."""
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            total += s.nbytes()
    return total / 2**20


def table_mb(model) -> float:
    """MiB of the Engram tables the model holds (dense float32, or packed codes and norms)."""
    nat, held = getattr(model, "_native", None), []
    if nat is not None and getattr(nat, "packed", False) and model.engrams:
        # the C step's own float32 copies of the tables' codes and norms (port/native.py
        # binds the tables last)
        return tensor_mb([t for m in nat._packed[-len(model.engrams):]
                          for t in (m.packed, m.norms)])
    for site in model.engrams:
        if site.tables is not None:
            held.append(site.tables)
        elif site.codes:                           # the packed form: codes and norms
            held += [site.codes["tables"].packed, site.codes["tables"].norms]
    return tensor_mb(held)


def floor_ms(mb: float, reps: int = 50) -> dict:
    """Medians of a sum and of a matrix-vector product over `mb` MiB of float32."""
    cols = 1024
    rows = max(1, int(mb * 2**20) // (4 * cols))
    g = torch.Generator().manual_seed(0)      # timing only, but seeded like everything else
    w = torch.randn(rows, cols, generator=g)
    x = torch.randn(cols, generator=g)
    flat = w.reshape(-1)
    for _ in range(3):                         # warm: the step's weights are warm too
        flat.sum()
        torch.mv(w, x)
    got = {"sum_ms": median_ms(lambda: flat.sum(), reps),
           "matvec_ms": median_ms(lambda: torch.mv(w, x), reps)}
    got["floor_ms"] = min(got.values())
    got["floor_mb"] = rows * cols * 4 / 2**20
    return got
