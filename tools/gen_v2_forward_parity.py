"""Regenerate the committed forward-parity fixture tests/fixtures/v2_forward_vectors.*.

    python tools/gen_v2_forward_parity.py                 # tiny preset, seed 0 (committed)
    python tools/gen_v2_forward_parity.py --check         # exit 1 unless byte-identical
    python tools/gen_v2_forward_parity.py --params p.safetensors --out /tmp/real --steps 260

The reference runs in float64 (the arbiter) and is stored rounded to float32; the traced run
must equal the plain forward_cached bit for bit and the float32 reference must agree with it
under the `arbiter/*` rules, or nothing is written. Same inputs, same torch: same bytes.
From a real checkpoint (--params / --cact) the fixture is not committed: the shipped geometry
stores ~0.3 M values per position (27 layers × ~11 k + 8 k logits), about 1.2 MB per position,
so a run past its 256-slot window (~270 positions) is ~330 MB.
This is `python -m ladder regen`; both take the same options, `--format needle-rs` too:
needle-rs's own fixture (STEM.json + STEM.f32, greedy decode steps, `--prompt TEXT` encoded
with the --cact checkpoint's tokenizer), which its v2_forward_parity test reads unchanged:

    python tools/gen_v2_forward_parity.py --format needle-rs --cact m.cact --prompt "hi" --out v2
"""
import sys

from ladder.cli.main import main

if __name__ == "__main__":
    sys.exit(main(["regen"] + sys.argv[1:]))
