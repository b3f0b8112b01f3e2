"""Judging a port at its own precision (docs/precision.md): the declaration, the int8 KV
scheme on both sides, our port at bfloat16 / float16 / int8 KV, the noise-floor reference,
noise-unit rules, three-way verdicts, locate at precision, archives that declare a precision,
and the CLI."""
import json
import math
import os

import numpy as np
import pytest
import torch

from ladder.cli.main import main
from ladder.engine.compare import CompareError, compare_ladders
from ladder.engine.rule import Rule, RulesError, noise_units
from ladder.engine.rules import DEFAULT_RULES, NOISE_RULES, UNIT_EPS
from ladder.engine.table import frame, to_text
from ladder.engine.trace import Ladder
from ladder.model.precision import FLOAT32, Precision, PrecisionError
from ladder.sides.faults import planted
from ladder.sides.judge import ModelUnderTest, judge
from ladder.sides.noise_floor import capture_floor
from port.precision import PortPrecision, _int8_rows
from reference.precision import int8_absmax_row

SCHEDULE = dict(prompt_len=6, steps=10)      # 16 positions: past the tiny window of 8


@pytest.fixture(scope="module")
def model():
    return ModelUnderTest.build(preset="tiny", seed=0)


@pytest.fixture(scope="module")
def bf16_verdict(model):
    return judge(model.our_port(precision="bfloat16"), model, **SCHEDULE)


# ------------------------------------------------------------------ the declaration
@pytest.mark.parametrize("spec,want", [
    ("bfloat16", ("bfloat16", "bfloat16", "bfloat16")),
    ("bf16,kv=int8", ("bfloat16", "bfloat16", "int8")),
    ("float32,kv=int8", ("float32", "float32", "int8")),
    ("act=fp16,weights=cq,kv=int8", ("float16", "cq", "int8")),
    ({"activations": "float16", "kv": "float16"}, ("float16", "float16", "float16")),
])
def test_a_declaration_parses_to_its_three_parts(spec, want):
    p = Precision.parse(spec)
    assert (p.activations, p.weights, p.kv) == want
    assert Precision.parse(p.text()) == p                  # the canonical form round-trips


@pytest.mark.parametrize("spec,needle", [
    ("bf17", "activations='bf17' is not one of"),
    ("bfloat16,kv=int4", "kv='int4' is not one of"),
    ("float16,kv=float32", "kv=float32 is wider than activations=float16"),
    ("bfloat16,colour=red", "unknown field 'colour' at item 1"),
    ("bfloat16,kv=int8,kv=bfloat16", "field kv given twice"),
    ("bfloat16,float16", "after the first item, write key=value"),
    ("", "must be 1..200 ASCII characters"),
    ("ｂfloat16", "must be 1..200 ASCII characters"),
    ("b" * 201, "must be 1..200 ASCII characters"),
    ({"activations": 16}, "every field is a string"),
    (16, "a precision is a string"),
])
def test_a_bad_declaration_is_refused_naming_the_field(spec, needle):
    with pytest.raises(PrecisionError, match=None) as e:
        Precision.parse(spec)
    assert needle in str(e.value)


def test_float32_is_the_precision_the_float32_rules_are_for():
    assert FLOAT32.is_float32 and Precision.parse("act=float32,weights=cq").is_float32
    assert not Precision.parse("float32,kv=int8").is_float32


# ------------------------------------------------------------------ the int8 KV scheme
def test_the_int8_scheme_is_written_twice_and_agrees_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(7, 2, 16, generator=g) * torch.logspace(-3, 3, 16)
    x[3, 1] = 0.0                                           # an all-zero row keeps zeros
    ref, ours = int8_absmax_row(x), _int8_rows(x)
    assert torch.equal(ref, ours)
    scale = x.abs().amax(-1, keepdim=True) / 127
    code = ref / torch.where(scale > 0, scale, 1.0)
    # code * scale / scale is an integer up to the division's rounding
    assert (code - code.round()).abs().max() < 1e-4 and code.round().abs().max() <= 127
    assert bool(((ref - x).abs() <= scale / 2 * (1 + 1e-6)).all())
    assert torch.equal(ref[3, 1], torch.zeros(16))


