"""One timer for the GPU checks in tools/device_check.sh: the median over n synchronised runs
after a warm-up, in microseconds (medians, as the project's performance rules ask).

`sync` waits for the device's queued work; the default is CUDA's. On the CPU the work is done
when the call returns, so tools/bench/bench_gpu_decode.py passes `sync=cpu_sync` there."""
import time

import torch


def cpu_sync() -> None:
    """Nothing to wait for: a CPU call has finished its work when it returns."""


def median_us(f, n: int = 200, warmup: int = 20, sync=None) -> float:
    sync = torch.cuda.synchronize if sync is None else sync
    for _ in range(warmup):
        f()
    sync()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        f()
        sync()
        ts.append(time.perf_counter() - t0)
    return sorted(ts)[n // 2] * 1e6
