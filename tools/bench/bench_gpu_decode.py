"""Milliseconds per decode token on the device: eight configurations side by side (issue 12).

    python tools/bench/bench_gpu_decode.py [--preset shipped] [--device cuda] [--configs ...]
                                     [--steps 100] [--warm 300] [--launches COUNTS.json]
                                     [--threads N] [--json OUT] [--compile]
                                     [--upstream-python PATH]

Configurations are BACKEND:DECODE:WEIGHTS, backend torch|triton, decode eager|graph, weights
dense|cq (all eight by default), or BACKEND:DECODE:WEIGHTS:PRECISION for the fused body below
float32 (LOW_CONFIGS: triton at bfloat16, weights rounded at load; tools/device_check.sh asks
for them on a GPU). The model is built once per weight form from seeded random
weights (`init_params(cfg, 0, perturbed=True)`, "cq" through the .cact writer's quantiser) and
each configuration is `V2Model.new` over the same parts. Per configuration, on a fresh state:

  * fast-forward: the first positions go in as one batched prefill (`prefill_batch` leaves the
    state bit for bit as single steps would; it only saves warm-up time), then a few
    `model.step` calls up to position `--warm` (the graph is captured at the first of them);
  * the step at position `--warm`: its logits against the torch backend's eager logits with
    the same weights at the same position (column "vs torch eager", max |dlogits|; a cq row is
    compared with torch:eager:cq, so the column shows the backend, not the quantisation);
  * the median of `--steps` further steps (after a few untimed ones): tools/bench/gpu_timing.py's
    synchronised median on CUDA, a perf_counter median on the CPU.

Tokens are (17 * position) % vocab_size. Launches per token come from the JSON of
`python tools/bench/count_launches.py --eager --json F` (graph rows: the graph body; eager rows: one
eager step), given with `--launches F`; a missing file or entry shows "n/a". `--compile` adds
the torch.compile anchor: the torch backend's `DecodeGraph.body` wrapped in `torch.compile`
(default mode) and captured in one CUDA graph (CUDA only; several minutes of compile at the
shipped geometry, printed). `--upstream-python` adds upstream's jitted `forward_cached` at the
same position, run by tools/bench/bench_upstream.py in that interpreter.

A configuration that raises is listed as failed and the others still run; the exit status is
then 1. Bad flags: exit 2 with one line. `--json` is rewritten after every row (temp file and
rename), "complete" false until the end.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from bench_decode import check_outputs, save                   # noqa: E402
from gpu_timing import cpu_sync, median_us                     # noqa: E402
from ladder.cli.progress import Stages                             # noqa: E402
from reference.config import V2Config                           # noqa: E402

BACKENDS, DECODES, WEIGHTS = ("torch", "triton"), ("eager", "graph"), ("dense", "cq")
CONFIGS = [f"{b}:{m}:{w}" for w in WEIGHTS for b in BACKENDS for m in DECODES]
LOW_CONFIGS = ["triton:eager:dense:bfloat16", "triton:graph:dense:bfloat16",
               "triton:graph:cq:bfloat16"]
ALL_CONFIGS = CONFIGS + LOW_CONFIGS
SETTLE = 3                      # model.step calls before the compared step (capture, caches)
LAUNCH_FILE_CAP = 16 << 20      # a count file is small; refuse anything larger
COMPILE_ROW = "torch.compile(torch graph body)"
UPSTREAM_ROW = "upstream jax forward_cached"


def defaults(device: str) -> dict:
    """Timed steps, target position and untimed steps before timing, per device kind: the CPU
    (triton under the interpreter) gets few, so the table still comes out in seconds on tiny."""
    if device == "cuda":
        return {"steps": 100, "warm": 300, "untimed": 10}
    return {"steps": 5, "warm": 12, "untimed": 1}


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):                      # exit 2 with one line, no usage block
        print(f"bench_gpu_decode: {message}", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    choices=["cuda", "cpu"])
    ap.add_argument("--configs", nargs="+", default=CONFIGS, metavar="BACKEND:DECODE:WEIGHTS")
    ap.add_argument("--steps", type=int, help="timed steps per configuration "
                                              "(default 100 on CUDA, 5 on the CPU)")
    ap.add_argument("--warm", type=int, help="position of the first measured step (default 300 "
                                             "on CUDA, 12 on the CPU, capped by max_seq_len)")
    ap.add_argument("--threads", type=int, help="torch threads (default 1 on the CPU, as in "
                                                "tools/bench/bench_decode.py; torch's own on CUDA)")
    ap.add_argument("--launches", help="JSON written by tools/bench/count_launches.py --json")
    ap.add_argument("--json", help="also write the table here")
    ap.add_argument("--compile", action="store_true",
                    help="add the torch.compile anchor row (CUDA only; minutes of compile)")
    ap.add_argument("--upstream-python", help="interpreter of a venv with cactus-needle and jax "
                                              "(adds upstream's decode at the same position)")
    return ap


def check_args(a):
    """Fill the device defaults in; the first problem with the command line, or None."""
    try:
        cfg = V2Config.preset(a.preset)
    except (KeyError, ValueError) as e:
        return f"--preset {a.preset}: unknown preset ({e})"
    if a.device == "cuda" and not torch.cuda.is_available():
        return "--device cuda: no CUDA device here (give --device cpu)"
    for c in a.configs:
        if c not in ALL_CONFIGS:
            return (f"--configs {c}: each is BACKEND:DECODE:WEIGHTS[:PRECISION], one of "
                    f"{', '.join(ALL_CONFIGS)}")
    d = defaults(a.device)
    a.untimed = d["untimed"]
    a.steps = d["steps"] if a.steps is None else a.steps
    if a.steps < 1:
        return f"--steps {a.steps}: must be >= 1"
    if a.threads is None and a.device == "cpu":
        a.threads = 1
    if a.threads is not None and a.threads < 1:
        return f"--threads {a.threads}: must be >= 1"
    room = cfg.max_seq_len - 1 - a.untimed - a.steps       # the last position a run may reach
    if a.warm is None:
        a.warm = min(d["warm"], room)
    if a.warm < 1 or a.warm > room:
        return (f"--warm {a.warm} / --steps {a.steps}: the measured step must sit at a position "
                f">= 1 (0 is a prefill) and {a.warm} + {a.untimed} untimed + {a.steps} steps "
                f"must stay below max_seq_len={cfg.max_seq_len}")
    for flag, path in (("--launches", a.launches), ("--upstream-python", a.upstream_python)):
        if path is not None and os.path.exists(path) and not os.path.isfile(path):
            return f"{flag} {path}: not a regular file"
    problem = check_outputs(a.upstream_python, a.json)
    if problem:
        return problem
    a.cfg = cfg
    return None


def read_launches(path, preset):
    """({"backend:weights": {"graph": n, "eager": n}}, note). A missing file gives no counts
    and a note (the table still comes out); a malformed one raises ValueError."""
    if path is None:
        return {}, "launches: not given (python tools/bench/count_launches.py --eager --json F)"
    if not os.path.exists(path):
        return {}, f"launches: {path} does not exist (did count_launches fail?)"
    if os.path.getsize(path) > LAUNCH_FILE_CAP:
        raise ValueError(f"--launches {path}: {os.path.getsize(path)} bytes, over the "
                         f"{LAUNCH_FILE_CAP}-byte cap for a count file")
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        configs = doc["configs"]
        counts = {k: {"graph": int(v["total"]),
                      "eager": None if v.get("eager_total") is None else int(v["eager_total"])}
                  for k, v in configs.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"--launches {path}: not a count_launches JSON ({type(e).__name__}: "
                         f"{e})") from None
    if doc.get("preset") != preset:
        return {}, f"launches: {path} counts preset {doc.get('preset')!r}, not {preset!r}: n/a"
    return counts, f"launches: {path} (preset {preset}; graph rows count the body)"


class Bench:
    """Runs configurations on one device and keeps the table."""

    def __init__(self, a, counts):
        self.a, self.cfg, self.dev, self.counts = a, a.cfg, torch.device(a.device), counts
        self.sync = torch.cuda.synchronize if self.dev.type == "cuda" else cpu_sync
        self.reference, self.bases = {}, {}
        self.say = Stages("bench_gpu_decode")      # one stderr line per stage: never silent

    def token(self, pos: int) -> int:
        return (17 * pos) % self.cfg.vocab_size

    def base(self, weights: str, precision=None):
        """The model of this weight form (and precision: weights rounded at load), built once;
        a build that failed is not retried (the cq quantiser takes seconds): every
        configuration of the form reports its exception."""
        key = (weights, precision["activations"] if precision else None)
        if key not in self.bases:
            self.say(f"building the {weights} model (--preset {self.a.preset}"
                     f"{', ' + key[1] if precision else ''})")
            from port.model import V2Model
            from reference.params import init_params
            torch.manual_seed(0)
            params = init_params(self.cfg, 0, perturbed=True)
            try:
                self.bases[key] = V2Model.from_params(params, self.cfg, weights=weights,
                                                      device=self.dev, precision=precision)
            except Exception as e:
                self.bases[key] = e
        if isinstance(self.bases[key], Exception):
            raise self.bases[key]
        return self.bases[key]

    def make_model(self, backend: str, decode: str, weights: str, precision=None):
        from port.model import V2Model
        return V2Model.new(self.cfg, *self.base(weights, precision).parts, device=self.dev,
                           backend=backend, decode=decode, precision=precision)

    def warm_up(self, model, state) -> None:
        """Fast-forward to position --warm: a batched prefill, then SETTLE single steps."""
        from port.batch import V2Batch
        fast = max(0, self.a.warm - SETTLE)
        if fast:
            model.prefill_batch([self.token(p) for p in range(fast)], state, V2Batch(model, 64))
        while state.pos < self.a.warm:
            model.step(self.token(state.pos), state)

    def logits_at_warm(self, model, state) -> torch.Tensor:
        out = model.step(self.token(state.pos), state)
        return out.detach().to("cpu", copy=True)

    def time_steps(self, model, state) -> float:
        """Median ms of one model.step over --steps calls, after the untimed ones."""
        def one():
            model.step(self.token(state.pos), state)
        return median_us(one, self.a.steps, self.a.untimed, sync=self.sync) / 1e3

    def reference_logits(self, weights: str):
        """torch:eager logits at --warm for this weight form (computed once, untimed; None
        when the torch backend itself fails, whose own row then says why)."""
        if weights not in self.reference:
            self.say(f"torch:eager:{weights} logits at position {self.a.warm} (the reference "
                     f"for max |dlogits|)")
            self.reference[weights] = None
            model = self.make_model("torch", "eager", weights)
            state = model.make_state()
            self.warm_up(model, state)
            self.reference[weights] = self.logits_at_warm(model, state)
        return self.reference[weights]

    def run(self, name: str) -> dict:
        backend, decode, weights, *low = name.split(":")
        # A cq model computes from its codes: below float32 only activations and KV are rounded.
        precision = None if not low else \
            {"activations": low[0], "weights": "cq" if weights == "cq" else low[0], "kv": low[0]}
        row = blank_row(self.counts.get(f"{backend}:{weights}", {}).get(decode))
        try:
            model = self.make_model(backend, decode, weights, precision)
            state = model.make_state()
            self.say(f"{name}: fast-forward to position {self.a.warm}")
            self.warm_up(model, state)
            got = self.logits_at_warm(model, state)
            if backend == "torch" and decode == "eager" and precision is None:
                self.reference.setdefault(weights, got)
            self.say(f"{name}: median of {self.a.steps} steps")
            row["ms_per_token"] = self.time_steps(model, state)
            row["status"] = "ok"
        except Exception as e:                       # one broken backend must not hide the rest
            if backend == "torch" and decode == "eager":
                self.reference.setdefault(weights, None)
            row["status"] = failure(e)
            return row
        row["max_abs_dlogits"] = self.compare(got, weights)
        return row

    def compare(self, got, weights):
        try:
            ref = self.reference_logits(weights)
        except Exception:                            # the reference's own row says why
            return None
        return None if ref is None else float((got - ref).abs().max())

    def run_compiled(self) -> dict:
        """The anchor: torch backend, DecodeGraph.body under torch.compile, in one CUDA graph."""
        weights = "dense" if any(c.endswith(":dense") for c in self.a.configs) else "cq"
        row = dict(blank_row(), weights=weights)
        if self.dev.type != "cuda":
            row["status"] = "SKIPPED: needs CUDA (a compiled body captured in a CUDA graph)"
            return row
        try:
            model = self.make_model("torch", "graph", weights)
            state = model.make_state()
            graph = state.decode_graph(model)        # made before any capture: compile first
            graph.body = torch.compile(graph.body)
            t0 = time.perf_counter()
            self.warm_up(model, state)               # first graph step compiles and captures
            self.sync()
            row["compile_s"] = time.perf_counter() - t0
            got = self.logits_at_warm(model, state)
            row["ms_per_token"] = self.time_steps(model, state)
            row["status"] = "ok"
        except Exception as e:
            row["status"] = failure(e)
            return row
        row["max_abs_dlogits"] = self.compare(got, weights)
        return row


def blank_row(launches=None) -> dict:
    return {"ms_per_token": None, "launches_per_token": launches, "max_abs_dlogits": None,
            "status": "not run"}


def failure(e: Exception) -> str:
    """A row's status for an exception: its type and first line."""
    first = (str(e).splitlines() or [""])[0]
    return f"failed: {type(e).__name__}: {first}"