# ------------------------------------------------------------------ our port at precision
def test_the_port_at_float32_is_the_port_bit_for_bit(model):
    from port.precision import _identity
    a, b = model.our_port(), model.our_port(precision="float32")
    assert a.rnd is _identity and a.kv_store is _identity         # nothing rounds anywhere
    assert not PortPrecision("float32", weights="bfloat16").is_float32
    sa, sb = a.make_state(), b.make_state()
    for t in model.tokens(12):
        assert torch.equal(a.step(t, sa), b.step(t, sb))


@pytest.mark.parametrize("act,dtype", [("bfloat16", torch.bfloat16), ("float16", torch.float16)])
def test_every_stored_tensor_of_a_low_precision_port_is_a_value_of_its_dtype(model, act, dtype):
    lad = judge(model.our_port(precision=act), model, prompt_len=3, steps=2,
                locate=False).obtained
    for key in lad.keys():
        v = lad[key]
        assert torch.equal(v, v.to(dtype).float()), key


def test_an_int8_kv_ring_holds_code_times_scale(model):
    port = model.our_port(precision="float32,kv=int8")
    state = port.make_state()
    for t in model.tokens(5):
        port.step(t, state)
    k = state.k[:, :, :5]                                   # [L, KV, pos, hd]
    scale = k.abs().amax(-1, keepdim=True) / 127
    assert bool((scale > 0).all())                           # no all-zero key rows here
    code = k / scale
    assert torch.allclose(code, code.round(), atol=1e-4, rtol=0)   # float32 division only


def test_the_port_refuses_a_precision_it_cannot_run(model):
    from port.model import V2Model
    from port.precision import PrecisionError as PortPrecisionError
    with pytest.raises(PortPrecisionError, match="runs on backend torch, decode eager"):
        V2Model.from_params(model.params, model.cfg, decode="graph", precision="bfloat16")
    with pytest.raises(PortPrecisionError, match="kv=float32 is wider"):
        PortPrecision("bfloat16", kv="float32")


# ------------------------------------------------------------------ the noise floor
def test_the_noise_floor_runs_in_the_declared_dtype_and_drifts(model):
    toks = model.tokens(12)
    floor = capture_floor(model.ref_params, model.cfg, toks, 4, Precision.parse("bfloat16"))
    ref = model.reference(toks, 4, model.cfg.kv_window)
    e = floor["prefill/embed"]
    assert torch.equal(e, e.to(torch.bfloat16).to(e.dtype))     # values of the declared dtype
    d = (floor["decode07/logits"].double() - ref["decode07/logits"].double()).abs().max()
    top = ref["decode07/logits"].abs().max()
    assert 2 ** -12 * top < d < 2 ** -3 * top          # a bf16 drift, not zero, not garbage


def test_noise_units_keep_a_running_maximum_and_one_rounding():
    b = torch.tensor([[1.0, -2.0], [1.0, 4.0], [0.0, 0.0]])
    f = torch.tensor([[1.0, -1.0], [1.0, 4.0], [0.0, 0.0]])         # drifts 1, 0, 0
    assert noise_units(f, b).tolist() == [1.0, 1.0, 1.0]            # the running maximum
    assert noise_units(f, b, 0.5).tolist() == [1.0, 2.0, 1.0]       # 0.5 x max|b| = 2 at row 1
    assert noise_units(f, b, 0.0, prior=3.0).tolist() == [3.0, 3.0, 3.0]


def test_a_noise_rule_allows_its_multiple_of_the_unit():
    rule = Rule(0.0, noise=4.0)
    b = torch.ones(2, 3)
    a = b + torch.tensor([[0.4], [0.5]])
    units = torch.tensor([0.1, 0.1], dtype=torch.float64)
    assert rule.position_errors(a, b, units=units) == pytest.approx([1.0, 1.25])
    with pytest.raises(RulesError, match="needs the noise-floor reference"):
        rule.position_errors(a, b)
    with pytest.raises(RulesError, match="noise=-1"):
        Rule(0.0, noise=-1)
    with pytest.raises(RulesError, match="noise=2 must be 0"):
        Rule(0.0, exact=True, noise=2)


# ------------------------------------------------------------------ three-way verdicts
def test_an_honest_bf16_port_passes_in_noise_units_and_fails_the_float32_rules(bf16_verdict):
    v = bf16_verdict
    assert v.passed and v.cmp.floor_label.startswith("noise floor (reference at bfloat16")
    assert v.cmp.rules is NOISE_RULES
    worst32 = compare_ladders(v.obtained, v.yardstick, DEFAULT_RULES).worst()
    assert worst32.error > 100                 # float32 bounds misjudge it by orders
    rows = [r for r in v.cmp.rows if r.max_abs > 0]
    assert all(r.floor_abs > 0 and r.noise_ratio > 0 for r in rows[:50])


