"""The fused decode body on its Triton kernels against the same body on their torch twins, step
by step, at a precision (issue 28: the body below float32).

    python tools/gpu/fused_twin_vs_triton.py [--preset tiny] [--weights dense|cq]
                                         [--precision bfloat16] [--steps 10] [--seed 0]

Both bodies run over the same weights from the same prompt token at position 0; per decode step
it prints max |dlogits|, how many logits differ, and whether the KV ring, the Engram ring and
the mHC lanes agree bit for bit (else how many of their elements differ). On a CPU the kernels run under Triton's interpreter (about 3.5 s
a tiny step); on CUDA both run on the device. Exit status 0 always: this measures, the tests
judge (tests/port/test_fused_precision.py).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

STATE = ("k", "v", "vraw", "lanes")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="tiny", choices=["tiny", "shipped"])
    ap.add_argument("--weights", default="dense", choices=["dense", "cq"])
    ap.add_argument("--precision", default="bfloat16")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if not 1 <= a.steps <= 1000:
        ap.error(f"--steps {a.steps}: 1..1000")
    import torch
    from ladder.sides.judge import ModelUnderTest
    from port.fused import FusedBody
    torch.set_flush_denormal(True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    m = ModelUnderTest.build(preset=a.preset, seed=a.seed, weights=a.weights)
    ports = []
    for kernels in ("twin", "triton"):
        p = m.our_port(backend="triton", device=dev, precision=a.precision)
        p.fused = FusedBody(p, kernels)
        ports.append((p, p.make_state()))
    tokens = m.tokens(a.steps + 1)
    print(f"fused body, twin vs triton: preset {a.preset}, weights {a.weights}, precision "
          f"{a.precision}, seed {a.seed}, device {dev}, torch {torch.__version__}")
    print(f"{'step':>5s} {'max|dlogits|':>13s} {'logits differing':>17s}  state equal "
          f"({', '.join(STATE)})")
    equal_steps = 0
    for i, t in enumerate(tokens):
        (pa, sa), (pb, sb) = ports
        la, lb = pa.step(int(t), sa).cpu(), pb.step(int(t), sb).cpu()
        if i == 0:
            continue                                 # position 0 is a prefill: no body
        apart = [int((getattr(sa, n) != getattr(sb, n)).sum()) for n in STATE]
        diff = int((la != lb).sum())
        equal_steps += diff == 0 and not any(apart)
        print(f"{i - 1:5d} {float((la - lb).abs().max()):13.3g} {diff:10d} of {la.numel():<5d} "
              f" {' '.join('yes' if not n else f'{n} apart' for n in apart)}")
    print(f"{equal_steps} of {a.steps} decode steps bit-identical (logits and state)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
