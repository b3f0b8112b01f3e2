"""hadamard_mlp: the pre_hada norm and the Hadamard MLP in one launch; twin and Triton kernel
against float64 (an explicit Walsh matrix), and the kernel against the twin."""
import math

import pytest
import torch

from kernels.hadamard_mlp import (HadamardMlpError, hadamard_mlp_torch, hadamard_mlp_triton,
                                  triton)
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def case(d, n, seed):
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(d, generator=g) * 2
    gain = 0.2 * torch.randn(d, generator=g)
    d1, d2, d3 = (1 + 0.3 * torch.randn(n, generator=g) for _ in range(3))
    return [t.to(DEV) for t in (z, gain, d1, d2, d3)]


def float64_mlp(z, gain, d1, d2, d3, eps=1e-6):
    z, gain, d1, d2, d3 = (t.cpu().double() for t in (z, gain, d1, d2, d3))
    d, n = z.shape[0], d1.shape[0]
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.kron(torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=torch.float64), h)
    w = h / math.sqrt(n)
    mi = (1 + gain) * z / torch.sqrt((z * z).mean() + eps)
    t = torch.cat([mi, torch.zeros(n - d, dtype=torch.float64)])
    t = d2 * (w @ (d1 * t))
    t = t / (1 + torch.exp(-t))
    return (d3 * (w @ t))[:d]


IMPLS = [("twin", hadamard_mlp_torch), pytest.param(
    "triton", hadamard_mlp_triton, marks=pytest.mark.skipif(triton is None, reason="no Triton"))]


@pytest.mark.parametrize("name,impl", IMPLS)
@pytest.mark.parametrize("d,n", [(48, 64), (20, 32), (100, 128), (3, 4)])
def test_against_float64(name, impl, d, n):
    args = case(d, n, seed=d + n)
    got = impl(*args)
    assert got.device == args[0].device and got.shape == (d,)
    assert rule_for(f"hadamard_mlp/{name}", KERNEL_RULES).check(got.cpu(), float64_mlp(*args))


@pytest.mark.skipif(triton is None, reason="no Triton")
def test_triton_matches_twin():
    args = case(200, 256, seed=2)
    assert rule_for("hadamard_mlp/triton_vs_twin", KERNEL_RULES).check(
        hadamard_mlp_triton(*args).cpu(), hadamard_mlp_torch(*args).cpu())


def test_bad_inputs_named():
    z, gain, d1, d2, d3 = case(48, 64, seed=0)
    with pytest.raises(HadamardMlpError, match="hada_n=48 must be a power of two"):
        hadamard_mlp_torch(z, gain, d1[:48], d2[:48], d3[:48])
    with pytest.raises(HadamardMlpError, match=r"d2 must be float32 \[64\]"):
        hadamard_mlp_torch(z, gain, d1, d2.double(), d3)
    with pytest.raises(HadamardMlpError, match=r"gain must be float32 \[48\]"):
        hadamard_mlp_torch(z, gain[:40], d1, d2, d3)


needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


# ---------------------------------------------------------------- eps decides the norm
# x of size 1e-5: mean(x^2) ~ 1e-10, four orders under eps = 1e-6, so the norm's output is
# ~x / 1e-3, not a unit vector: an implementation that drops or misplaces eps is far off.
def _tiny_x(shape, seed, scale=1e-5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


@pytest.mark.parametrize("name,impl", _impls(hadamard_mlp_torch, hadamard_mlp_triton))
def test_hadamard_mlp_where_eps_decides(name, impl):
    g = torch.Generator().manual_seed(7)
    z = _tiny_x((40,), seed=8)
    gain, *ds = 0.2 * torch.randn(40, generator=g), *(1 + 0.3 * torch.randn(64, generator=g)
                                                      for _ in range(3))
    got = impl(z.to(DEV), gain.to(DEV), *(t.to(DEV) for t in ds))
    want = float64_mlp(z, gain, *ds)
    assert rule_for(f"hadamard_mlp/{name}", KERNEL_RULES).check(got.cpu(), want)
