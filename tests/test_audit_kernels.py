"""Issue 24 §2, kind 2: fused kernels off the happy path - inputs small enough that `eps`
decides the norm, outputs written into strided or offset buffers, and ternary and mixed-width
packed products through the fused body against the torch port. Shapes are tiny: Triton runs
under the interpreter on CPU."""
import math

import pytest
import torch

from kernels.final_norm import final_norm_torch, final_norm_triton
from kernels.hadamard_mlp import hadamard_mlp_torch, hadamard_mlp_triton
from kernels.layer_tail import layer_tail_torch, layer_tail_triton
from kernels.norm_gemv import (norm_cq_gemv_torch, norm_cq_gemv_triton, norm_gemv_torch,
                               norm_gemv_triton, triton)
from ladder.engine.rules import KERNEL_RULES, PORT_RULES
from ladder.sides.reference_rules import rule_for
from tests.test_kernels_hadamard_mlp import float64_mlp
from tests.test_kernels_layer_tail import case as tail_case, float64_tail

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")


def _impls(twin, kernel):
    return [("twin", twin), pytest.param("triton", kernel, marks=needs_triton)]


# ---------------------------------------------------------------- eps decides the norm
# x of size 1e-5: mean(x^2) ~ 1e-10, four orders under eps = 1e-6, so the norm's output is
# ~x / 1e-3, not a unit vector: an implementation that drops or misplaces eps is far off.
def _tiny_x(shape, seed, scale=1e-5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * scale


def _f64_norm(x, gain, kind, eps):
    v = x.cpu().double().reshape(-1)
    r = torch.sqrt((v * v).mean() + eps)
    return (1 + gain.cpu().double()) * v / r if kind == "zc" else v / r


@pytest.mark.parametrize("name,impl", _impls(norm_gemv_torch, norm_gemv_triton))
@pytest.mark.parametrize("kind,eps", [("zc", 1e-6), ("unit", 1e-6), ("zc", 1e-2)])
def test_norm_gemv_where_eps_decides(name, impl, kind, eps):
    g = torch.Generator().manual_seed(1)
    x = _tiny_x((2, 24), seed=2)
    gain = 0.2 * torch.randn(48, generator=g) if kind == "zc" else None
    w = torch.randn(20, 48, generator=g) / math.sqrt(48)
    got = impl(x.to(DEV), None if gain is None else gain.to(DEV), w.to(DEV).t(), kind,
               eps=eps)
    want = _f64_norm(x, gain if gain is not None else torch.zeros(48), kind, eps) @ \
        w.double().t()
    # the scale: eps rules, so |xn| ~ |x| / sqrt(eps), far below a unit vector's
    assert float(want.abs().max()) < 0.1
    assert rule_for(f"norm_gemv/{name}", KERNEL_RULES).check(got.cpu(), want)


@pytest.mark.parametrize("name,impl", _impls(norm_gemv_torch, norm_gemv_triton))
def test_norm_gemv_of_a_zero_vector_is_zero_not_nan(name, impl):
    g = torch.Generator().manual_seed(3)
    w = torch.randn(10, 48, generator=g)
    for kind, gain in (("zc", torch.randn(48, generator=g)), ("unit", None)):
        got = impl(torch.zeros(48, device=DEV), None if gain is None else gain.to(DEV),
                   w.to(DEV).t(), kind)
        assert torch.equal(got.cpu(), torch.zeros(10)), kind


@pytest.mark.parametrize("name,impl", _impls(norm_cq_gemv_torch, norm_cq_gemv_triton))
@pytest.mark.parametrize("bits", [2, 5])                          # 5: ternary, as crumbs
def test_packed_norm_gemv_where_eps_decides(name, impl, bits):
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(bits)
    cw = CqWeight.from_dense(torch.randn(12, 100, generator=g) * 0.05, bits)
    x, gain = _tiny_x((100,), seed=4), 0.2 * torch.randn(100, generator=g)
    want = cw.matvec(((1 + gain) * x / torch.sqrt((x * x).mean() + 1e-6)))
    assert float(want.abs().max()) > 0
    got = impl(x.to(DEV), gain.to(DEV), "zc", *cw.kernel_operands(DEV)).cpu()
    assert rule_for("norm_gemv/triton_vs_twin", KERNEL_RULES).check(got, want)


@pytest.mark.parametrize("name,impl", _impls(final_norm_torch, final_norm_triton))
def test_final_norm_where_eps_decides_and_a_zero_mean(name, impl):
    g = torch.Generator().manual_seed(5)
    X, gain = _tiny_x((4, 40), seed=6), 0.2 * torch.randn(40, generator=g)
    hidden = torch.empty(40, device=DEV)
    impl(X.to(DEV), gain.to(DEV), hidden)
    mean = X.double().mean(0)
    want = (1 + gain.double()) * mean / torch.sqrt((mean * mean).mean() + 1e-6)
    assert float(want.abs().max()) < 0.1
    assert rule_for(f"final_norm/{name}", KERNEL_RULES).check(hidden.cpu(), want)
    # lanes that cancel: a zero mean gives a zero hidden row, not NaN
    Z = torch.stack([X[0], -X[0]]).to(DEV)
    impl(Z, gain.to(DEV), hidden)
    assert torch.equal(hidden.cpu(), torch.zeros(40))


@pytest.mark.parametrize("name,impl", _impls(hadamard_mlp_torch, hadamard_mlp_triton))
def test_hadamard_mlp_where_eps_decides(name, impl):
    g = torch.Generator().manual_seed(7)
    z = _tiny_x((40,), seed=8)
    gain, *ds = 0.2 * torch.randn(40, generator=g), *(1 + 0.3 * torch.randn(64, generator=g)
                                                      for _ in range(3))
    got = impl(z.to(DEV), gain.to(DEV), *(t.to(DEV) for t in ds))
    want = float64_mlp(z, gain, *ds)
    assert rule_for(f"hadamard_mlp/{name}", KERNEL_RULES).check(got.cpu(), want)


@pytest.mark.parametrize("name,impl", _impls(layer_tail_torch, layer_tail_triton))
def test_layer_tail_where_eps_decides(name, impl):
    """The attention output a is tiny: its ZC norm is decided by eps."""
    args = tail_case(3, 40, 64, seed=9)
    args[0] = _tiny_x((40,), seed=10).to(DEV)
    got, y = impl(*args)
    want, want_y = float64_tail(*args)
    rule = rule_for(f"layer_tail/{name}", KERNEL_RULES)
    assert rule.check(got.cpu(), want) and rule.check(y.cpu(), want_y)


# ---------------------------------------------------------------- strided and offset outputs
@pytest.mark.parametrize("name,impl", _impls(final_norm_torch, final_norm_triton))
def test_final_norm_writes_a_strided_hidden_row_and_nothing_else(name, impl):
    g = torch.Generator().manual_seed(11)
    X = (torch.randn(40, 3, generator=g).t() * 3).to(DEV)          # strided lanes too
    gain = (0.2 * torch.randn(40, generator=g)).to(DEV)
    fresh = torch.empty(40, device=DEV)
    impl(X, gain, fresh)
    buf = torch.full((2 * 40 + 1,), 7.0, device=DEV)
    hidden = buf[1::2]                                             # stride 2, offset 1
    assert hidden.stride() == (2,) and hidden.storage_offset() == 1
    impl(X, gain, hidden)
    assert torch.equal(hidden, fresh)
    assert torch.equal(buf[0::2], torch.full((41,), 7.0, device=DEV))


@pytest.mark.parametrize("name,impl", _impls(layer_tail_torch, layer_tail_triton))
def test_layer_tail_out_at_an_offset_of_a_flat_buffer(name, impl):
    """out= a [n, d] view starting mid-buffer (not on a row boundary of any [., d] layout);
    X read through strides (a transposed view)."""
    args = tail_case(3, 40, 64, seed=12)
    args[3] = args[3].t().contiguous().t()                          # X: strides (1, 3)
    assert args[3].stride() == (1, 3)
    fresh, fresh_y = impl(*args)
    buf = torch.full((5 + 3 * 40 + 4,), 7.0, device=DEV)
    out = buf[5:5 + 120].view(3, 40)
    got, y = impl(*args, out=out)
    assert got.data_ptr() == out.data_ptr()
    assert torch.equal(out, fresh) and torch.equal(y, fresh_y)
    assert torch.equal(buf[:5], torch.full((5,), 7.0, device=DEV))
    assert torch.equal(buf[125:], torch.full((4,), 7.0, device=DEV))
    want, _ = float64_tail(*args)
    assert rule_for(f"layer_tail/{name}", KERNEL_RULES).check(got.cpu(), want)


@pytest.mark.parametrize("name,impl", _impls(norm_cq_gemv_torch, norm_cq_gemv_triton))
def test_packed_product_out_at_an_offset_keeps_its_neighbours(name, impl):
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(13)
    cw = CqWeight.from_dense(torch.randn(9, 100, generator=g) * 0.05, 5)
    x = torch.randn(100, generator=g).to(DEV)
    fresh = impl(x, None, "unit", *cw.kernel_operands(DEV))
    buf = torch.full((30,), 7.0, device=DEV)
    impl(x, None, "unit", *cw.kernel_operands(DEV), out=buf[13:22])
    assert torch.equal(buf[13:22], fresh)
    assert torch.equal(torch.cat([buf[:13], buf[22:]]), torch.full((21,), 7.0, device=DEV))


# ---------------------------------------------------------------- ternary and mixed widths
def _fused_pair(tiny_params, tiny_cfg, spec):
    from port.fused import FusedBody
    from port.model import V2Model
    from reference.cact import build_cact
    f = build_cact(tiny_params, tiny_cfg, spec)
    a = V2Model.from_cactfile(f, "cq", device=DEV)
    b = V2Model.new(tiny_cfg, *a.parts, backend="triton", device=DEV)
    b.fused = FusedBody(b, "twin")
    return a, b


def _steps_agree(a, b, cfg, n=4, seed=21):
    sa, sb = a.make_state(), b.make_state()
    rule = rule_for("port/logits", PORT_RULES)
    toks = torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))
    for t in toks.tolist():
        la, lb = a.step(t, sa), b.step(t, sb)
        assert rule.check(lb, la), float((la - lb).abs().max())
        assert torch.equal(la.argmax(), lb.argmax())


