"""The fused decode body below float32 (port/fused.py, kernels/narrow.py): every kernel fed 16-bit
activations stores exactly its float32 result on the widened inputs rounded once (bit for bit,
Triton under the interpreter and the torch twins alike), the Triton kernels agree with their
twins to one rounding, and the whole body at bfloat16 / float16 passes the ladder three-way
against the noise floor, locates a fault planted inside it, and keeps its ring in 16 bits."""
import pytest
import torch

from kernels import (engram_prelude, final_norm, layer_tail, mhc_route, norm_gemv, qk_rope_ring,
                     sparse_attn)
from kernels.narrow import narrow_torch
from kernels.norm_gemv import triton
from ladder.cli.main import main
from ladder.engine.rules import KERNEL_RULES
from ladder.sides.faults import FAULTS
from ladder.sides.judge import ModelUnderTest, judge
from ladder.sides.reference_rules import rule_for
from port.fused import FusedBody
from port.precision import PrecisionError
from tests.kernels import test_engram_prelude as eng_t
from tests.kernels import test_layer_tail as tail_t
from tests.kernels import test_mhc_route as route_t
from tests.kernels import test_qk_rope_ring as rope_t

DEV = "cuda" if torch.cuda.is_available() else "cpu"
needs_triton = pytest.mark.skipif(triton is None, reason="no Triton")
LOW = [torch.bfloat16, torch.float16]
IMPLS = ["twin", pytest.param("triton", marks=needs_triton)]


def _impl(mod, base, which):
    return getattr(mod, f"{base}_{'torch' if which == 'twin' else 'triton'}")


def _held(values, act, hold):
    """Activations rounded to `act` and held as `hold` (act itself, or float32: the widened
    inputs); everything else (weights, int buffers) as given."""
    return [v.to(act).to(hold) if low else v for v, low in values]


# Each case: (kernel name, run(which, hold_dtype, act) -> outputs). A run builds its inputs from
# fixed seeds, so the 16-bit and the float32 run see the same values.
def _final_norm(which, hold, act):
    X, gain = final_norm_case()
    X, = _held([(X, True)], act, hold)
    hidden = torch.zeros(X.shape[1], device=DEV)
    mean = _impl(final_norm, "final_norm", which)(X, gain, hidden)
    return [mean, hidden]


def final_norm_case():
    g = torch.Generator().manual_seed(7)
    return ((torch.randn(4, 48, generator=g) * 3 + 0.5).to(DEV),
            (0.2 * torch.randn(48, generator=g)).to(DEV))


def _mhc_route(which, hold, act):
    args = route_t.on(DEV, route_t.case(4, 48, seed=3))
    gate = route_t.gate_case(48, seed=4)
    flags = [True, True] + [False] * 6
    args = _held(list(zip(args, flags)), act, hold)
    ek, ev = _held([(gate["ek"], True), (gate["ev"], True)], act, hold)
    return list(_impl(mhc_route, "mhc_route", which)(*args, ek=ek, ev=ev))


def _qk_rope_ring(which, hold, act):
    args = rope_t.case(4, 2, 16, 8, pos=5, seed=2)
    flags = [True, False, False, False, False, False, False, True, True]
    args = _held(list(zip(args, flags)), act, hold)
    q, k, v, gate = _impl(qk_rope_ring, "qk_rope_ring", which)(*args, 4, 2)
    return [q, k, v, gate, args[7], args[8]]


def _sparse_attn(which, hold, act):
    g = torch.Generator().manual_seed(5)
    q, kr, vr = (torch.randn(*s, generator=g).to(DEV) for s in ((1, 4, 16), (40, 2, 16),
                                                                 (40, 2, 16)))
    idx = torch.tensor([[3, -1, 7, 8, 30, -1, 12, 0, 39, 1]], device=DEV)
    q, kr, vr = _held([(q, True), (kr, True), (vr, True)], act, hold)
    return [_impl(sparse_attn, "sparse_attn", which)(q, kr, vr, idx, 0.25)]


def _layer_tail(which, hold, act):
    args = tail_t.case(4, 48, 64, seed=6)
    flags = [True, True, True, True, True, True] + [False] * 6
    args = _held(list(zip(args, flags)), act, hold)
    return list(_impl(layer_tail, "layer_tail", which)(*args))


