"""CqWeight at the shipped needle2 geometry: resident memory per form, matvec agreement, time.

    .venv/bin/python tools/bench/bench_cq.py [--threads 1]

Every CQ matrix of the shipped model (embedding, 27 layers x q/k/v/gate/out, the three mHC
routers, both Engram sites' tables and projections; bits map embedding=4,mhc=4,default=2) is
built with random codes and norms in each form. Reported:
  * resident bytes: the tensors each form keeps (packed = the file's CQ payload), and the
    process RSS growth while building the whole model in that form;
  * agreement: max|y - y_exact| / max|y_exact| at 512x512, 256x512, 8192x512 (2 and 4 bits),
    y_exact = the exactly dequantised matrix times x in float64;
  * time per matvec (median of repeats) at those shapes, and for prepare_input.
Numbers, not assertions: tests/port/test_cq.py holds the bounds.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

import torch                                     # noqa: E402

from port.cq import CqWeight                     # noqa: E402
from reference import cq                         # noqa: E402
from reference.cact_layout import CQ, canon      # noqa: E402
from reference.config import V2Config            # noqa: E402

BITS_MAP = "embedding=4,mhc=4,default=2"


def rss() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def trimmed_rss() -> int:
    """RSS after handing freed heap pages back, so transients of construction do not count."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rss()


def random_packed(out, in_dim, bits, g):
    """Random payload straight in its stored form (every byte value is valid at 2 and 4
    bits), so building the model allocates little besides what the weights keep."""
    in_pad = cq.padded(in_dim)
    packed = torch.randint(0, 256, (out, in_pad * bits // 8), generator=g, dtype=torch.uint8)
    return packed, (torch.rand(out, in_pad // cq.GROUP, generator=g) * 2 + 0.05).half()


def random_record(out, in_dim, bits, g):
    in_pad = cq.padded(in_dim)
    idx = torch.randint(0, cq.num_levels(bits), (out, in_pad), generator=g).to(torch.uint8)
    norms = (torch.rand(out, in_pad // cq.GROUP, generator=g) * 2 + 0.05).half()
    return cq.pack(idx, bits), norms, idx


def whole_model(form):
    cfg = V2Config.preset("shipped")
    table, default = cq.parse_bits_map(BITS_MAP)
    g = torch.Generator().manual_seed(0)
    records = [(s, cq.bits_for(s.name, table, default)) for s in canon(cfg) if s.kind == CQ]
    assert {bits for _, bits in records} <= {2, 4}
    before = trimmed_rss()
    weights = []
    for spec, bits in records:
        packed, norms = random_packed(*spec.shape, bits, g)
        weights.append(CqWeight(packed, norms, bits, spec.shape[1], form))
        del packed, norms
    grown = trimmed_rss() - before
    n_params = sum(s.shape[0] * s.shape[1] for s, _ in records)
    return len(weights), n_params, sum(w.nbytes for w in weights), grown


def median_time(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, flush_denormal on")
    print("\nresident memory, whole shipped model (CQ matrices only):")
    for form in ("packed", "dense"):
        n, params, held, grown = whole_model(form)
        print(f"  {form:6s}: {n} matrices, {params / 1e6:.2f} M weights, tensors held "
              f"{held / 1e6:.2f} MB, RSS growth {grown / 1e6:.1f} MB")
    print("\nagreement with the exact matvec (max rel of max|y|) and time per call:")
    g = torch.Generator().manual_seed(1)
    for out, in_dim in ((512, 512), (256, 512), (8192, 512)):
        for bits in (2, 4):
            packed, norms, idx = random_record(out, in_dim, bits, g)
            exact = cq.dequantize(idx, norms, bits, in_dim).double()
            x = torch.randn(in_dim, generator=g)
            want = exact @ x.double()
            line = f"  {out:5d}x{in_dim} {bits}-bit:"
            for form in ("dense", "packed"):
                w = CqWeight(packed, norms, bits, in_dim, form)
                xp = w.prepare_input(x)
                y = w.matvec_prepared(xp)
                err = float((y.double() - want).abs().max() / want.abs().max())
                t = median_time(lambda: w.matvec_prepared(xp), 30 if form == "dense" else 10)
                line += f"  {form} {err:.2e} {t * 1e6:8.1f} us"
            print(line)
    w = CqWeight(*random_record(512, 512, 2, g)[:2], 2, 512, "dense")
    x = torch.randn(512)
    print(f"\nprepare_input (FWHT of 512 = 4 groups): "
          f"{median_time(lambda: w.prepare_input(x), 200) * 1e6:.1f} us")


if __name__ == "__main__":
    main()
