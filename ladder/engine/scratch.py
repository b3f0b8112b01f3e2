"""Work arrays the batched pass (batch.py, systematic_sums.py) reuses from one chunk to the next.

A comparison measures each step's points in chunks of up to batch.CHUNK elements, and every
chunk needs about a dozen element-sized temporaries (2 MB each in float64). Allocated fresh,
each is a block large enough that glibc maps it on allocation and unmaps it on free, so every
chunk paid its temporaries' page faults again: a third of a streamed compare's time went to
first touches (tools/bench/bench_compare_stream.py: 1.43-1.49 s against 0.88-0.94 s with the
allocator told to keep its blocks). Held here, one array per named slot and per thread, they
are faulted in once.

A slot is one live temporary: a caller never takes the same slot twice while the first view
is in use, and nothing taken here outlives the call that took it (results are copied out or
are per-position arrays, far smaller). What is held is bounded: a request over LIMIT elements
(one point larger than a chunk) gets an array of its own, freed as usual.
"""
from __future__ import annotations

import threading

import numpy as np

LIMIT = 1 << 19          # elements held per slot at most: twice batch.CHUNK

_local = threading.local()


def take(slot: str, n: int, dtype=np.float64) -> np.ndarray:
    """An uninitialised array of `n` elements of `dtype` for `slot`, reused across calls."""
    dtype = np.dtype(dtype)
    if n > LIMIT:
        return np.empty(n, dtype)
    held = getattr(_local, "held", None)
    if held is None:
        held = _local.held = {}
    buf = held.get((slot, dtype))
    if buf is None or buf.size < n:
        buf = held[(slot, dtype)] = np.empty(max(n, 1 << 12), dtype)
    return buf[:n]


def concatenate(slot: str, parts: list, dtype) -> np.ndarray:
    """np.concatenate of 1-D `parts` (one dtype) into `slot`."""
    out = take(slot, sum(p.size for p in parts), dtype)
    return np.concatenate(parts, out=out)


def held_bytes() -> int:
    """What this thread holds (tests and benches)."""
    return sum(b.nbytes for b in getattr(_local, "held", {}).values())