def test_the_table_shows_the_floor_and_the_ratio(bf16_verdict):
    df = frame(bf16_verdict.cmp)
    assert {"floor_abs", "noise_ratio", "noise"} <= set(df.columns)
    assert "x floor" in to_text(df.head(5)) and "floor|f-b|" in to_text(df.head(5))


def test_noise_rules_without_a_floor_are_refused(bf16_verdict):
    v = bf16_verdict
    with pytest.raises(CompareError, match="no noise floor holds the point"):
        compare_ladders(v.obtained, v.yardstick, NOISE_RULES)


def test_a_fault_above_the_floor_is_located_at_its_point_and_precision(model):
    with planted("rope_pos_plus_1"):
        v = judge(model.our_port(precision="bfloat16"), model, **SCHEDULE)
    assert not v.passed and v.cmp.first.key == "prefill/L03.q"
    assert v.location.verdict.startswith("the layer's own error")
    assert "at bfloat16, the local noise floor" in v.location.rerun_on


def test_a_fault_below_the_floor_passes_as_below_the_floor_and_shows_its_size(model):
    # Sinkhorn at 19 iterations moves hres by ~2e-4, under a bfloat16 rounding of ~4e-3:
    # measured in noise units it is small, which is what tools/precision/precision_faults.py reports
    with planted("sinkhorn_19"):
        v = judge(model.our_port(precision="bfloat16"), model, **SCHEDULE)
        v32 = judge(model.our_port(), model, **SCHEDULE)
    assert v.passed and not v32.passed
    floor = model.floor(v32.tokens, v32.prompt_len, v32.window, "bfloat16")
    size = compare_ladders(v32.obtained, v32.yardstick, NOISE_RULES, floor=floor,
                           unit_eps=UNIT_EPS["bfloat16"])
    assert max(r.noise_ratio for r in size.rows if r.point.endswith("hres")) < 1


class _DeclaringPort:
    """A protocol port (ladder/sides/ports.py) that declares its precision."""

    def __init__(self, inner, precision):
        self.inner, self.precision = inner, precision

    def make_state(self):
        return self.inner.make_state()

    def step_traced(self, token, state, logits, trace):
        return self.inner.step_traced(token, state, logits, trace)


def test_a_protocol_ports_precision_attribute_is_judged_three_way(model):
    port = _DeclaringPort(model.our_port(precision="float16"), "float16")
    v = judge(port, model, **SCHEDULE)
    assert v.passed and v.cmp.precision == Precision.parse("float16")
    bad = _DeclaringPort(model.our_port(), "float12")
    with pytest.raises(ValueError, match="precision attribute: activations='float12'"):
        judge(bad, model, **SCHEDULE)


# ------------------------------------------------------------------ recordings
def _outside_archive(path, verdict, precision: str, params_sha256: str, schema=2):
    """A trace archive as a port in another stack writes it: numpy and safetensors only."""
    from safetensors.numpy import save_file
    lad = verdict.obtained
    tensors = {k: lad[k].numpy().astype(np.float32) for k in lad.keys()}
    producer = {"name": "outside", "backend": "numpy"}
    if schema >= 2:
        producer["precision"] = precision
    g = verdict.model.cfg
    manifest = {
        "format": "needle-parity-trace", "schema_version": schema, "producer": producer,
        "geometry": {"d_model": g.d_model, "num_heads": g.num_heads,
                     "num_kv_heads": g.num_kv_heads, "num_layers": g.num_layers,
                     "head_dim": g.head_dim, "mhc_lanes": g.mhc_lanes,
                     "engram_layers": list(g.engram_layers),
                     "engram_orders": list(g.engram_orders), "rope_theta": g.rope_theta,
                     "vocab_size": g.vocab_size},
        "kv_window": verdict.window, "weights": {"params_sha256": params_sha256},
        "schedule": {"tokens": list(verdict.tokens), "prompt_len": verdict.prompt_len,
                     "steps": [{"name": s.name, "pos": s.pos, "len": len(s.tokens)}
                               for s in lad.steps]},
        "argmax": {}, "captured": "all",
        "points": list(dict.fromkeys(k.split("/", 1)[1] for k in lad.keys())),
        "not_emitted": {}}
    save_file(tensors, str(path), metadata={"needle_parity_trace": json.dumps(manifest)})
    return str(path)


