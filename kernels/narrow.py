"""The activation dtypes the fused decode kernels take, and the one rounding they apply.

A kernel loads its activations in any of ACT_DTYPES, widens them to float32 at once, computes in
float32 (in registers), and rounds each stored result to the activation dtype, round to nearest,
ties to even. That is what a bfloat16 or float16 decode body on a GPU does, and it makes the
16-bit path the float32 path plus one rounding per store: a kernel fed 16-bit inputs stores
exactly `narrow(its float32 result on the widened inputs)` (tests/port/test_fused_precision.py holds
every kernel to that, bit for bit).

Why the rounding is written out for bfloat16: Triton's interpreter converts float32 to bfloat16
by truncation (round toward zero), while a GPU's conversion rounds to nearest even, so a plain
store into a bfloat16 buffer would give the CPU tests other bits than the device. `narrow`
rounds with integer arithmetic on the float32 bits, the same on both; the store that follows
then converts an exactly representable value, which no rounding mode changes. float16 goes
through the conversion itself (nearest even on both).
"""
from __future__ import annotations

import torch

# The kernels' ACT code is the index.
ACT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

try:
    import triton
    import triton.language as tl
except ImportError:                        # pragma: no cover
    triton = None


def act_code(dtype) -> int:
    """The ACT constexpr of an activation dtype (ValueError naming the choices)."""
    if dtype not in ACT_DTYPES:
        raise ValueError(f"activation dtype {dtype} is not one of "
                         f"{[str(d).replace('torch.', '') for d in ACT_DTYPES]}")
    return ACT_DTYPES.index(dtype)


def is_act(t) -> bool:
    return t.dtype in ACT_DTYPES


def wide(t):
    """A 16-bit activation widened to float32 (exact); float32 as it is, no copy."""
    return t if t.dtype == torch.float32 else t.float()


def narrow_torch(y, act, into=None):
    """y (float32) rounded once to `act`, held in `into`'s dtype (default `act`), or written
    into `into`."""
    if into is not None:
        return into.copy_(y if act == torch.float32 else y.to(act))
    return y if act == torch.float32 else y.to(act)


def act_of(*tensors):
    """The activation dtype of a kernel call: its 16-bit activation inputs' dtype, float32 when
    every one is float32. Two different 16-bit dtypes in one call are refused."""
    low = {t.dtype for t in tensors if t is not None and t.dtype != torch.float32}
    if len(low) > 1:
        raise ValueError(f"activations in two 16-bit dtypes in one call: {sorted(map(str, low))}")
    return low.pop() if low else torch.float32


if triton is not None:
    @triton.jit
    def narrow(x, ACT: tl.constexpr):
        """float32 x rounded to the activation dtype ACT (0 float32, 1 bfloat16, 2 float16),
        held as float32: round to nearest, ties to even, NaN kept."""
        if ACT == 1:
            b = x.to(tl.uint32, bitcast=True)
            b = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
            x = tl.where(x != x, x, b.to(tl.float32, bitcast=True))
        elif ACT == 2:
            x = x.to(tl.float16).to(tl.float32)
        return x