def _norm_gemv(kind, rotate):
    def run(which, hold, act):
        g = torch.Generator().manual_seed(8)
        x, gain = torch.randn(4, 48, generator=g).to(DEV), torch.randn(192, generator=g).to(DEV)
        w = (torch.randn(256 if rotate else 192, 70, generator=g) / 14).to(DEV)
        x, w = _held([(x, True), (w, True)], act, hold)
        x = x.reshape(-1) if kind in ("zc", "mul") else x
        gain = {"zc": gain, "mul": gain.to(act).to(hold)}.get(kind)
        return [_impl(norm_gemv, "norm_gemv", which)(x, gain, w, kind, rotate=rotate)]
    return run


def _norm_cq_gemv(which, hold, act):
    from port.cq import CqWeight
    g = torch.Generator().manual_seed(9)
    x, gain = torch.randn(48, generator=g).to(DEV), torch.randn(48, generator=g).to(DEV)
    ops = CqWeight.from_dense(torch.randn(70, 48, generator=g), 3).kernel_operands(DEV)
    x, = _held([(x, True)], act, hold)
    return [_impl(norm_gemv, "norm_cq_gemv", which)(x, gain, "zc", *ops)]


def _engram_prelude(form):
    def run(which, hold, act):
        args, kw, _ = eng_t.case(form=form, seed=1)
        args[4], = _held([(args[4], True)], act, hold)                  # the value ring
        kv = _impl(engram_prelude, "engram_prelude", which)(*args, **kw, act=hold)
        return [kv, args[4]]
    return run


CASES = {
    "final_norm": _final_norm, "mhc_route": _mhc_route, "qk_rope_ring": _qk_rope_ring,
    "sparse_attn": _sparse_attn, "layer_tail": _layer_tail,
    "norm_gemv_zc": _norm_gemv("zc", False), "norm_gemv_unit_rotated": _norm_gemv("unit", True),
    "norm_gemv_mul": _norm_gemv("mul", False), "norm_gemv_none": _norm_gemv("none", False),
    "norm_cq_gemv": _norm_cq_gemv,
    "engram_prelude_dense": _engram_prelude("dense"),
    "engram_prelude_packed": _engram_prelude("packed"),
}


def _bits(t, act):
    """A result as the 16-bit values it holds (an exact conversion when it is stored wider)."""
    return t.to(act) if t.dtype != act else t


@pytest.mark.parametrize("act", LOW, ids=["bf16", "fp16"])
@pytest.mark.parametrize("which", IMPLS)
@pytest.mark.parametrize("name", [n for n in CASES if not n.startswith("engram")])
def test_a_16bit_kernel_is_its_float32_result_rounded_once(name, which, act):
    low = CASES[name](which, act, act)
    wide = CASES[name](which, torch.float32, act)
    for got, f32 in zip(low, wide):
        # the results are held in the activation dtype (a ring wider than it holds its values)
        assert got.dtype in (act, torch.float32)
        assert torch.equal(_bits(got, act).view(torch.int16),
                           narrow_torch(f32, act).view(torch.int16)), name


@pytest.mark.parametrize("act", LOW, ids=["bf16", "fp16"])
@pytest.mark.parametrize("which", IMPLS)
@pytest.mark.parametrize("form", ["dense", "packed"])
def test_the_engram_prelude_rounds_its_product_before_the_taps_read_it(form, which, act):
    # The key half and the ring row are the float32 product rounded once; the value is the
    # convolution of the rows the ring holds (the fresh one rounded, as stored).
    (kv, ring), (kv32, ring32) = (CASES[f"engram_prelude_{form}"](which, h, act)
                                  for h in (act, torch.float32))
    d = ring.shape[1]
    assert kv.dtype == act and ring.dtype == act
    assert torch.equal(kv[:d], kv32[:d].to(act)) and torch.equal(ring, ring32.to(act))
    args, kw, _ = eng_t.case(form=form, seed=1)
    assert int(args[5][0]) == int(args[7][0])            # tap 0 reads the row just written
    tapped = ring.float()[args[7]]
    v = torch.zeros(d, device=kv.device)
    for j in range(args[6].shape[0]):
        v = v + args[6][j] * tapped[j] * args[8][j]
    if DEV == "cpu":                # IEEE float32 in the same order (a GPU may contract FMAs)
        assert torch.equal(kv[d:], v.to(act))
    else:
        rule = rule_for(f"{str(act).replace('torch.', '')}/engram_prelude", KERNEL_RULES)
        assert rule.check(kv[d:].float().cpu(), v.to(act).float().cpu())


