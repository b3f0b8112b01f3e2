"""mhc_route: one layer's gates, lane mix and 20-iteration log-domain Sinkhorn in one launch.
Twin and Triton kernel against float64, the kernel against the twin, and the twin's Sinkhorn
against the model's (bit for bit: the torch backend keeps its bits when the twin is wired)."""
import pytest
import torch

from kernels.mhc_route import MhcRouteError, mhc_route_torch, mhc_route_triton, triton
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for
from port.model import log_sinkhorn

DEV = "cuda" if torch.cuda.is_available() else "cpu"
NAMES = ("hpre", "u", "hpost", "P", "alpha", "bx")


def case(n, d, seed, expand=False):
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(2 * n + n * n, generator=g) * 3
    X = torch.randn(1 if expand else n, d, generator=g)
    X = X.expand(n, d) if expand else X
    scal = [torch.tensor(v) for v in (0.01, 0.7, 0.3)]
    b_pre, b_post = torch.randn(n, generator=g), torch.randn(n, generator=g)
    b_res = 4 * torch.eye(n) + torch.randn(n, n, generator=g)
    return (r, X, scal[0], b_pre, scal[1], b_post, scal[2], b_res)


def gate_case(d, seed):
    """An Engram site's key and convolved value [d] (a key not parallel to u: alpha inside
    (0, 1), not saturated)."""
    g = torch.Generator().manual_seed(seed)
    return {"ek": torch.randn(d, generator=g).to(DEV), "ev": torch.randn(d, generator=g).to(DEV)}


def on(dev, args):
    return [a.to(dev) for a in args]


def float64_route(r, X, a_pre, b_pre, a_post, b_post, a_res, b_res, iters=20, ek=None,
                  ev=None):
    r, X, a_pre, b_pre, a_post, b_post, a_res, b_res = (
        t.cpu().double() for t in (r, X, a_pre, b_pre, a_post, b_post, a_res, b_res))
    n = X.shape[0]
    hpre = 1 / (1 + torch.exp(-(a_pre * r[:n] + b_pre)))
    hpost = 2 / (1 + torch.exp(-(a_post * r[n:2 * n] + b_post)))
    z = a_res * r[2 * n:].reshape(n, n) + b_res
    for _ in range(iters):                      # spec b.7: rows, then columns, max-shifted
        m = z.max(1, keepdim=True).values
        z = z - (m + (z - m).exp().sum(1, keepdim=True).log())
        m = z.max(0, keepdim=True).values
        z = z - (m + (z - m).exp().sum(0, keepdim=True).log())
    u = hpre @ X
    alpha, bx = None, u
    if ek is not None:
        ek, ev = ek.cpu().double(), ev.cpu().double()
        unit = lambda x: x / torch.sqrt((x * x).mean() + 1e-6)
        alpha = 1 / (1 + torch.exp(-(unit(u) * unit(ek)).sum() / X.shape[1] ** 0.5))
        bx = u + alpha * ev
    return hpre, u, hpost, z.exp(), alpha, bx


IMPLS = [("twin", mhc_route_torch), pytest.param(
    "triton", mhc_route_triton, marks=pytest.mark.skipif(triton is None, reason="no Triton"))]


@pytest.mark.parametrize("name,impl", IMPLS)
@pytest.mark.parametrize("n,d,expand", [(4, 48, False), (4, 40, True), (3, 20, False),
                                         (4, 130, False)])
@pytest.mark.parametrize("gated", [False, True])
def test_against_float64(name, impl, n, d, expand, gated):
    args = on(DEV, case(n, d, seed=n * 100 + d, expand=expand))
    gate = gate_case(d, seed=d) if gated else {}
    got = impl(*args, **gate)
    assert len(got) == 6
    if not gated:
        assert got[4] is None and got[5] is got[1]
    for part, a, b in zip(NAMES, got, float64_route(*args, **gate)):
        if b is None:
            continue
        assert a.device == args[0].device
        assert rule_for(f"mhc_route/{name}", KERNEL_RULES).check(a.cpu(), b), part
    if gated:
        assert got[4].shape == () and 0.05 < float(got[4]) < 0.95     # a gate, not saturated


