"""Bounds of the reference's own consistency checks (`python -m reference run`).

The reference knows nothing of the harness, so the bounds its self-check prints live here, each
with its reason; ladder/engine/rules.py takes them into REFERENCE_RULES unchanged, so the harness and
the tests judge these comparisons with the same numbers. A check passes when
max|a - b| <= bound·max|b| over the whole tensor, with no NaN or Inf on either side.
"""
from __future__ import annotations

import torch

# name -> (bound on max|a - b| / max|b|, why)
SELF_CHECKS = {
    "self/prefill_vs_steps": (2e-6, "same f32 math, S-wide vs 1-wide matmuls"),
    "self/decode_vs_arch_f32": (2e-6, "spec §f.1: the two graphs agree to ~1e-6 in f32"),
    "self/f32_vs_f64": (2e-6, "f32 rounding against the float64 arbiter"),
    "self/arch_bf16_vs_f32": (0.1, "spec §f.1: bf16 logits ~2% off f32; reported"),
}


def max_rel(a, b) -> float:
    """max|a - b| / max|b| in float64 (max|a - b| where b is all zero)."""
    a, b = a.double(), b.double()
    den = float(b.abs().max())
    return float((a - b).abs().max()) / den if den else float((a - b).abs().max())


def within(name: str, a, b) -> bool:
    """The check `name` of SELF_CHECKS on a (candidate) against b (the one trusted more)."""
    bound = SELF_CHECKS[name][0]
    a, b = a.double(), b.double()
    if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
        return False
    return float((a - b).abs().max()) <= bound * float(b.abs().max())
