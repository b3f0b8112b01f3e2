"""Every Triton kernel of the triton backend's decode step compiles for an H200 (sm_90) on this
CPU-only machine: tools/gpu/compile_kernels.py runs Triton's whole pipeline down to a cubin with
its bundled ptxas. The interpreter the other kernel tests use never compiles a kernel, so this
is the check that catches compile-only errors before a GPU does. Its own process: kernels are
compiled functions only when TRITON_INTERPRET is off at import."""
from tests import paths
import json
import os
import subprocess
import sys

import pytest

TOOL = os.path.join(paths.TOOLS, "gpu", "compile_kernels.py")
pytest.importorskip("triton")


def test_every_decode_kernel_compiles_for_sm90(tmp_path):
    out = tmp_path / "kernels.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, TOOL, "--preset", "tiny", "--distinct", "constexprs",
                        "--json", str(out)], capture_output=True, text=True, timeout=900,
                       env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = json.loads(out.read_text())["kernels"]
    names = {k["kernel"] for k in got}
    assert names == {"_sparse_attn_kernel", "_engram_dense_kernel", "_engram_cq_kernel",
                     "_norm_gemv_kernel", "_norm_cq_gemv_kernel", "_mhc_route_kernel",
                     "_qk_rope_ring_kernel", "_layer_tail_kernel", "_final_norm_kernel"}
    assert all(k["ok"] for k in got)
    # registers and spills read back from every cubin (the bundled cuobjdump)
    assert all(0 < k["regs"] <= 255 and k["local"] >= 0 for k in got), got


BAD_KERNEL = """
import os, sys
sys.path.insert(0, {tools!r})
if sys.argv[1] == "compile":
    import compile_kernels as ck          # turns the interpreter off, as the tool does
import torch, triton, triton.language as tl

@triton.jit
def bad(x_ptr, n):
    acc = 0                               # an int32 loop-carried value that turns float32
    for i in range(0, n):
        acc += tl.load(x_ptr + i)
    tl.store(x_ptr, acc)

x = torch.ones(12)
if sys.argv[1] == "interpret":
    bad[(1,)](x, 12)
    print("interpreter ran it:", float(x[0]))
else:
    from triton.runtime import driver
    driver.set_active(ck.TargetOnlyDriver(90))
    try:
        bad.warmup(x, 12, grid=(1,))
    except Exception as e:
        print("refused:", type(e).__name__, str(e).splitlines()[-1])
        sys.exit(3)
"""


def test_the_compile_path_catches_what_the_interpreter_runs(tmp_path):
    # A kernel the interpreter runs happily (numpy promotes the int) but Triton's compiler
    # refuses: the tool's stand-in driver really compiles, the CPU tests alone would not see it.
    src = tmp_path / "bad_kernel.py"
    src.write_text(BAD_KERNEL.format(tools=os.path.dirname(os.path.abspath(TOOL))))
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    ran = subprocess.run([sys.executable, str(src), "interpret"], capture_output=True,
                         text=True, timeout=300, env={**env, "TRITON_INTERPRET": "1"})
    assert ran.returncode == 0 and "interpreter ran it: 12.0" in ran.stdout, ran.stderr[-2000:]
    built = subprocess.run([sys.executable, str(src), "compile"], capture_output=True,
                           text=True, timeout=300, env=env)
    assert built.returncode == 3 and "Loop-carried variable acc" in built.stdout, \
        built.stdout + built.stderr[-2000:]
