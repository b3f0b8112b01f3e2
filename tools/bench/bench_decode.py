"""Decode speed of the port against the reference, side by side in one run (issue #7).

    python tools/bench/bench_decode.py [--preset shipped] [--ports torch:dense native:cq ...]
                                 [--steps 64] [--threads 1] [--json OUT]

At the given geometry with seeded random weights, after warm-up, medians over `--steps` calls,
for each port (backend:weights; "cq" = built from the CQ model, i.e. the dequantised matrices
for native, the codes' pre-rotation rows for torch):
  * `step` ms/token at position 300 and at 1500 (past the window: the ring caps the work);
  * `prefill_batch` ms/token for a 256-token prompt vs 256 `step_prefill` calls;
  * aten ops per `step` (torch profiler), the weight bytes the model holds, and the growth of
    the process's resident set while the model is built;
  * the floor (issue 48): the weight bytes a step reads (all it holds but the Engram tables,
    of which it reads a row per table), streamed once on the same thread count in the same run
    (tools/bench/weight_floor.py: the faster of a sum and a matrix-vector product over a
    buffer of that size), and the step at position 300 as a multiple of it;
then the reference's one-token `forward_cached` at position 300 on the same weights, and the
ratios. Also the packed CQ payload (the resident size of CqWeight's "packed" form) of the same
model. Upstream JAX is optional: it is timed when `cactus-needle` imports in this interpreter
or `--upstream-python` names an interpreter that has it; otherwise the table says it was
skipped. Thread count and flush-denormal are recorded with the numbers.

Every argument is checked before the first measurement (exit 2 naming the flag), and with
`--json` the file is rewritten after each finished port, so a late failure keeps what was
measured ("complete": false until the end).
"""
from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import json
import os
import platform
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from weight_floor import floor_ms, median_ms, table_mb          # noqa: E402
from port.batch import V2Batch                                  # noqa: E402
from port.model import V2Model                                   # noqa: E402
from reference import cact                                       # noqa: E402
from reference.config import V2Config                            # noqa: E402
from reference.decode import forward_cached, init_kv_cache       # noqa: E402
from reference.params import init_params                         # noqa: E402
from ladder.cli.progress import Stages                               # noqa: E402

PROMPT = 256


def rss_mb() -> float:
    """The process's resident set now (Linux /proc; 0 where unavailable), after returning
    freed heap pages to the system (glibc malloc_trim), so load-time temporaries don't count."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return 0.0


def held_mb(model) -> float:
    """Bytes of the distinct tensor storages a model keeps: its weight dict, and the native
    step's bindings (the packed codes of native:cq live there)."""
    seen, total = set(), 0

    def walk(v):
        nonlocal total
        if isinstance(v, torch.Tensor):
            s = v.untyped_storage()
            if s.data_ptr() not in seen:
                seen.add(s.data_ptr())
                total += s.nbytes()
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)
    walk([t for _, t in model.tensors()])
    nat = getattr(model, "_native", None)
    if nat is not None:
        walk(nat._keep)
        walk([t for m in getattr(nat, "_packed", []) for t in (m.packed, m.norms, m.levels)])
    return total / 2**20


