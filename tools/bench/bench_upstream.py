"""Upstream's jitted one-token decode timed on the same seeded weights as tools/bench/bench_decode.py.
Runs in the upstream venv (cactus-needle 2.0.8 with jax, jaxlib, flax and torch); bench_decode
calls it with --upstream-python and puts the number beside the port's.

    /path/to/upstream-venv/bin/python tools/bench/bench_upstream.py --preset shipped --at 300

Prints one JSON object: the median ms of `decode.forward_cached` (jitted, float32, batch 1,
one token at position `at`, window kv_window) after compilation. The cache and the Engram
history hold at+1 positions, as in bench_decode's reference call; upstream's cost grows with
the cache it is given (2048 slots measured 496 ms here, under load).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import jax                                       # noqa: E402
import jax.numpy as jnp                          # noqa: E402
import numpy as np                               # noqa: E402

from gen_upstream_fixture import build_params, upstream_model   # noqa: E402
from needle.model import decode as dm            # noqa: E402
from reference.config import V2Config            # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped", choices=["tiny", "shipped"])
    ap.add_argument("--at", type=int, default=300)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    cfg = V2Config.preset(args.preset)
    _, tree, _ = build_params(cfg, args.seed)
    tcfg = upstream_model(cfg).config
    M = args.at + 1
    dcfg = dm.decode_cfg(tcfg, kv_window=cfg.kv_window)
    cos, sin = dm.precompute_rope_freqs(cfg.head_dim, M, cfg.rope_theta)
    kc, vc = dm.init_kv_cache(tcfg, 1, M)
    hist = jnp.full((1, M), 5, jnp.int32)
    hv = jnp.ones((1, M), bool)
    tok = jnp.full((1, 1), 5, jnp.int32)
    pos = jnp.asarray(args.at, jnp.int32)

    def call():
        out = dm.forward_cached(tree, dcfg, tok, kc, vc, pos, cos, sin, None, False, hist, hv,
                                None)
        jax.block_until_ready(out)

    t0 = time.perf_counter()
    call()
    compile_s = time.perf_counter() - t0
    ts = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t0)
    print(json.dumps({"upstream_one_token_ms": statistics.median(ts) * 1e3,
                      "compile_s": compile_s, "jax": jax.__version__,
                      "devices": [str(d) for d in jax.devices()], "steps": args.steps,
                      "at": args.at, "numpy": np.__version__}))


if __name__ == "__main__":
    main()