@pytest.mark.skipif(triton is None, reason="no Triton")
def test_triton_matches_twin():
    args = on(DEV, case(4, 130, seed=5))                # d > the kernel's 128-wide d tile
    gate = gate_case(130, seed=6)
    for part, a, b in zip(NAMES, mhc_route_triton(*args, **gate), mhc_route_torch(*args, **gate)):
        assert rule_for("mhc_route/triton_vs_twin", KERNEL_RULES).check(a.cpu(), b.cpu()), part


def test_twin_gate_is_the_models_bit_for_bit():
    """The torch backend keeps its bits when it uses the twin: port/model.py's Engram gate."""
    import math
    from port.model import sigmoid, unit_rms
    args = case(4, 48, seed=2)
    gate = {k: v.cpu() for k, v in gate_case(48, seed=3).items()}
    _, u, _, _, alpha, bx = mhc_route_torch(*args, **gate)
    want = sigmoid((unit_rms(u[None]) * unit_rms(gate["ek"][None])).sum(-1, keepdim=True)
                   / math.sqrt(48))
    assert torch.equal(alpha, want[0, 0])
    assert torch.equal(bx, (u[None] + want * gate["ev"][None])[0])


def test_twin_sinkhorn_is_the_models_bit_for_bit():
    r, X, a_pre, b_pre, a_post, b_post, a_res, b_res = case(4, 8, seed=9)
    P = mhc_route_torch(r, X, a_pre, b_pre, a_post, b_post, a_res, b_res)[3]
    assert torch.equal(P, log_sinkhorn(a_res * r[8:].reshape(4, 4) + b_res))


def test_sinkhorn_columns_sum_to_one():
    args = on(DEV, case(4, 16, seed=3))
    for impl in (mhc_route_torch,) + ((mhc_route_triton,) if triton else ()):
        P = impl(*args)[3].cpu().double()
        assert (P.sum(0) - 1).abs().max() < 1e-6       # columns normalise last (spec b.7)


def test_bad_inputs_named():
    args = list(case(4, 8, seed=1))
    with pytest.raises(MhcRouteError, match=r"r must be float32 \[2n \+ n\*n\] = \[24\]"):
        mhc_route_torch(args[0][:20], *args[1:])
    with pytest.raises(MhcRouteError, match="b_res must be float32 \\[4, 4\\]"):
        mhc_route_torch(*args[:7], torch.zeros(3, 3))
    with pytest.raises(MhcRouteError, match="n=17 lanes outside 1..16"):
        mhc_route_torch(torch.zeros(2 * 17 + 289), torch.zeros(17, 4), *args[2:])
    with pytest.raises(MhcRouteError, match="iters=0"):
        mhc_route_torch(*args, iters=0)
    ek = torch.zeros(8)
    with pytest.raises(MhcRouteError, match="ek and ev come together"):
        mhc_route_torch(*args, ek=ek)
    with pytest.raises(MhcRouteError, match=r"ev must be float32 \[d=8\]"):
        mhc_route_torch(*args, ek=ek, ev=torch.zeros(7))
    if triton:
        with pytest.raises(MhcRouteError, match=r"ek must be float32 \[d=8\]"):
            mhc_route_triton(*args, ek=ek.double(), ev=ek)


@pytest.mark.skipif(triton is None, reason="no Triton")
@pytest.mark.parametrize("gated", [False, True])
def test_one_launch_and_no_aten_op(gated):
    """Gate or not, the routing is one kernel launch: every result is a view of its buffer."""
    from tests.kernels.test_sparse_attn import _launches_of
    args = on(DEV, case(4, 48, seed=7, expand=True))
    gate = gate_case(48, seed=8) if gated else {}
    kernels, ops = _launches_of(lambda: mhc_route_triton(*args, **gate))
    assert kernels == ["_mhc_route_kernel"] and ops == []