@contextlib.contextmanager
def quiet_stderr():
    """Silence file descriptor 2: the profiler's C++ side (Kineto) prints a start and a stop
    line per session there, below Python's sys.stderr."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def bench_port(model, cfg, steps, tok, say=lambda what: None):
    out = {"weights_mb": held_mb(model)}
    prompt = [next(tok) for _ in range(min(PROMPT, cfg.max_seq_len // 4))]
    say(f"prefill_batch of {len(prompt)} tokens, then {len(prompt)} step_prefill calls")
    state = model.make_state()
    model.prefill_batch(prompt[:8], model.make_state(), V2Batch(model, 64))        # warm
    t0 = time.perf_counter()
    model.prefill_batch(prompt, state, V2Batch(model, 64))
    out["prefill_batch_ms_per_token"] = (time.perf_counter() - t0) * 1e3 / len(prompt)
    probe = model.make_state()
    t0 = time.perf_counter()
    for t in prompt:
        model.step_prefill(t, probe)
    out["step_prefill_ms_per_token"] = (time.perf_counter() - t0) * 1e3 / len(prompt)
    out["prefill_ratio"] = out["step_prefill_ms_per_token"] / out["prefill_batch_ms_per_token"]
    out["prefill_bits_equal"] = bool(torch.equal(state.k, probe.k)
                                     and torch.equal(state.lanes, probe.lanes))
    last = cfg.max_seq_len - steps - 5           # 3 warm-up steps, 1 profiled
    batch = V2Batch(model, 64)
    for target in sorted({min(300, last), min(1500, last)}):
        say(f"median of {steps} steps at position {target}")
        if state.pos < target:
            model.prefill_batch([next(tok) for _ in range(target - state.pos)], state, batch)
        for _ in range(3):
            model.step(next(tok), state)                            # warm
        out[f"step_ms_at_{target}"] = median_ms(lambda: model.step(next(tok), state), steps)
    say("aten ops of one step (torch profiler)")
    from torch.profiler import profile, ProfilerActivity
    with quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
        model.step(next(tok), state)
    out["aten_ops_per_step"] = sum(e.count for e in prof.key_averages()
                                   if e.key.startswith("aten::"))
    say("the floor: the weights a step reads, streamed once")
    out["weights_read_mb"] = out["weights_mb"] - table_mb(model)
    out["floor_ms"] = floor_ms(out["weights_read_mb"])["floor_ms"]
    first = min(300, last)
    out["step_vs_floor"] = out[f"step_ms_at_{first}"] / out["floor_ms"]
    return out


def build(params, cfg, backend, weights, cact_path):
    if weights == "cq":                 # a fresh read: nothing of the file outlives the load
        return V2Model.from_cact(cact_path, "cq", backend=backend)
    return V2Model.from_params(params, cfg, backend=backend)


def upstream_ms(python, preset, at):
    """Upstream's jitted decode on the same seeded weights, via tools/bench/bench_upstream.py in the
    interpreter that has cactus-needle (this one, or --upstream-python)."""
    import importlib.util
    import subprocess
    if python is None:
        if importlib.util.find_spec("needle") is None:
            return None, "skipped: cactus-needle is not importable (give --upstream-python)"
        python = sys.executable
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_upstream.py")
    try:
        out = subprocess.run([python, script, "--preset", preset, "--at", str(at)],
                             capture_output=True, text=True)
    except OSError as e:
        return None, f"skipped: {python} does not run: {e}"
    if out.returncode != 0:
        return None, f"skipped: bench_upstream.py failed: {out.stderr.strip()[-300:]}"
    got = json.loads(out.stdout.strip().splitlines()[-1])
    return got["upstream_one_token_ms"], (f"jax {got['jax']} on {got['devices']}, compiled in "
                                          f"{got['compile_s']:.0f} s")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped", choices=["tiny", "shipped"])
    ap.add_argument("--ports", nargs="+",
                    default=["torch:dense", "torch:cq", "native:dense", "native:cq"])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", help="also write the numbers here")
    ap.add_argument("--upstream-python", help="interpreter of a venv with cactus-needle, jax, "
                                              "flax and torch (times upstream's decode too)")
    return ap


def main(argv=None):
    ap = parser()
    args = ap.parse_args(argv)
    problem = check_args(args)
    if problem:
        ap.error(problem)                           # exit 2, before any measurement
    torch.set_flush_denormal(True)
    torch.set_num_threads(args.threads)
    say = Stages("bench_decode")
    say(f"--preset {args.preset}: seeded parameters and their .cact ({len(args.ports)} ports, "
        f"then the reference)")
    cfg = V2Config.preset(args.preset)
    params = init_params(cfg, 0, perturbed=True)
    cactfile = cact.build_cact(params, cfg)
    tmp = tempfile.TemporaryDirectory()
    cact_path = os.path.join(tmp.name, "bench.cact")
    with open(cact_path, "wb") as f:
        f.write(cactfile.to_bytes())
    g = torch.Generator().manual_seed(0)
    tok = iter(torch.randint(1, cfg.vocab_size, (200000,), generator=g).tolist())
    res = {"preset": args.preset, "threads": torch.get_num_threads(), "flush_denormal": True,
           "torch": torch.__version__, "steps": args.steps, "cpu": platform.processor()
           or platform.machine(), "cores": os.cpu_count(), "ports": {}}
    if "native" in " ".join(args.ports):
        from kernels import native
        native.set_threads(args.threads)
    for i, port in enumerate(args.ports, 1):
        backend, weights = port.split(":")
        say(f"port {i}/{len(args.ports)} {port}: building")
        before = rss_mb()
        model = build(params, cfg, backend, weights, cact_path)
        grown = rss_mb() - before
        res["ports"][port] = bench_port(model, cfg, args.steps, tok,
                                        lambda what: say(f"port {i}/{len(args.ports)} {port}: "
                                                         f"{what}"))
        res["ports"][port]["rss_growth_mb_at_load"] = grown
        del model
        save(res, args.json, complete=False)
    from port.cq import CqWeight
    res["cq_packed_mb"] = sum(CqWeight.from_slot(s, "packed").nbytes for s in cactfile.slots
                              if s.dtype == cact.DTYPE_CQ) / 2**20
    at = min(300, cfg.max_seq_len - args.steps - 5)
    say(f"the reference's one-token forward_cached at position {at}")
    kc, vc = init_kv_cache(cfg, 1, at + 1)
    one = torch.tensor([[5]])
    hist, hv = torch.full((1, at + 1), 5), torch.ones(1, at + 1, dtype=torch.bool)
    forward_cached(params, cfg, one, kc, vc, at, hist=hist, hist_valid=hv)       # warm
    res["reference_one_token_ms"] = median_ms(
        lambda: forward_cached(params, cfg, one, kc, vc, at, hist=hist, hist_valid=hv),
        max(8, args.steps // 4))
    say("upstream's jitted forward_cached (bench_upstream.py)" if args.upstream_python else
        "upstream: skipped unless --upstream-python (or cactus-needle here)")
    res["upstream_one_token_ms"], res["upstream_note"] = upstream_ms(args.upstream_python,
                                                                      args.preset, at)
    for p in res["ports"].values():
        p["speedup_vs_reference"] = res["reference_one_token_ms"] / p[f"step_ms_at_{at}"]
        if res["upstream_one_token_ms"]:
            p["speedup_vs_upstream"] = res["upstream_one_token_ms"] / p[f"step_ms_at_{at}"]
    report(res, args.ports)
    save(res, args.json, complete=True)
    return res


def save(res, path, complete: bool):
    """Write the numbers so far (temp file, then rename: never a half-written JSON)."""
    if not path:
        return
    res["complete"] = complete
    with open(path + ".tmp", "w") as f:
        json.dump(res, f, indent=2)
    os.replace(path + ".tmp", path)


def check_args(args):
    """The first problem with the command line, in its words, or None."""
    from kernels import native
    for port in args.ports:
        backend, _, weights = port.partition(":")
        if backend not in ("torch", "native") or weights not in ("dense", "cq"):
            return f"--ports {port}: each port is BACKEND:WEIGHTS, torch|native : dense|cq"
        if backend == "native" and not native.available():
            return (f"--ports {port}: the native step cannot run here: "
                    f"{native.unavailable_reason().splitlines()[0]}")
    if args.steps < 1 or args.threads < 1:
        return f"--steps {args.steps} / --threads {args.threads}: both must be >= 1"
    return check_outputs(args.upstream_python, args.json)


def check_outputs(upstream_python, json_path):
    """--upstream-python must name an interpreter and --json a writable file (None: fine).
    Shared with tools/bench/bench_gpu_decode.py."""
    up = upstream_python
    if up is not None and not (os.path.isfile(up) and os.access(up, os.X_OK)):
        return (f"--upstream-python {up}: no executable interpreter there; give the python "
                f"of a venv with cactus-needle, or leave the flag out (upstream is optional)")
    if json_path:
        parent = os.path.dirname(os.path.abspath(json_path))
        if os.path.isdir(json_path) or not os.path.isdir(parent) or \
                not os.access(parent, os.W_OK):
            return f"--json {json_path}: cannot write a file there"
    return None


def report(res, ports):
    keys = list(res["ports"][ports[0]])
    print(f"{'':28s}" + "".join(f"{p:>14s}" for p in ports))
    for key in keys:
        cells = []
        for p in ports:
            v = res["ports"][p][key]
            cells.append(f"{str(v):>14s}" if isinstance(v, bool) else f"{v:14.2f}")
        print(f"{key:28s}" + "".join(cells))
    up = res["upstream_one_token_ms"]
    print(f"reference one-token forward_cached: {res['reference_one_token_ms']:.1f} ms; "
          f"upstream jitted forward_cached: "
          + (f"{up:.1f} ms ({res['upstream_note']})" if up else res["upstream_note"]))
    print("floor_ms: weights_read_mb streamed once (the faster of a sum and a matvec over a "
          "buffer that size, same run); step_vs_floor: the first step_ms_at_ row / floor_ms")
    print(f"CQ packed payload: {res['cq_packed_mb']:.2f} MB; threads {res['threads']}, "
          f"torch {res['torch']}, {res['cores']} cores, {res['cpu']}")


if __name__ == "__main__":
    main()
