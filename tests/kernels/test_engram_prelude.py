"""engram_prelude: an Engram site's fetch, key|value product, ring write and tap convolution in
one launch. Twin and Triton kernel against float64 for dense, rotated and packed weights, the
kernel against the twin, the ring write, skipped taps and bad inputs."""
import math

import pytest
import torch

from kernels.engram_prelude import (EngramPreludeError, engram_prelude_torch,
                                    engram_prelude_triton, triton)
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.reference_rules import rule_for
from tests.kernels.test_cq_gemv import pack_by_hand
from tests.kernels.test_norm_gemv import walsh128

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")
IMPLS = [("twin", engram_prelude_torch),
         pytest.param("triton", engram_prelude_triton, marks=needs_triton)]


def case(T=2, S=7, sub=24, d=48, R=13, J=4, dil=3, pos=17, form="dense", bits=2, seed=0):
    """A site at position `pos`: random tables and ring, one invalid n-gram, the taps of the
    model's schedule (slot (pos - j·dil) % R) with the last one skipped. Returns (args, kwargs,
    the float64 product matrix [F_in, 2d])."""
    g = torch.Generator().manual_seed(seed)
    F = T * sub
    tables = torch.randn(T * S, sub, generator=g)
    rows = torch.tensor([t * S + int(r) for t, r in enumerate(torch.randint(0, S, (T,),
                                                                             generator=g))])
    ok = torch.ones(T)
    ok[-1] = 0.0                                        # the longest n-gram not yet valid
    vring = torch.randn(R, d, generator=g)
    eslot = torch.tensor([pos % R])
    taps = torch.randn(J, d, generator=g) * 0.5
    tap_slots = torch.tensor([(pos - j * dil) % R for j in range(J)])
    tap_ok = torch.tensor([1.0] * (J - 1) + [0.0])
    f_in = -(-F // 128) * 128 if form != "dense" else F
    kw = {}
    if form == "packed":
        codes = torch.randint(0, 1 << bits, (2 * d, f_in), generator=g)
        norms = (torch.rand(2 * d, f_in // 128, generator=g) + 0.5).half() * 0.1
        levels = torch.randn(1 << bits, generator=g)
        w, w64 = None, (levels.double()[codes] * norms.double().repeat_interleave(128, 1)).t()
        kw["cq"] = (pack_by_hand(codes, bits).to(DEV), norms.to(DEV), levels.to(DEV), bits)
    else:
        rows_oi = torch.randn(2 * d, f_in, generator=g) / math.sqrt(f_in)   # [out, in] as held
        w, w64 = rows_oi.to(DEV).t(), rows_oi.double().t()
        kw["rotate"] = form == "rotated"
    args = [t.to(DEV) if isinstance(t, torch.Tensor) else t
            for t in (tables, rows, ok, w, vring, eslot, taps, tap_slots, tap_ok)]
    return args, kw, w64


def float64_prelude(args, w64):
    """-> (kv [2d], the ring after the write), in float64 on the CPU."""
    tables, rows, ok, _, vring, eslot, taps, tap_slots, tap_ok = (
        None if t is None else t.cpu() for t in args)
    d = vring.shape[1]
    e = (tables.double()[rows] * ok.double()[:, None]).reshape(-1)
    if w64.shape[0] != e.shape[0]:                       # rotated: pad, Walsh per 128-group
        e = torch.cat([e, torch.zeros(w64.shape[0] - e.shape[0], dtype=torch.float64)])
        e = (e.reshape(-1, 128) @ walsh128()).reshape(-1)
    kv = e @ w64
    ring = vring.double().clone()
    ring[int(eslot)] = kv[d:]
    v = sum(taps.double()[j] * ring[int(s)] * float(tap_ok[j]) for j, s in enumerate(tap_slots))
    return torch.cat([kv[:d], v]), ring


FORMS = [dict(form="dense"), dict(form="rotated"), dict(form="packed", bits=2),
         dict(form="packed", bits=3), dict(form="dense", T=3, sub=12, d=40, R=11, pos=4),
         dict(form="rotated", T=3, sub=50, d=20, R=12, pos=2)]      # F=150: two groups


@pytest.mark.parametrize("name,impl", IMPLS)
@pytest.mark.parametrize("geom", FORMS, ids=lambda g: "-".join(map(str, g.values())))
def test_against_float64(name, impl, geom):
    args, kw, w64 = case(seed=len(str(geom)), **geom)
    before = args[4].clone()
    want, want_ring = float64_prelude(args, w64)
    got = impl(*args, **kw)
    rule = rule_for(f"engram_prelude/{name}", KERNEL_RULES)
    assert got.device == args[4].device and got.shape == want.shape
    assert rule.check(got.cpu(), want)
    ring, slot = args[4].cpu(), int(args[5])
    assert rule.check(ring[slot], want_ring[slot])
    others = [r for r in range(ring.shape[0]) if r != slot]
    assert torch.equal(ring[others], before.cpu()[others])           # only eslot written


@pytest.mark.parametrize("name,impl", IMPLS)
@pytest.mark.parametrize("form", ["dense", "packed"])
def test_fresh_tap_is_the_written_row_bit_for_bit(name, impl, form):
    """One tap of weight 1 on this position: v is the written ring row, bit for bit (the kernel
    takes it from registers; it must be the value it stored)."""
    args, kw, _ = case(form=form, seed=9)
    args[6] = torch.zeros_like(args[6])
    args[6][0] = 1.0
    kv = impl(*args, **kw)
    d = args[4].shape[1]
    assert torch.equal(kv[d:], args[4][int(args[5])])


@pytest.mark.parametrize("name,impl", IMPLS)
def test_skipped_taps_add_nothing(name, impl):
    """A tap with tap_ok 0 contributes nothing, whatever its ring row holds (finite)."""
    args, kw, _ = case(seed=4)
    args[4][int(args[7][-1])] = 1e30                    # the skipped tap's row
    a = impl(*[t.clone() if isinstance(t, torch.Tensor) else t for t in args], **kw)
    args[4][int(args[7][-1])] = -7.0
    b = impl(*args, **kw)
    assert torch.equal(a, b)


@needs_triton
@pytest.mark.parametrize("geom", FORMS, ids=lambda g: "-".join(map(str, g.values())))
def test_triton_matches_twin(geom):
    args, kw, _ = case(seed=21, **geom)
    ring = args[4].clone()
    a = engram_prelude_torch(*args, **kw)
    ring_twin = args[4].clone()
    args[4].copy_(ring)
    b = engram_prelude_triton(*args, **kw)
    rule = rule_for("engram_prelude/triton_vs_twin", KERNEL_RULES)
    assert rule.check(b.cpu(), a.cpu()) and rule.check(args[4].cpu(), ring_twin.cpu())


@pytest.mark.parametrize("bits", [2, 4, 5])                  # 5 = ternary, stored as crumbs
def test_packed_reads_the_ports_cq_weights(bits):
    """The packed contract is CqWeight's storage: a real quantised key|value matrix gives
    CqWeight's own product of the fetched rows."""
    from port.cq import CqWeight
    args, _, _ = case(seed=bits)
    g = torch.Generator().manual_seed(bits)
    cw = CqWeight.from_dense(torch.randn(96, 48, generator=g) * 0.05, bits)
    tables, rows, ok = (t.cpu() for t in args[:3])
    k_want = cw.matvec((tables[rows] * ok[:, None]).reshape(-1))[:48]
    for name, impl in [("twin", engram_prelude_torch)] + \
            ([("triton", engram_prelude_triton)] if triton else []):
        got = impl(*args[:3], None, *args[4:], cq=cw.kernel_operands(DEV))
        assert rule_for("engram_prelude/triton_vs_twin", KERNEL_RULES).check(
            got[:48].cpu(), k_want), name


@needs_triton
@pytest.mark.parametrize("form", ["rotated", "packed"])
def test_one_launch_and_no_aten_op(form):
    from tests.kernels.test_sparse_attn import _launches_of
    args, kw, _ = case(form=form, seed=2)
    out = torch.empty(96, device=DEV)
    kernels, ops = _launches_of(lambda: engram_prelude_triton(*args, **kw, out=out))
    assert kernels == [f"_engram_{'cq' if form == 'packed' else 'dense'}_kernel"] and ops == []


@pytest.mark.parametrize("name,impl", IMPLS)
def test_out_receives_kv(name, impl):
    args, kw, _ = case(seed=6)
    ring = args[4].clone()
    buf = torch.full((100,), 3.0, device=DEV)
    impl(*args, **kw, out=buf[2:98])
    args[4].copy_(ring)
    assert torch.equal(buf[2:98], impl(*args, **kw))
    assert torch.equal(buf[[0, 1, 98, 99]], torch.full((4,), 3.0, device=DEV))


def test_bad_inputs_named_and_the_ring_untouched():
    args, kw, _ = case(seed=1)
    ring = args[4].clone()

    def refused(match, i=None, value=None, **over):
        a = list(args)
        if i is not None:
            a[i] = value
        for impl in [engram_prelude_torch] + ([engram_prelude_triton] if triton else []):
            with pytest.raises(EngramPreludeError, match=match):
                impl(*a, **{**kw, **over})
    refused(r"rows must be int64 \[T\]", 1, args[1].int())
    refused(r"ok must be float32 \[T=2\]", 2, args[2][:1])
    refused(r"w must be float32 \[128, 2d=96\] \(F=48, padded", rotate=True)
    refused(r"w must be float32 \[48, 2d=96\]", 3, args[3][:, :90])
    refused("give exactly one weight form", 3, None)
    refused(r"eslot must be int64 \[1\]", 5, args[5][0])
    refused(r"taps must be float32 \[J, d=48\]", 6, args[6][:, :40])
    refused(r"tap_slots must be int64 \[J=4\]", 7, args[7][:3])
    refused(r"tap_ok must be float32 \[J=4\]", 8, args[8].double())
    refused(r"out must be a contiguous float32 \[2d=96\]", out=torch.empty(192, device=DEV)[::2])
    packed = torch.zeros(96, 16, dtype=torch.uint8, device=DEV)     # 64 codes: not whole groups
    refused(r"cq packed rows .* must hold a multiple of 128 codes >= F=48", 3, None,
            cq=(packed, torch.ones(96, 1, device=DEV).half(), torch.zeros(4, device=DEV), 2))
    assert torch.equal(args[4], ring)


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


# engram_prelude: the value ring is written in place; as a strided, offset view of a bigger
# buffer (a site's rows inside a [sites, R, d + pad] block) it receives the same row, read back
# by the taps, and nothing around it moves.
@pytest.mark.parametrize("name,impl", _impls(engram_prelude_torch, engram_prelude_triton))
@pytest.mark.parametrize("form", ["dense", "packed"])
def test_engram_prelude_writes_a_strided_offset_ring(name, impl, form):
    args, kw, _ = case(seed=41, form=form)
    ring = args[4]
    R, d = ring.shape
    want_ring = ring.clone()
    a2 = list(args)
    a2[4] = want_ring
    want = impl(*a2, **kw)
    big = torch.full((R, d + 7), 5.0, device=DEV)
    view = big[:, 3:3 + d]                                 # row stride d + 7, offset 3
    view.copy_(ring)
    a2[4] = view
    got = impl(*a2, **kw)
    assert torch.equal(got, want) and torch.equal(view, want_ring)
    assert torch.equal(big[:, :3], torch.full((R, 3), 5.0, device=DEV))
    assert torch.equal(big[:, 3 + d:], torch.full((R, 4), 5.0, device=DEV))