@needs_triton
@pytest.mark.parametrize("act", LOW, ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", list(CASES))
def test_a_16bit_triton_kernel_is_its_twin_to_one_rounding(name, act):
    tri, twin = (CASES[name](w, act, act) for w in ("triton", "twin"))
    rule = rule_for(f"{str(act).replace('torch.', '')}/{name}", KERNEL_RULES)
    for a, b in zip(tri, twin):
        assert a.dtype == b.dtype
        assert rule.check(a.float().cpu(), b.float().cpu()), (name, rule.error(a.float().cpu(),
                                                                               b.float().cpu()))


# ------------------------------------------------------------------ the body
@pytest.fixture(scope="module")
def tiny():
    return ModelUnderTest.build(preset="tiny", seed=0)


def _fused_port(m, precision, kernels="twin"):
    p = m.our_port(backend="triton", precision=precision)
    p.fused = FusedBody(p, kernels)
    return p


def test_a_16bit_body_keeps_its_ring_lanes_and_dense_weights_in_16_bits(tiny):
    p = _fused_port(tiny, "bfloat16")
    st = p.make_state()
    assert (st.k.dtype, st.v.dtype, st.vraw.dtype, st.lanes.dtype) == (torch.bfloat16,) * 4
    assert st.hidden.dtype == st.logits.dtype == torch.float32
    w = p.fused.w
    assert all(q.w.dtype == torch.bfloat16 for q in w.qkvg + w.out + w.router + [w.head])
    for t in tiny.tokens(12)[:11]:
        logits = p.step(int(t), st)
    assert logits.dtype == torch.float32 and torch.equal(logits, logits.bfloat16().float())
    assert p.fused.act == torch.bfloat16 and p.uses_body(st)
    # float32 stays float32: nothing converted
    p32 = _fused_port(tiny, None)
    assert p32.fused.act == torch.float32 and p32.make_state().k.dtype == torch.float32
    assert p32.fused.w.qkvg[0].w.data_ptr() == p32.layers[0].qkvg.data_ptr()


@pytest.mark.parametrize("weights,precision", [("dense", "bfloat16"), ("cq", "bfloat16"),
                                               ("dense", "float16")])
def test_the_16bit_fused_body_passes_three_way_past_the_window(weights, precision):
    m = ModelUnderTest.build(preset="tiny", seed=1, weights=weights)
    p = _fused_port(m, precision)
    v = judge(p, m, prompt_len=6, steps=10)          # 16 positions, window 8: the ring wraps
    assert v.passed, v.message()
    decode = [r for r in v.cmp.rows if r.step != "prefill"]
    assert decode and all(r.noise_ratio == r.noise_ratio for r in decode)   # judged three-way
    assert f"{precision})" in v.message() and "noise floor" in v.message()


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_the_16bit_body_is_capturable(tiny, precision):
    # What a CUDA graph needs, checked on the CPU: no host sync and the same op sequence (shapes,
    # dtypes, values) at every position, across the ring's wrap (window 8). The twin body's ops
    # are recorded (a Triton launch is opaque to the dispatcher).
    from port.graph import DecodeGraph, record_body_ops
    p = _fused_port(tiny, precision)
    st = p.make_state()
    p.step(5, st)
    g = DecodeGraph(p, st)
    record_body_ops(g, 1)       # a warm-up, as the capture's: builds the cached Walsh matrix
    seqs = [record_body_ops(g, tok) for tok in (9, 200, 7, 31, 2, 250, 4, 19, 88, 3)]
    assert len(seqs[0]) > 50 and all(ops == seqs[0] for ops in seqs)
    assert any("bfloat16" in repr(op) or "float16" in repr(op) for op in seqs[0])


@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_a_16bit_graph_step_is_its_eager_step_bit_for_bit(tiny, precision, monkeypatch):
    # decode="graph" with a stand-in for the CUDA capture (warm-up and capture run the body, each
    # replay runs it again): every replayed step is the eager step, 16-bit state included, across
    # the ring's wraps. (The capture's restore itself: tests/port/test_graph.py.)
    import port.backend
    import port.graph
    from port.model import V2Model

    class Replay:
        def __init__(self, body):
            self.body = body

        def replay(self):
            self.body()

    def stand_in(body):
        body()
        body()
        return Replay(body), None
    monkeypatch.setattr(port.graph, "cuda_capture", stand_in)
    monkeypatch.setattr(port.backend.TorchBackend, "graph_replay",
                        property(lambda self: self.graph_capture))
    eager = _fused_port(tiny, precision)
    graph = V2Model.new(tiny.cfg, *eager.parts, backend="triton", decode="graph",
                        precision=precision)
    graph.fused = FusedBody(graph, "twin")
    a, b = eager.make_state(), graph.make_state()
    for t in tiny.tokens(21)[:20]:
        assert torch.equal(eager.step(int(t), a), graph.step(int(t), b))
    assert b.decode_graph(graph).graph is not None and b.pos == 20
    for name in ("k", "v", "vraw", "lanes", "hidden"):
        assert getattr(b, name).dtype == getattr(a, name).dtype
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@needs_triton
@pytest.mark.slow
def test_the_triton_kernels_at_bf16_pass_three_way(tiny):
    # The interpreter: three decode steps (~20 s); the twin body above covers the wrap.
    v = judge(_fused_port(tiny, "bfloat16", "triton"), tiny, prompt_len=6, steps=3)
    assert v.passed, v.message()
    assert any(r.step == "decode02" for r in v.cmp.rows)


def test_a_fault_inside_the_16bit_body_is_located_at_its_point(tiny):
    # attn_gate_skipped in the fused body only: the first divergence is layer 0's attn_out at
    # the first decode step, as at float32, and above the bf16 noise floor.
    with FAULTS["attn_gate_skipped"].fused():
        v = judge(_fused_port(tiny, "bfloat16"), tiny, prompt_len=6, steps=3)
    assert not v.passed
    first = v.location.first
    assert (first.step, first.point) == ("decode00", "L00.attn_out"), v.message()


def test_the_fused_body_refuses_an_int8_cache_naming_the_backends(tiny):
    with pytest.raises(PrecisionError, match="backend triton with the KV cache in the "
                                             "activation dtype; given backend triton"):
        tiny.our_port(backend="triton", precision="bfloat16,kv=int8")


@pytest.mark.parametrize("argv,code,needle", [
    (["run", "--backend", "triton", "--port-precision", "bf16,kv=int8"], 2, "kv int8"),
    (["run", "--backend", "native", "--port-precision", "bf16"], 2, "--backend triton with"),
])
def test_the_cli_says_where_a_precision_runs(argv, code, needle, capsys):
    assert main(argv) == code
    assert needle in capsys.readouterr().err


@pytest.mark.parametrize("spec", ["float32", "bfloat16", "float16", "float32,kv=int8",
                                  "bfloat16,kv=int8", "float32,kv=bfloat16",
                                  "act=bfloat16,weights=cq,kv=bfloat16"])
def test_the_cli_refuses_exactly_what_the_port_refuses(spec):
    # ladder/cli/args.py restates port/backend.py's rule without torch: the two must agree.
    from argparse import Namespace
    from ladder.cli.args import _port_precision
    from ladder.model.precision import Precision
    from ladder.sides.model_input import LadderInputError
    from port.backend import BACKENDS, DECODES, check_precision
    from port.precision import PortPrecision
    prec = PortPrecision.of(Precision.parse(spec).to_json())
    verdicts = set()
    for backend in BACKENDS:
        for decode in DECODES:
            try:
                check_precision(prec, backend, decode)
                port_ok = True
            except PrecisionError:
                port_ok = False
            try:
                # the weights flag agrees with the spec: only the backend rule is at stake
                _port_precision(Namespace(port_precision=spec, model="needle_v2", cmd="run",
                                          backend=backend, decode=decode,
                                          weights="cq" if prec.weights == "cq" else None))
                cli_ok = True
            except LadderInputError:
                cli_ok = False
            assert port_ok == cli_ok, (spec, backend, decode)
            verdicts.add(port_ok)
    assert verdicts == ({True} if prec.is_float32 else {True, False})