@pytest.mark.parametrize("spec, want", [
    # q ternary then k|v|gate 2-bit: both travel as 2-bit crumbs, yet are two blocks (their
    # level tables differ)
    ("embedding=4,mhc=4,attn.q_proj=1.58,default=2", [(0, 2, 5), ("attn", 2, 2)]),
    # 2-bit q, ternary k|v|gate
    ("embedding=4,mhc=4,attn.q_proj=2,default=1.58", [(0, 2, 2), ("attn", 2, 5)]),
    # all ternary: one joined block
    ("embedding=4,default=1.58", [(0, 2, 5)]),
    # three widths in one product: 3-bit q, 4-bit k, ternary v|gate
    ("embedding=4,mhc=4,attn.q_proj=3,attn.k_proj=4,default=1.58",
     [(0, 3, 3), ("attn", 4, 4), ("attn+kv", 2, 5)]),
])
def test_ternary_and_mixed_width_products_through_the_fused_body(tiny_params, tiny_cfg, spec,
                                                                  want):
    a, b = _fused_pair(tiny_params, tiny_cfg, spec)
    at = {"attn": tiny_cfg.attn_dim_eff, "attn+kv": tiny_cfg.attn_dim_eff + tiny_cfg.kv_dim}
    blocks = b.fused.w.qkvg[0].blocks
    assert [(blk.row0, blk.bits, blk.width) for blk in blocks] == \
        [(at.get(r, r), bits, width) for r, bits, width in want]
    assert sum(blk.out for blk in blocks) == b.fused.w.qkvg[0].out_features
    _steps_agree(a, b, tiny_cfg)


