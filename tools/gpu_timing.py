"""One timer for the GPU checks in tools/device_check.sh: the median over n synchronised runs
after a warm-up, in microseconds (medians, as the project's performance rules ask)."""
import time

import torch


def median_us(f, n: int = 200, warmup: int = 20) -> float:
    for _ in range(warmup):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e6
