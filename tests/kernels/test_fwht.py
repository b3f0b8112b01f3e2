"""fwht: torch twin and Triton kernel against a float64 Walsh matrix; its orthonormality."""
import math

import pytest
import torch

from kernels.fwht import FwhtError, fwht_torch, fwht_triton, triton
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def walsh64(n=128):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    return h / math.sqrt(n)


def want(x):
    g = x.double().cpu().reshape(*x.shape[:-1], -1, 128)
    return (g @ walsh64()).reshape(x.shape)


@pytest.mark.parametrize("impl", [fwht_torch, pytest.param(
    fwht_triton, marks=pytest.mark.skipif(triton is None, reason="no Triton"))])
def test_against_float64_and_inverse(impl):
    x = torch.randn(3, 384, generator=torch.Generator().manual_seed(0)).to(DEV)
    y = impl(x)
    assert rule_for(f"{'triton' if impl is fwht_triton else 'torch'}/fwht", KERNEL_RULES).check(
        y.cpu(), want(x))
    assert rule_for("torch/fwht", KERNEL_RULES).check(impl(y).cpu(), x.cpu().double())  # H·H = I


def test_bad_width():
    with pytest.raises(FwhtError, match="multiple of 128"):
        fwht_torch(torch.zeros(2, 100))


@pytest.mark.skipif(triton is None, reason="no Triton")
def test_triton_matches_torch_twin():
    x = torch.randn(5, 256, generator=torch.Generator().manual_seed(4)).to(DEV)
    assert rule_for("triton_vs_torch/fwht", KERNEL_RULES).check(fwht_triton(x).cpu(),
                                                                fwht_torch(x).cpu())