# qk_rope_ring: each head is normed on its own; one q head and one k head tiny (eps decides
# there), the others ordinary, so a norm over the wrong span or without eps shows.
from kernels.qk_rope_ring import qk_rope_ring_torch, qk_rope_ring_triton   # noqa: E402
from tests.test_kernels_qk_rope_ring import PARTS, case as qk_case, float64_prelude  # noqa: E402


@pytest.mark.parametrize("name,impl", _impls(qk_rope_ring_torch, qk_rope_ring_triton))
def test_qk_rope_ring_where_eps_decides_one_head(name, impl):
    H, KV, hd = 4, 2, 12
    args = qk_case(H, KV, hd, 8, 5, seed=31)
    x = args[0].clone()
    x[:hd] *= 1e-5                                   # q head 0
    x[H * hd + hd:H * hd + 2 * hd] *= 1e-5           # k head 1
    args[0] = x
    got = impl(*args, H=H, KV=KV)
    want = float64_prelude(*args, H=H, KV=KV)
    assert float(want[0][0].abs().max()) < 0.1 < float(want[0][1].abs().max())
    for part, a, b in zip(PARTS, got, want):
        assert rule_for(f"qk_rope_ring/{name}", KERNEL_RULES).check(a.cpu(), b), part


# engram_prelude: the value ring is written in place; as a strided, offset view of a bigger
# buffer (a site's rows inside a [sites, R, d + pad] block) it receives the same row, read back
# by the taps, and nothing around it moves.
from kernels.engram_prelude import engram_prelude_torch, engram_prelude_triton   # noqa: E402
from tests.test_kernels_engram_prelude import case as eg_case                     # noqa: E402


@pytest.mark.parametrize("name,impl", _impls(engram_prelude_torch, engram_prelude_triton))
@pytest.mark.parametrize("form", ["dense", "packed"])
def test_engram_prelude_writes_a_strided_offset_ring(name, impl, form):
    args, kw, _ = eg_case(seed=41, form=form)
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


@pytest.mark.parametrize("spec, one_block", [
    ("embedding=4,engram0.key_proj=1.58,engram0.value_proj=2,default=4", False),
    ("embedding=4,engram0.key_proj=1.58,engram0.value_proj=1.58,default=4", True),
])
def test_engram_kv_of_ternary_and_mixed_widths_through_the_fused_body(tiny_params, tiny_cfg,
                                                                     spec, one_block):
    """The prelude kernel takes one code matrix: a ternary|2-bit key/value pair (two level
    tables) must not be streamed as one block; an all-ternary pair is."""
    a, b = _fused_pair(tiny_params, tiny_cfg, spec)
    prod = b.fused.w.engram_kv[0]
    if one_block:
        assert [(blk.bits, blk.width) for blk in prod.blocks] == [(2, 5)] and prod.w is None
    else:
        assert not prod.blocks and prod.w is not None
    _steps_agree(a, b, tiny_cfg, n=5)
