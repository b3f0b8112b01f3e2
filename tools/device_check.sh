#!/usr/bin/env bash
# GPU checks, one script (< 5 min): real Triton launches and, as they land, CUDA-graph capture
# and replay. On a machine without CUDA it runs the same tests on CPU (Triton under the
# interpreter) and says that the GPU parts were skipped.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
# Results land in $OUT (the folder a device run hands back) or a temporary folder.
RESULTS=${OUT:-${TMPDIR:-/tmp}/device_check}
mkdir -p "$RESULTS"
if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "device_check: CUDA $($PY -c 'import torch; print(torch.cuda.get_device_name(0))')"
    unset TRITON_INTERPRET
    TABLE_ARGS=(--preset shipped --device cuda --steps 50)
else
    echo "device_check: no CUDA device: GPU launches SKIPPED; running the kernel tests on CPU"
    export TRITON_INTERPRET=1
    TABLE_ARGS=(--preset tiny --device cpu)       # seconds; GPU timing stays unmeasured
fi
# Launches per decode token, counted in a CPU child while the tests run: count_launches turns the
# Triton interpreter on and records Triton launches without running them, so it must not share
# a process with real CUDA kernels. Its preset is the table's.
rm -f "$RESULTS/launches.json" "$RESULTS/device_check.json"     # never a stale table
CUDA_VISIBLE_DEVICES= TRITON_INTERPRET=1 $PY tools/bench/count_launches.py "${TABLE_ARGS[@]:0:2}" \
    --eager --top 5 --json "$RESULTS/launches.json" >"$RESULTS/launches.log" 2>&1 &
count_pid=$!
$PY -m pytest -q tests/test_kernels_*.py tests/port/test_graph.py tests/port/test_model_device.py \
    tests/tools/test_count_launches.py tests/port/test_fused.py tests/port/test_fused_precision.py \
    tests/port/test_model.py::test_triton_backend_matches_torch_backend
status=$?
# Issue 12: each fused decode kernel against its torch twin at the shipped shapes, and packed
# CQ weights stepping on the device.
$PY - <<'PYEOF' || status=1
import time, torch
if not torch.cuda.is_available():
    print("fused kernels vs twins: SKIPPED (needs a GPU); their tests ran above on CPU")
    print("cq on CUDA: SKIPPED (needs a GPU); tests/port/test_model_device.py checked devices on meta")
    raise SystemExit(0)
from kernels.mhc_route import mhc_route_torch, mhc_route_triton
from kernels.norm_gemv import (norm_gemv_torch, norm_gemv_triton, norm_cq_gemv_torch,
                               norm_cq_gemv_triton)