def run_upstream(python, preset, at) -> dict:
    """Upstream's jitted decode at the same position, in the interpreter that has it."""
    row = blank_row()
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bench_upstream.py")
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")   # torch holds memory too
    try:
        out = subprocess.run([python, script, "--preset", preset, "--at", str(at)],
                             capture_output=True, text=True, env=env, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as e:
        row["status"] = f"unmeasured: {python} did not run it ({type(e).__name__})"
        return row
    if out.returncode != 0:
        missing = re.search(r"No module named '([\w.]+)'", out.stderr)
        if missing:
            row["status"] = (f"unmeasured: {python} has no {missing.group(1)!r} module (upstream "
                             f"needs the cactus-needle wheel with jax and flax)")
        else:
            tail = (out.stderr.strip().splitlines() or ["(no stderr)"])[-1][:200]
            row["status"] = f"unmeasured: bench_upstream.py exited {out.returncode}: {tail}"
        return row
    try:
        got = json.loads(out.stdout.strip().splitlines()[-1])
        row.update(ms_per_token=float(got["upstream_one_token_ms"]), status="ok",
                   note=f"jax {got['jax']} on {got['devices']}, "
                        f"compiled in {got['compile_s']:.0f} s")
    except (ValueError, KeyError, IndexError, TypeError) as e:
        row["status"] = f"unmeasured: unreadable output ({type(e).__name__})"
    return row


def environment(dev: torch.device, flush: bool) -> dict:
    try:
        import triton
        triton_v = triton.__version__
    except ImportError:
        triton_v = "not installed"
    name = (torch.cuda.get_device_name(dev) if dev.type == "cuda"
            else f"cpu ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)")
    return {"device": str(dev), "device_name": name, "torch": torch.__version__,
            "triton": triton_v, "threads": torch.get_num_threads(), "flush_denormal": flush}


def cell(v, fmt):
    return "n/a" if v is None else fmt.format(v)


def table(res) -> str:
    lines = ["| config | ms/token | launches/token | vs torch eager (max \\|dlogits\\|) |",
             "|---|---|---|---|"]
    for name, r in res["rows"].items():
        if r["status"] != "ok":
            lines.append(f"| {name} | {r['status']} | "
                         f"{cell(r['launches_per_token'], '{:,}')} | n/a |")
            continue
        lines.append(f"| {name} | {r['ms_per_token']:.3f} | "
                     f"{cell(r['launches_per_token'], '{:,}')} | "
                     f"{cell(r['max_abs_dlogits'], '{:.2e}')} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    a = parser().parse_args(argv)
    problem = check_args(a)
    if problem is None:
        try:
            counts, launch_note = read_launches(a.launches, a.preset)
        except ValueError as e:
            problem = str(e)
    if problem:
        print(f"bench_gpu_decode: {problem}", file=sys.stderr)
        return 2
    if a.device == "cpu":          # Triton on CPU tensors runs only under its interpreter,
        os.environ.setdefault("TRITON_INTERPRET", "1")   # chosen when triton is first imported
    import port.model                                    # noqa: F401  (kernels/ sets it up)
    flush = bool(torch.set_flush_denormal(True))
    if a.threads is not None:
        torch.set_num_threads(a.threads)
    res = {"preset": a.preset, **environment(torch.device(a.device), flush),
           "position": a.warm, "steps": a.steps, "untimed": a.untimed,
           "launch_note": launch_note, "rows": {}}
    bench = Bench(a, counts)
    order = sorted(set(a.configs), key=ALL_CONFIGS.index)
    for i, name in enumerate(order, 1):
        bench.say(f"configuration {i}/{len(order)}: {name}")
        res["rows"][name] = bench.run(name)
        print(f"{name}: {res['rows'][name]['status']}", flush=True)
        save(res, a.json, complete=False)
    if a.compile:
        bench.say("torch.compile anchor: compile and capture (minutes at shipped)")
        r = bench.run_compiled()
        res["rows"][f"{COMPILE_ROW}:{r.pop('weights')}"] = r
        print(f"torch.compile anchor: {r['status']}", flush=True)
        if "compile_s" in r:
            print(f"torch.compile anchor: compile and capture took {r['compile_s']:.0f} s")
        save(res, a.json, complete=False)
    if a.upstream_python:
        bench.say("upstream's jitted forward_cached (bench_upstream.py)")
        res["rows"][f"{UPSTREAM_ROW} (at {a.warm})"] = run_upstream(a.upstream_python,
                                                                    a.preset, a.warm)
        save(res, a.json, complete=False)
    print()
    print(table(res))
    kind = ("" if a.device == "cuda" else
            " (CPU timings: GPU timing unmeasured)")
    print(f"\n{res['device_name']}; torch {res['torch']}, triton {res['triton']}, "
          f"{res['threads']} threads, torch.set_flush_denormal(True) -> {flush}; preset "
          f"{a.preset}, measured at position {a.warm}, median of {a.steps} steps{kind}")
    print(launch_note)
    for r in res["rows"].values():
        if r.get("note"):
            print(f"upstream: {r['note']}")
    failed = [n for n, r in res["rows"].items() if r["status"].startswith("failed")]
    res["failed"] = failed
    save(res, a.json, complete=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
