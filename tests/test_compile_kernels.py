"""Every Triton kernel of the triton backend's decode step compiles for an H200 (sm_90) on this
CPU-only machine: tools/compile_kernels.py runs Triton's whole pipeline down to a cubin with
its bundled ptxas. The interpreter the other kernel tests use never compiles a kernel, so this
is the check that catches compile-only errors before a GPU does. Its own process: kernels are
compiled functions only when TRITON_INTERPRET is off at import."""
import json
import os
import subprocess
import sys

import pytest

TOOL = os.path.join(os.path.dirname(__file__), "..", "tools", "compile_kernels.py")
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


def test_a_kernel_that_does_not_compile_fails_the_tool(tmp_path):
    # The interpreter accepts what the compiler refuses: a block that is not a power of two.
    src = tmp_path / "bad_kernel.py"
    src.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {os.path.dirname(TOOL)!r})\n"
        "import compile_kernels as ck\n"
        "import torch, triton, triton.language as tl\n"
        "@triton.jit\n"
        "def bad(x_ptr, B: tl.constexpr):\n"
        "    tl.store(x_ptr + tl.arange(0, B), 1.0)\n"
        "from triton.runtime import driver\n"
        "driver.set_active(ck.TargetOnlyDriver(90))\n"
        "try:\n"
        "    bad.warmup(torch.zeros(12), B=12, grid=(1,))\n"
        "except Exception as e:\n"
        "    print('refused:', type(e).__name__); sys.exit(3)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, str(src)], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 3 and "refused" in r.stdout, r.stdout + r.stderr[-2000:]