def test_an_outside_bf16_recording_is_judged_three_way_from_the_file_alone(
        tmp_path, bf16_verdict, model, capsys):
    path = _outside_archive(tmp_path / "bf16.safetensors", bf16_verdict, "bfloat16",
                            model.ref_sha256)
    back = Ladder.load(path)
    assert back.meta["precision"] == Precision.parse("bfloat16")
    assert main(["compare", path, "--locate"]) == 0
    text = capsys.readouterr().out
    assert "noise floor: the reference re-run at bfloat16" in text and "x floor" in text
    # the same values declared float32 are judged by the float32 rules, and fail
    path32 = _outside_archive(tmp_path / "f32.safetensors", bf16_verdict, "float32",
                              model.ref_sha256)
    assert main(["compare", path32]) == 1


def test_archive_versions_one_and_two(tmp_path, bf16_verdict, model):
    v1 = _outside_archive(tmp_path / "v1.safetensors", bf16_verdict, "", model.ref_sha256,
                          schema=1)
    assert Ladder.load(v1).meta["precision"] == FLOAT32          # version 1: float32
    from ladder.engine.archive import ArchiveError
    bad = _outside_archive(tmp_path / "bad.safetensors", bf16_verdict, "bfloat15",
                           model.ref_sha256)
    with pytest.raises(ArchiveError, match="field producer.precision: .*'bfloat15'"):
        Ladder.load(bad)
    from safetensors import safe_open
    with safe_open(bad, "np") as f:
        m = json.loads(f.metadata()["needle_parity_trace"])
    del m["producer"]["precision"]
    from safetensors.numpy import save_file, load_file
    missing = str(tmp_path / "missing.safetensors")
    save_file(load_file(bad), missing, metadata={"needle_parity_trace": json.dumps(m)})
    with pytest.raises(ArchiveError, match="field producer.precision is missing"):
        Ladder.load(missing)


def test_dump_writes_the_precision_it_ran_at(tmp_path, capsys):
    out = str(tmp_path / "d.safetensors")
    assert main(["dump", "torch", "--port-precision", "float16,kv=int8", "--steps", "3",
                 "--out", out]) == 0
    m = Ladder.load(out).meta
    assert m["producer"]["precision"] == "act=float16,weights=float16,kv=int8"
    assert m["precision"] == Precision.parse("float16,kv=int8")


# ------------------------------------------------------------------ the CLI
def test_run_at_a_precision_prints_the_floor_and_passes(capsys):
    assert main(["run", "--port-precision", "bf16,kv=int8", "--steps", "10"]) == 0
    out = capsys.readouterr().out
    assert "noise floor: the reference re-run at bfloat16 (kv int8)" in out
    assert "NOISE_RULES" in out and "x floor" in out and "bfloat16 kv int8)" in out


@pytest.mark.parametrize("argv,needle", [
    (["run", "--port-precision", "bf17"], "activations='bf17'"),
    (["run", "--port-precision", "bf16", "--backend", "native"], "--backend torch --decode eager"),
    (["run", "--port-precision", "bf16", "--model", "attn_v41"], "has its own bf16 rules"),
])
def test_run_refuses_a_precision_it_cannot_judge(argv, needle, capsys):
    assert main(argv) == 2
    assert needle in capsys.readouterr().err


def test_the_report_draws_the_port_over_the_floor(tmp_path, bf16_verdict):
    from ladder.engine.report import write_report
    paths = write_report(bf16_verdict.cmp, tmp_path, None, {}, plot_backend="svg")
    html = open(paths["html"]).read()
    assert "The port&#x27;s error over the noise floor&#x27;s" in html or \
        "The port's error over the noise floor's" in html
    plain = judge(ModelUnderTest.build(preset="tiny", seed=0).our_port(), bf16_verdict.model,
                  **SCHEDULE)
    html32 = open(write_report(plain.cmp, tmp_path / "f32", None, {},
                               plot_backend="svg")["html"]).read()
    assert "noise floor" not in html32


def test_the_floors_products_round_once_from_float32():
    from reference.ops import matmul
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    b = torch.randn(64, 5, generator=g).to(torch.bfloat16)
    got = matmul(a, b)
    exact = a.double() @ b.double()
    assert got.dtype == torch.bfloat16
    # one rounding of a float32-accumulated product: within one bf16 ulp of the exact value
    assert bool(((got.double() - exact).abs() <= 2.0 ** -8 * exact.abs() + 1e-6).all())
    a32, b32 = a.float(), b.float()
    assert torch.equal(matmul(a32, b32), a32 @ b32)                 # float32: a @ b itself


