"""Decode speed of the port against the reference, side by side in one run (issue #7 baseline).

    python tools/bench_decode.py [--preset shipped] [--weights dense cq] [--steps 64] [--json OUT]

At the given geometry with seeded random weights, after warm-up, medians over `--steps` calls:
port `step` at position ~300 and ~1500 (the ring caps the work past the window), the reference's
one-token `forward_cached` on the same weights (cache sized to the position), `prefill_batch`
per token vs `step_prefill` per token for a 256-token prompt, aten ops per `step` (profiler)
and resident memory after load. Thread count and flush-denormal are recorded with the numbers.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from port.batch import V2Batch                                  # noqa: E402
from port.model import V2Model                                   # noqa: E402
from reference.config import V2Config                            # noqa: E402
from reference.decode import forward_cached, init_kv_cache       # noqa: E402
from reference.params import init_params                         # noqa: E402


def median_ms(fn, n):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bench_port(model, cfg, steps, tok):
    out = {}
    state = model.make_state()
    prompt = [next(tok) for _ in range(min(256, cfg.max_seq_len // 4))]
    t0 = time.perf_counter()
    model.prefill_batch(prompt, state, V2Batch(model, 64))
    out["prefill_batch_ms_per_token"] = (time.perf_counter() - t0) * 1e3 / len(prompt)
    probe = model.make_state()
    out["step_prefill_ms_per_token"] = median_ms(lambda: model.step_prefill(next(tok), probe),
                                                 min(32, cfg.max_seq_len // 2))
    out["prefill_ratio"] = out["step_prefill_ms_per_token"] / out["prefill_batch_ms_per_token"]
    last = cfg.max_seq_len - steps - 2
    for target in sorted({min(300, last), min(1500, last)}):
        while state.pos < target:
            model.step_prefill(next(tok), state)
        model.step(next(tok), state)                               # warm
        out[f"step_ms_at_{target}"] = median_ms(lambda: model.step(next(tok), state), steps)
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model.step(next(tok), state)
    out["aten_ops_per_step"] = sum(e.count for e in prof.key_averages() if e.key.startswith("aten::"))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped", choices=["tiny", "shipped"])
    ap.add_argument("--weights", nargs="+", default=["dense", "cq"])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    cfg = V2Config.preset(args.preset)
    params = init_params(cfg, 0, perturbed=True)
    g = torch.Generator().manual_seed(0)
    tok = iter(torch.randint(1, cfg.vocab_size, (100000,), generator=g).tolist())
    res = {"preset": args.preset, "threads": torch.get_num_threads(), "flush_denormal": True,
           "torch": torch.__version__, "steps": args.steps}
    for form in args.weights:
        before = rss_mb()
        model = V2Model.from_params(params, cfg, weights=form)
        res[form] = {"rss_growth_mb_at_load": rss_mb() - before}
        res[form].update(bench_port(model, cfg, args.steps, tok))
        del model
    at = min(300, cfg.max_seq_len - args.steps - 2)
    kc, vc = init_kv_cache(cfg, 1, at + 1)
    one = torch.tensor([[5]])
    res["reference_one_token_ms"] = median_ms(
        lambda: forward_cached(params, cfg, one, kc, vc, at, hist=torch.full((1, at + 1), 5),
                               hist_valid=torch.ones(1, at + 1, dtype=torch.bool)),
        max(4, args.steps // 8))
    for form in args.weights:
        res[form]["speedup_vs_reference"] = (res["reference_one_token_ms"]
                                             / res[form][f"step_ms_at_{at}"])
    print(f"{'':28s}" + "".join(f"{f:>14s}" for f in args.weights))
    for key in res[args.weights[0]]:
        print(f"{key:28s}" + "".join(f"{res[f][key]:14.2f}" for f in args.weights))
    print(f"reference one-token forward_cached at {at}: {res['reference_one_token_ms']:.1f} ms"
          f"; threads {res['threads']}, torch {res['torch']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
