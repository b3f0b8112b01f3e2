"""The triton backend's fused decode body (port/fused.py): its composition against the torch
port (twin kernels: the same contracts in plain torch), the Triton kernels against the twins,
the points it exposes and hides, its capturability, and planted faults inside it."""
from tests import paths
import os
import sys

import pytest
import torch

from kernels.norm_gemv import triton as _triton
from ladder.sides.capture import capture_port, capture_reference
from ladder.engine.compare import compare_ladders, first_bit_difference
from ladder.sides.faults import FAULTS
from ladder.engine.locate import locate
from ladder.model.points import expected
from ladder.engine.rules import PORT_RULES
from ladder.sides.reference_rules import rule_for
from tests.captures import setup
from port.fused import HIDDEN, LAYER_TRACED, FusedBody
from port.graph import DecodeGraph
from port.model import V2Model

sys.path.insert(0, os.path.join(paths.TOOLS, "bench"))
import count_launches as cl                                          # noqa: E402
from kernels.norm_gemv import (norm_cq_gemv_triton, norm_gemv_triton)

needs_triton = pytest.mark.skipif(_triton is None, reason="no Triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"     # Triton: a GPU, else the interpreter


def _seq(cfg, n, seed):
    return torch.randint(0, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(seed))


def _fused(parts, cfg, kernels="twin", **kw):
    kw.setdefault("device", DEV)
    model = V2Model.new(cfg, *parts, backend="triton", **kw)
    model.fused = FusedBody(model, kernels)
    return model


@pytest.fixture(scope="module", params=["dense", "cq"])
def pair(request, tiny_cfg, tiny_params):
    """(torch model, triton model on the twin kernels) over the same parts."""
    torch_model = V2Model.from_params(tiny_params, tiny_cfg, weights=request.param, device=DEV)
    return torch_model, _fused(torch_model.parts, tiny_cfg)


def test_fused_body_matches_the_torch_port_through_wraps(pair, tiny_cfg):
    # A different op order (norms folded into products, Sinkhorn in one program, packed
    # codes for cq): the port's own logits rule, not bits; every state tensor alike.
    a, b = pair
    assert b.fused.w.form == ("packed" if a.rotate else "dense")
    sa, sb = a.make_state(), b.make_state()
    rule = rule_for("port/logits", PORT_RULES)
    for t in _seq(tiny_cfg, 20, seed=3).tolist():                  # window 8: wraps twice
        la, lb = a.step(t, sa), b.step(t, sb)
        assert rule.check(lb, la), float((la - lb).abs().max())
        assert torch.equal(la.argmax(), lb.argmax())
    last = tiny_cfg.num_layers - 1
    checks = [("lanes", f"L{last:02d}.x", sa.lanes, sb.lanes),
              ("hidden", "final_norm", sa.hidden, sb.hidden)]
    checks += [(f"{kv}[{i}]", f"L{i:02d}.{kv}", getattr(sa, kv)[i], getattr(sb, kv)[i])
               for i in range(last + 1) for kv in ("k", "v")]
    checks += [(f"vraw[{s}]", f"engram_v{s}", sa.vraw[s], sb.vraw[s])
               for s in range(tiny_cfg.num_sites)]
    for name, point, want, got in checks:
        assert rule_for(f"port/{point}", PORT_RULES).check(got, want), name


def test_cq_streams_the_codes_joined_into_one_launch_per_product(tiny_cfg, tiny_params):
    a = V2Model.from_params(tiny_params, tiny_cfg, weights="cq", device=DEV)
    b = _fused(a.parts, tiny_cfg)
    w = b.fused.w
    L = tiny_cfg.num_layers
    assert all(len(p.blocks) == 1 and p.w is None for p in w.qkvg + w.out + w.router)
    assert w.qkvg[0].blocks[0].packed.dtype == torch.uint8
    # the default bits map gives q|k|v|gate one width: their rows joined, one launch
    assert w.qkvg[0].blocks[0].out == b.layers[0].qkvg.shape[1]
    assert len(w.router) == L and w.head.blocks[0].bits == 4


def test_mixed_code_widths_split_a_product_into_blocks(tiny_cfg, tiny_params):
    from reference.cact import build_cact
    f = build_cact(tiny_params, tiny_cfg, "embedding=4,mhc=4,attn.q_proj=4,default=2")
    a = V2Model.from_cactfile(f, "cq", device=DEV)
    b = _fused(a.parts, tiny_cfg)
    blocks = b.fused.w.qkvg[0].blocks
    assert [(blk.row0, blk.bits) for blk in blocks] == [(0, 4), (tiny_cfg.attn_dim_eff, 2)]
    sa, sb = a.make_state(), b.make_state()
    for t in _seq(tiny_cfg, 4, seed=5).tolist():
        assert rule_for("port/logits", PORT_RULES).check(b.step(t, sb), a.step(t, sa))


@needs_triton
@pytest.mark.slow
@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_triton_kernels_match_their_twins_in_the_body(tiny_cfg, tiny_params, weights):
    base = V2Model.from_params(tiny_params, tiny_cfg, weights=weights, device=DEV)
    twin, tri = _fused(base.parts, tiny_cfg), _fused(base.parts, tiny_cfg, "triton")
    st, sr = twin.make_state(), tri.make_state()
    # the interpreter is slow: dense steps past the window (the ring wraps), cq a few steps
    n = tiny_cfg.kv_window + 2 if weights == "dense" else 4
    for t in _seq(tiny_cfg, n, seed=11).tolist():
        lt, lr = twin.step(t, st), tri.step(t, sr)
        assert rule_for("port/logits", PORT_RULES).check(lr, lt), float((lr - lt).abs().max())


@needs_triton
def test_interpreter_block_width_changes_no_bit():
    # port/fused.py widens the products' output blocks under the interpreter: each output's
    # reduction order is the same at every width, so the bits are too.
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(2)
    x, gain, w = (t.to(DEV) for t in (torch.randn(48, generator=g), torch.randn(48, generator=g),
                                      torch.randn(48, 200, generator=g)))
    assert torch.equal(norm_gemv_triton(x, gain, w, "zc", block_n=32),
                       norm_gemv_triton(x, gain, w, "zc", block_n=256))
    ops = CqWeight.from_dense(torch.randn(70, 48, generator=g), 2).kernel_operands(DEV)
    assert torch.equal(norm_cq_gemv_triton(x, gain, "zc", *ops, block_rows=16),
                       norm_cq_gemv_triton(x, gain, "zc", *ops, block_rows=64))


def _traced(model, tokens, prefill):
    state, got = model.make_state(), []
    for j, t in enumerate(tokens):
        got = []
        model.step_traced(t, state, None, lambda n, i, v: got.append(
            n if i is None else f"L{i:02d}.{n}"), prefill=prefill)
    return got


def test_step_traced_shows_every_point_a_kernel_boundary_exposes(pair, tiny_cfg):
    _, b = pair
    every = [n for n, _ in expected(tiny_cfg)]
    fused = _traced(b, [5, 9, 13], prefill=False)         # position 2: the fused body
    # the seven points a kernel keeps in registers (docs/gpu.md, "What the ladder sees")
    assert set(HIDDEN) == {"nx", "h_in", "res_logits", "attn_post", "mlp_in", "mlp_out",
                           "block_out"}
    assert fused == [n for n in every if n.split(".")[-1] not in HIDDEN]
    assert set(b.hidden_points) == set(HIDDEN) and not V2Model.new(
        tiny_cfg, *b.parts, device=DEV).hidden_points
    assert _traced(b, [5, 9, 13], prefill=True) == every   # prefill arithmetic: all of them
    assert set(LAYER_TRACED) | set(HIDDEN) == {n.split(".")[1] for n in every if "." in n}


def test_the_ladder_names_hidden_points_and_compares_the_rest(tiny_cfg):
    cfg, params, _, tokens, prompt = setup()
    model = _fused(V2Model.from_params(params, cfg, device=DEV).parts, cfg)
    port = capture_port(model, tokens[:prompt + 2], prompt, check_plain=True)
    ref = capture_reference(params, cfg, tokens[:prompt + 2], prompt)
    cmp = compare_ladders(port, ref)
    assert cmp.passed, str(cmp)
    assert len(cmp.hidden) == 2 * len(HIDDEN) * cfg.num_layers       # two decode steps
    assert all(k.startswith("decode") for k, _ in cmp.hidden)
    assert "hidden by fusion (not compared)" in str(cmp) and "layer_tail" in str(cmp)
    assert not any(r.point.endswith(".mlp_in") and r.step != "prefill" for r in cmp.rows)


def test_body_launches_are_position_independent_and_recorded(tiny_cfg, tiny_params):
    # The capturability proof covers Triton launches: the same kernels, grids, argument
    # shapes and scalars at every position, across the ring's wrap.
    model = _fused(V2Model.from_params(tiny_params, tiny_cfg, device=DEV).parts, tiny_cfg,
                   "triton")
    state = model.make_state()
    model.step(5, state)
    g = DecodeGraph(model, state)
    from port import graph as graph_mod
    seqs = []
    for tok in (9, 200, 7, 31, 2, 250, 4, 19, 88, 3):           # positions 1..10, wraps at 8
        g.prep(tok)                                  # each prep advances the position
        with graph_mod.BodyRecorder() as rec, graph_mod.triton_launch_log(rec.ops, run=False):
            g.body()                                 # recorded, not run: shapes and scalars
        seqs.append(rec.ops)
    assert all(s == seqs[0] for s in seqs)
    names = [op for op, *_ in seqs[0]]
    L = tiny_cfg.num_layers
    assert names.count("triton:_mhc_route_kernel") == L
    assert sum(n.startswith("triton:") for n in names) == 7 * L + tiny_cfg.num_sites + 2
    launching = [n for n in names if not n.startswith("triton:") and cl.launches_op(n)]
    assert launching == ["aten.index_select.default", "aten.mul.Tensor"], launching  # x0


FUSED_FAULTS = sorted(n for n, f in FAULTS.items() if f.fused is not None)


def _built(fault):
    """The fused body (twin kernels) on the weights the fault lives in."""
    from tests.captures import cq_file
    cfg, params = setup()[:2]
    base = V2Model.from_params(params, cfg, device=DEV) if fault.weights == "dense" else \
        V2Model.from_cactfile(cq_file(), "cq", device=DEV)
    return _fused(base.parts, cfg)


def _first_visible(point):
    """A fault's declared point, or the first point after it the fused body shows."""
    if "." in point and point.split(".", 1)[1] in HIDDEN:
        assert HIDDEN[point.split(".", 1)[1]] == "layer_tail", point
        return point.split(".", 1)[0] + ".y"
    return point


@pytest.mark.parametrize("name", FUSED_FAULTS)
def test_faults_reach_the_fused_body(name):
    # The fault's fused form alone: prefill positions (V2Model's layer) stay clean, and the
    # first point that differs at all is the declared one (or, when fusion hides it, the
    # next one shown) at the first decode position.
    cfg, params, _, tokens, prompt = setup()
    toks = tokens[:prompt + 3]
    fault = FAULTS[name]
    clean = capture_port(_built(fault), toks, prompt)
    with fault.fused():                               # before the build: some act at load
        bad = capture_port(_built(fault), toks, prompt)
    point, pos = fault.touches(cfg)
    assert first_bit_difference(bad, clean) == ("decode00", _first_visible(point),
                                                max(pos, prompt))


@pytest.mark.parametrize("name", sorted(n for n, f in FAULTS.items() if f.fused is None))
def test_faults_outside_the_body_reach_its_steps(name):
    # Host and prep faults (the n-gram hash, the window selection) have no fused form: the
    # body reads what prep writes. With a one-token prompt every later position is a fused
    # decode step, and the whole fault (planted as `ladder run --plant` does) first shows at
    # its declared point and position.
    cfg, _, _, tokens, _ = setup()
    fault = FAULTS[name]
    toks = tokens[:cfg.kv_window + 2]
    clean = capture_port(_built(fault), toks, 1)
    with fault.plant_in("triton"):
        bad = capture_port(_built(fault), toks, 1)
    point, pos = fault.touches(cfg)
    assert pos >= 1
    assert first_bit_difference(bad, clean)[1:] == (point, pos)


@pytest.mark.parametrize("kernels", ["twin", pytest.param("triton",
                                                         marks=[needs_triton, pytest.mark.slow])])
def test_locate_blames_the_fused_layer(kernels):
    # RoPE at pos+1 in layer 3 of the fused body only: the first divergence is a decode
    # step's L03.q, and re-running the fused layer on the reference's inputs still fails
    # there (its own error); layers 0-2 pass.
    cfg, params, _, tokens, prompt = setup()
    toks = tokens[:prompt + 2]
    model = _fused(V2Model.from_params(params, cfg, device=DEV).parts, cfg, kernels)
    ref = capture_reference(params, cfg, toks, prompt)
    with FAULTS["rope_pos_plus_1"].fused():
        bad = capture_port(model, toks, prompt)
        loc = locate(compare_ladders(bad, ref), port=bad, ref=ref, model=model)
    assert (loc.point, loc.position) == ("L03.q", prompt), str(loc)
    assert {r.point: r for r in loc.injection}["L03.q"].own, str(loc)
    assert all(r.local <= 1 for r in loc.layers[:3]), str(loc)
    assert "L03 still fails at q" in loc.verdict




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