from kernels.hadamard_mlp import hadamard_mlp_torch, hadamard_mlp_triton
from kernels.qk_rope_ring import qk_rope_ring_torch, qk_rope_ring_triton
from kernels.layer_tail import layer_tail_torch, layer_tail_triton
dev = "cuda"
g = torch.Generator(device=dev).manual_seed(0)
rnd = lambda *s: torch.randn(*s, device=dev, generator=g)
from tools.gpu_timing import median_us as med
def packed(out, k, bits):
    return torch.randint(0, 256, (out, k * bits // 8), dtype=torch.uint8, device=dev, generator=g)
n, d, scal = 4, 512, lambda v: torch.tensor(v, device=dev)
route = (rnd(2 * n + n * n), rnd(n, d), scal(0.01), rnd(n), scal(0.01), rnd(n), scal(0.01),
         4 * torch.eye(n, device=dev) + rnd(n, n))
lanes = rnd(1, d).expand(n, d)
H, KV, hd, R = 8, 4, 64, 256
ring = torch.zeros(KV, R, hd, device=dev)
prelude = (rnd(2 * H * hd + 2 * KV * hd), rnd(hd), rnd(hd), rnd(2048, hd // 2),
           rnd(2048, hd // 2), torch.tensor([300], device=dev), torch.tensor([44], device=dev),
           ring, ring.clone(), H, KV)
cases = [  # name, twin, kernel, args
    ("mhc_route n=4 d=512", mhc_route_torch, mhc_route_triton, route),
    ("norm_gemv router 2048->24", norm_gemv_torch, norm_gemv_triton,
     (lanes, None, rnd(24, n * d).t(), "unit")),
    ("norm_gemv qkvg 512->1536", norm_gemv_torch, norm_gemv_triton,
     (rnd(d), rnd(d), rnd(1536, d).t(), "zc")),
    ("norm_gemv head 512->8192", norm_gemv_torch, norm_gemv_triton,
     (rnd(d), rnd(d), rnd(8192, d).t(), "zc", True)),
    ("norm_cq_gemv qkvg 2-bit", norm_cq_gemv_torch, norm_cq_gemv_triton,
     (rnd(d), rnd(d), "zc", packed(1536, d, 2), rnd(1536, 4).half(), rnd(4), 2)),
    ("norm_cq_gemv head 4-bit", norm_cq_gemv_torch, norm_cq_gemv_triton,
     (rnd(d), rnd(d), "zc", packed(8192, d, 4), rnd(8192, 4).half(), rnd(16), 4)),
    ("hadamard_mlp d=512", hadamard_mlp_torch, hadamard_mlp_triton,
     (rnd(d), rnd(d), rnd(d), rnd(d), rnd(d))),
    ("qk_rope_ring H=8 KV=4 hd=64", qk_rope_ring_torch, qk_rope_ring_triton, prelude),
    ("layer_tail n=4 d=512", layer_tail_torch, layer_tail_triton,
     (rnd(d), rnd(d), rnd(d), lanes, torch.softmax(rnd(n, n), 0), rnd(n), rnd(d), scal(0.7),
      rnd(d), rnd(d), rnd(d), rnd(d))),
]
print(f"{'fused kernel (one decode token)':32s} {'twin us':>9s} {'triton us':>10s} {'ratio':>7s}")
for name, twin, kern, args in cases:
    a, b = med(lambda: twin(*args)), med(lambda: kern(*args))
    print(f"{name:32s} {a:9.1f} {b:10.1f} {a / b:6.2f}x")

from reference.config import V2Config
from reference.params import init_params
from port.model import V2Model
cfg = V2Config.preset("tiny")
params = init_params(cfg, 0, perturbed=True)
cpu = V2Model.from_params(params, cfg, weights="cq")     # the CPU torch port: the yardstick
on_dev = V2Model.from_params(params, cfg, weights="cq", device=dev).parts
for backend in ("torch", "triton"):      # triton on CUDA: the fused body on the packed codes
    gpu = V2Model.new(cfg, *on_dev, device=dev, backend=backend)
    sc, sg = cpu.make_state(), gpu.make_state()
    worst = max(float((cpu.step(t, sc) - gpu.step(t, sg).cpu()).abs().max()) for t in range(1, 20))
    print(f"cq on CUDA ({backend}): 19 steps, max |logits - CPU torch| = {worst:.2e}")
PYEOF
$PY - <<'PYEOF'
import time, torch
from kernels.sparse_attn import sparse_attn_torch, sparse_attn_triton
if not torch.cuda.is_available():
    print("benchmark: SKIPPED (needs a GPU: Triton sparse_attn vs torch gather+softmax)")
    raise SystemExit(0)
torch.manual_seed(0)
T, H, KV, D, N, K = 1, 8, 4, 64, 256, 256        # one decode token, the shipped window
q, k, v = (torch.randn(*s, device="cuda") for s in ((T, H, D), (N, KV, D), (N, KV, D)))
idx = torch.randperm(N, device="cuda")[:K][None]
from tools.gpu_timing import median_us as med
a = med(lambda: sparse_attn_torch(q, k, v, idx, 0.125))
b = med(lambda: sparse_attn_triton(q, k, v, idx, 0.125))
print(f"sparse_attn decode (K={K}): torch {a:.1f} us, triton {b:.1f} us, ratio {a / b:.2f}x")

PYEOF
# Issue #8: DeepSeek-V4.1 attention on the GPU (CUDA-graph replay vs eager bytes, Triton and the
# torch twin vs the reference); on CPU the GPU file skips and the rest runs under the interpreter.
$PY -m pytest -q -s tests/port/v41/test_cuda.py tests/port/v41/test_bit_exact_properties.py \
    tests/port/v41/test_attn.py || status=1
if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    # (the V4.1 run always checks graph replay against eager; it refuses --decode)
    $PY -m ladder run --model attn_v41 --device cuda --backend triton || status=1
    # Issue 12: the fused triton body through the ladder, tiny and shipped, dense and cq
    for preset in tiny shipped; do
        for w in dense cq; do
            $PY -m ladder run --preset $preset --weights $w --device cuda --backend triton \
                --decode graph --steps 6 | tail -4 || status=1
            # Issue 28: the same body at bfloat16 (ring, lanes and dense weights in 16 bits),
            # judged three-way against the noise floor
            $PY -m ladder run --preset $preset --weights $w --device cuda --backend triton \
                --decode graph --steps 6 --port-precision bfloat16 | tail -4 || status=1
        done
    done
    TABLE_ARGS+=(--configs $($PY -c 'import sys; sys.path.insert(0, "tools")
import bench_gpu_decode as b; print(" ".join(b.ALL_CONFIGS))'))
fi
# The table (issue 12): ms per decode token for backend x decode x weights, launches per token
# beside each, max |dlogits| against the torch backend's eager step; also written as JSON.
# DEVICE_CHECK_COMPILE=1 adds the torch.compile anchor (about 4 minutes of compile);
# DEVICE_CHECK_UPSTREAM_PYTHON=PATH adds upstream's jitted decode (a venv with cactus-needle).
if wait $count_pid; then
    grep -E "launches per token|eager step" "$RESULTS/launches.log"
else
    echo "device_check: count_launches failed (launches shown as n/a):"
    tail -5 "$RESULTS/launches.log"
    status=1
fi
[ "${DEVICE_CHECK_COMPILE:-0}" = 1 ] && TABLE_ARGS+=(--compile)
[ -n "${DEVICE_CHECK_UPSTREAM_PYTHON:-}" ] && \
    TABLE_ARGS+=(--upstream-python "$DEVICE_CHECK_UPSTREAM_PYTHON")
$PY tools/bench/bench_gpu_decode.py "${TABLE_ARGS[@]}" --launches "$RESULTS/launches.json" \
    --json "$RESULTS/device_check.json" || status=1
echo "device_check: table written to $RESULTS/device_check.json"
exit $status