def test_a_name_map_declares_its_files_precision(tmp_path, bf16_verdict, capsys):
    from safetensors.torch import save_file
    from ladder.formats.namemap import NameMapError, from_dict
    from ladder.model.points import LAYER, POINTS
    lad = bf16_verdict.obtained
    tensors = {f"mine/{k}": v.contiguous() for k, v in lad.values.items()}
    tensors["mine/tokens"] = torch.tensor(lad.tokens)
    path = tmp_path / "foreign.safetensors"
    save_file(tensors, str(path))
    whole = sorted({k.split("/", 1)[1] for k in lad.values if "." not in k.split("/", 1)[1]})
    per_layer = [p.name for p in POINTS if p.scope == LAYER]

    def write(precision):
        toml = tmp_path / f"m{len(precision)}.toml"
        toml.write_text(f'[map]\nname = "mine"\nprefix = "mine/"\ntokens = "mine/tokens"\n'
                        f'precision = "{precision}"\n[steps]\nprefill = "prefill"\n'
                        f'decode = "decode{{i:02d}}"\n'
                        f'[[points]]\ntheirs = "{{name}}"\nours = "{{name}}"\n'
                        f'names = {json.dumps(whole)}\n'
                        f'[[points]]\ntheirs = "L{{layer}}.{{name}}"\n'
                        f'ours = "L{{layer}}.{{name}}"\nnames = {json.dumps(per_layer)}\n')
        return str(toml)
    assert main(["compare", str(path), "reference", "--map", write("bfloat16")]) == 0
    assert "noise floor: the reference re-run at bfloat16" in capsys.readouterr().out
    assert main(["compare", str(path), "reference", "--map", write("float32")]) == 1
    with pytest.raises(NameMapError, match=r"\[map\] precision: activations='bf15'"):
        from_dict({"map": {"name": "x", "precision": "bf15"}})


def _hand_ladder(rows: dict, label: str) -> Ladder:
    from ladder.engine.steps import schedule
    steps = schedule([1, 2, 3], 1)                           # prefill, decode00, decode01
    return Ladder(steps, {f"{s.name}/p": torch.full((1, 4), rows[s.name]) for s in steps},
                  label)


@pytest.mark.parametrize("keep", ["all", "summary"])
def test_the_noise_unit_carries_the_floors_drift_across_steps(keep):
    from ladder.engine.rule import RuleSet
    ref = _hand_ladder({"prefill": 1.0, "decode00": 1.0, "decode01": 1.0}, "ref")
    floor = _hand_ladder({"prefill": 1.0, "decode00": 1.1, "decode01": 1.0}, "floor")
    port = _hand_ladder({"prefill": 1.0, "decode00": 1.0, "decode01": 1.3}, "port")
    rules = RuleSet(rules={"*": Rule(0.0, noise=4.0)})
    cmp = compare_ladders(port, ref, rules, floor=floor, keep=keep)
    # decode01's own floor error is 0, but the floor drifted 0.1 at decode00: 0.3 <= 4 x 0.1
    assert cmp.passed
    last = [r for r in cmp.rows if r.step == "decode01"]
    if last:
        assert last[0].units == pytest.approx((0.1,)) and last[0].noise_ratio == pytest.approx(3)
    worse = _hand_ladder({"prefill": 1.0, "decode00": 1.0, "decode01": 1.5}, "port")
    assert not compare_ladders(worse, ref, rules, floor=floor, keep=keep).passed


def test_compare_refuses_a_low_precision_yardstick_and_a_reference_candidate(
        tmp_path, bf16_verdict, model, capsys):
    a = _outside_archive(tmp_path / "a.safetensors", bf16_verdict, "bfloat16", model.ref_sha256)
    assert main(["compare", a, a]) == 2
    assert "a float32 yardstick" in capsys.readouterr().err
    assert main(["compare", "reference", "torch", "--port-precision", "bf16"]) == 2
    assert "here it is the reference" in capsys.readouterr().err


def test_rules_noise_prints_the_noise_rules(capsys):
    assert main(["rules", "--noise"]) == 0
    text = capsys.readouterr().out
    assert "noise = 4" in text and "never below the float32 port bound" in text
