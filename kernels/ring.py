"""Ring-buffer arithmetic of the attention runtime (attn_v41 spec §4.1), torch and Triton.

`ring_put` writes one row at slot `pos % window`, the position read from a device tensor so a
captured graph can replay it at any position. `window_topk_idxs` builds the window selection:
for a prefill chunk at position 0 each query's causal window into the chunk's own rows; for a
one-token decode the ring slots oldest first, `-1` (absent) where the ring has not reached yet —
which puts the `-1` entries first while the ring fills, e.g. [-1, -1, -1, -1, 0, 1, 2, 3] for
window 8 at position 3 (the official V4.1 order).
"""
from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:                        # pragma: no cover
    triton = None


class RingError(ValueError):
    """Arguments the ring helpers refuse (names the value and the limit)."""


def window_topk_idxs(window: int, m: int, start_pos: int) -> torch.Tensor:
    """Selection [m, min(m, window)] for a prefill at 0, or [1, window] for a decode step."""
    if window < 1 or m < 1 or start_pos < 0:
        raise RingError(f"window={window}, m={m} must be >= 1 and start_pos={start_pos} >= 0")
    if start_pos == 0:
        cols = min(m, window)
        t = torch.arange(m)[:, None]
        base = (t - window + 1).clamp_min(0)
        j = base + torch.arange(cols)[None, :]
        return torch.where(j <= t, j, torch.full_like(j, -1))
    if m != 1:
        raise RingError(f"a decode step (start_pos={start_pos}) takes m=1 query, got m={m}")
    oldest = start_pos % window + 1
    slots = (oldest + torch.arange(window)) % window
    return torch.where(slots <= start_pos, slots, torch.full_like(slots, -1))[None]


def ring_put_torch(ring, row, pos, window: int):
    """ring[pos % window] = row along axis 0; `pos` is a 1-element int64 tensor (no host read)."""
    _check(ring, row, pos, window)
    ring.index_copy_(0, pos.reshape(1).remainder(window), row.reshape(1, *ring.shape[1:]))
    return ring


def _check(ring, row, pos, window):
    if not 1 <= window <= ring.shape[0]:
        raise RingError(f"window={window} outside 1..ring slots={ring.shape[0]}")
    if row.numel() != ring[0].numel():
        raise RingError(f"row has {row.numel()} values; a ring slot holds {ring[0].numel()}")
    if pos.numel() != 1 or pos.dtype not in (torch.int32, torch.int64):
        raise RingError(f"pos must be one integer on the device, got {pos.dtype} "
                        f"{list(pos.shape)}")


if triton is not None:
    @triton.jit
    def _ring_put_kernel(ring_ptr, row_ptr, pos_ptr, window, n, BLOCK: tl.constexpr):
        slot = tl.load(pos_ptr).to(tl.int64) % window
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(ring_ptr + slot * n + offs, tl.load(row_ptr + offs, mask=mask), mask=mask)


def ring_put_triton(ring, row, pos, window: int):
    if triton is None:
        raise RuntimeError("Triton is not installed on this platform")
    _check(ring, row, pos, window)
    if not ring.is_contiguous():
        raise RingError("ring must be contiguous for the Triton kernel")
    n = ring[0].numel()
    block = min(1024, triton.next_power_of_2(n))
    _ring_put_kernel[(triton.cdiv(n, block),)](ring, row.contiguous().to(ring.dtype),
                                               pos.reshape(1), window, n, BLOCK=block)
    return ring
