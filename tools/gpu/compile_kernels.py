"""Compile every Triton kernel the triton backend's decode step launches, for a GPU, without one.

    python tools/gpu/compile_kernels.py [--preset shipped] [--weights dense cq] [--arch 90]
                                    [--json OUT]

The Triton interpreter (how the tests run kernels on a CPU) executes a kernel's Python body
with numpy; it never builds the kernel, so an error that only the compiler sees (a type mix, an
unsupported op, a non-power-of-two block) passes every CPU test and fails on the first GPU
launch. This script builds them the way a GPU would, on a CPU: it steps the model at the
preset's geometry with the launch hook of port/graph.py (`triton_launch_log(run=False)`), and
for every distinct launch (kernel, constexprs, argument types and alignment) calls
`kernel.warmup(...)` against a stand-in driver that reports an NVIDIA target (sm_90 = H100/H200
by default). Triton then runs its whole pipeline — TTIR, TTGIR, LLVM IR, PTX and the bundled
`ptxas` to a cubin — and nothing is launched. Each compiled kernel is listed with its grid,
warps, shared memory, and (read from the cubin with the bundled cuobjdump) registers per thread
and local-memory bytes, i.e. spills. Exit 0 when every kernel compiled, 1 otherwise (each
failure printed with the compiler's message).

It must own its process: kernels are defined as compiled (not interpreted) functions only when
TRITON_INTERPRET is off at import, so it sets that before importing anything of the project.
"""
from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "0"            # before any kernel module is imported
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

import argparse                                  # noqa: E402
import json                                      # noqa: E402
import time                                      # noqa: E402

import torch                                     # noqa: E402


class TargetOnlyDriver:
    """What Triton asks the driver for while compiling: the target, a device and a stream.
    Anything that would launch or query a real device is not here, so it fails loudly."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def _launches(preset: str, weights: str) -> list:
    """(kernel, grid, args, kwargs) of every launch of one triton-backend decode step (plus
    the prefill's attention), recorded and not run."""
    from port.graph import DecodeGraph, triton_launch_log
    from port.model import V2Model
    from reference.config import V2Config
    from reference.params import init_params
    cfg = V2Config.preset(preset)
    model = V2Model.from_params(init_params(cfg, 0, perturbed=True), cfg, weights=weights,
                                backend="triton", decode="graph")
    state = model.make_state()
    seen = []
    with triton_launch_log(seen, run=False, describe=False):
        model.step(3, state)                     # the prefill path (its attention kernel)
        g = DecodeGraph(model, state)
        g.prep(17)
        g.body()
    return seen


def _key(kernel, args, kwargs) -> tuple:
    """What decides a compilation: the kernel, each tensor's dtype and 16-byte alignment,
    each scalar's type (an integer's value 1, divisibility by 16, 64-bit range), and the
    constexprs."""
    def one(a):
        if isinstance(a, torch.Tensor):
            return ("T", str(a.dtype), a.data_ptr() % 16 == 0)
        if isinstance(a, bool) or a is None:
            return repr(a)
        # Triton specializes an integer on being 1, on divisibility by 16 and on its width
        return (type(a).__name__, a == 1, isinstance(a, int) and a % 16 == 0,
                isinstance(a, int) and not -2**31 <= a < 2**31)
    return (kernel.fn.__name__ if hasattr(kernel, "fn") else kernel.__name__,
            tuple(one(a) for a in args), tuple(sorted((k, repr(v)) for k, v in kwargs.items())))


def resource_usage(cubin: bytes) -> dict:
    """Registers per thread and local-memory bytes (spills) of a cubin, read with the cuobjdump
    Triton bundles; {} when it is not there."""
    import subprocess
    import tempfile
    import triton
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    if not os.path.isfile(tool):
        return {}
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True,
                             text=True, timeout=60).stdout
    fields = dict(tok.split(":", 1) for line in out.splitlines() if "REG:" in line
                  for tok in line.split() if ":" in tok)
    return {"regs": int(fields["REG"]), "local": int(fields["LOCAL"])} if fields else {}


def compile_all(preset: str, weights_forms, arch: int, distinct: str = "specialization") -> list:
    """[{kernel, weights, seconds, ok, error, shared}] for every distinct launch: distinct
    specializations (as a GPU compiles them), or distinct="constexprs" (one per kernel and
    constexpr values: the same code less the alignment variants; quicker)."""
    from triton.runtime import driver
    driver.set_active(TargetOnlyDriver(arch))
    results, done = [], set()
    for weights in weights_forms:
        for kernel, grid, args, kwargs in _launches(preset, weights):
            key = _key(kernel, args, kwargs)
            seen = key if distinct == "specialization" else (key[0], key[2])
            if seen in done:
                continue
            done.add(seen)
            t0 = time.perf_counter()
            row = {"kernel": key[0], "weights": weights, "constexprs": dict(key[2])}
            try:
                ck = kernel.warmup(*args, grid=grid, **kwargs)
                row.update(ok="cubin" in ck.asm, shared=int(ck.metadata.shared), error="",
                           warps=int(ck.metadata.num_warps), grid=list(grid),
                           **resource_usage(ck.asm.get("cubin", b"")))
            except Exception as e:                          # report every kernel, then fail
                row.update(ok=False, shared=None, error=f"{type(e).__name__}: {e}")
            row["seconds"] = round(time.perf_counter() - t0, 2)
            results.append(row)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="shipped", choices=["tiny", "shipped"])
    ap.add_argument("--weights", nargs="+", default=["dense", "cq"], choices=["dense", "cq"])
    ap.add_argument("--arch", type=int, default=90,
                    help="NVIDIA compute capability x10 to compile for (90: H100/H200)")
    ap.add_argument("--distinct", default="specialization",
                    choices=["specialization", "constexprs"],
                    help="compile every specialization a GPU would (default), or one per "
                         "kernel and constexpr values (quicker)")
    ap.add_argument("--json", help="also write the results here")
    a = ap.parse_args(argv)
    if not 50 <= a.arch <= 120:
        print(f"compile_kernels: --arch {a.arch} outside 50..120 (e.g. 80 A100, 90 H200)",
              file=sys.stderr)
        return 2
    try:
        import triton  # noqa: F401
    except ImportError:
        print("compile_kernels: Triton is not installed (pip install '.[gpu]')", file=sys.stderr)
        return 2
    results = compile_all(a.preset, a.weights, a.arch, a.distinct)
    print(f"Triton kernels of the triton backend's decode step, preset {a.preset}, compiled for "
          f"sm_{a.arch} (TTIR -> PTX -> cubin, nothing launched):")
    for r in results:
        use = (f"  {r['regs']:3d} regs, {r['local']} B local (spills)" if "regs" in r else "")
        status = (f"ok  grid {str(tuple(r['grid'])):9s} {r['warps']} warps  shared "
                  f"{r['shared']:5d} B{use}" if r["ok"] else "FAILED")
        print(f"  {r['kernel']:28s} {r['weights']:5s} {r['seconds']:6.2f} s  {status}")
        if r["error"]:
            print(f"      {r['error'][:2000]}")
    bad = [r for r in results if not r["ok"]]
    print(f"{len(results) - len(bad)}/{len(results)} compiled")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.preset, "arch": a.arch, "kernels": results}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
