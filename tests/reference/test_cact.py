"""reference.cact against upstream-written .cact files (tests/fixtures/cact_*, made by
tools/fixtures/gen_cact_fixture.py with cactus-needle 2.0.8), and the writer against upstream's writer."""
from tests import paths
import hashlib
import json
import os

import pytest
import torch
from safetensors.torch import load_file

from ladder.engine.rules import CACT_RULES
from ladder.sides.reference_rules import rule_for
from reference import cact, cq
from reference.cact_layout import canon
from reference.config import V2Config
from reference.decode import forward_cached, init_kv_cache
from reference.params import init_params
from reference.tokenizer import Tokenizer

FIXTURES = paths.FIXTURES
with open(os.path.join(FIXTURES, "cact_upstream.json")) as _f:
    MANIFEST = json.load(_f)
FILES = sorted(MANIFEST["files"])
CFG = V2Config(**MANIFEST["config"])


@pytest.fixture(scope="module")
def upstream():
    return load_file(os.path.join(FIXTURES, "cact_upstream.safetensors"))


def _path(name):
    return os.path.join(FIXTURES, MANIFEST["files"][name]["file"])


def _bytes(name):
    with open(_path(name), "rb") as f:
        return f.read()


@pytest.fixture(scope="module")
def read():
    return {name: cact.read_cact(_path(name)) for name in FILES}


def test_fixture_files_are_the_ones_upstream_wrote():
    for name in FILES:
        assert hashlib.sha256(_bytes(name)).hexdigest() == MANIFEST["files"][name]["sha256"]


@pytest.mark.parametrize("name", FILES)
def test_reader_reemits_upstream_bytes(read, name):
    assert read[name].to_bytes() == _bytes(name)


@pytest.mark.parametrize("name", FILES)
def test_header_and_directory_as_upstream_reads_them(read, name):
    f, m = read[name], MANIFEST["files"][name]
    h = m["header"]                  # upstream's read_export geometry
    cfg = f.config
    ours = dict(num_tensors=len(f.slots), kv_window=cfg.kv_window, kv_bits=cfg.kv_bits,
                vocab_size=cfg.vocab_size, d_model=cfg.d_model, num_heads=cfg.num_heads,
                num_kv_heads=cfg.num_kv_heads, num_layers=cfg.num_layers,
                head_dim=cfg.head_dim, max_seq_len=cfg.max_seq_len, hada_n=cfg.hada_n,
                mhc_lanes=cfg.mhc_lanes, engram_slots=cfg.engram_slots,
                engram_sub_dim=cfg.engram_sub, num_engram_tables=cfg.engram_tables,
                engram_conv_taps=cfg.engram_taps, engram_conv_dilation=cfg.engram_dilation,
                engram_orders=list(cfg.engram_orders), engram_layers=list(cfg.engram_layers),
                rope_theta=cfg.rope_theta)
    assert ours == h
    assert [f"{int(x) & 0xFFFFFFFF:08x}" for x in cq.HEADER_CODEBOOK.view(torch.int32)] \
        == m["codebook_hex"]
    got = [{k: r[k] for k in ("dtype", "shape", "offset", "nbytes", "group", "bits")}
           for r in f.directory]
    assert got == [{k: r[k] for k in got[0]} for r in m["slots"]]
    # attn_dim comes back explicit; contrastive_dim only travels with the contrastive head.
    unknown = [] if "contrastive_head" in m["heads"] else ["contrastive_dim"]
    assert cfg.geometry_diff(CFG) == ["attn_dim"] * (CFG.attn_dim == 0) + unknown


@pytest.mark.parametrize("name", FILES)
def test_codes_bitwise_equal_to_upstream_unpacking(read, name):
    for slot, rec in zip(read[name].slots, MANIFEST["files"][name]["slots"]):
        if slot.dtype == cact.DTYPE_CQ:
            digest = hashlib.sha256(slot.codes().contiguous().numpy().tobytes()).hexdigest()
            assert digest == rec["codes_sha256"], slot.name


@pytest.mark.parametrize("name", FILES)
def test_dequantised_tensors_match_upstream_read_export(read, upstream, name):
    """FP16 slots bit for bit. CQ slots: upstream's numbers come from numpy's float32 matmul,
    whose summation order depends on the BLAS kernel (tools/fixtures/gen_cact_fixture.py proves in
    process that numpy on *our* pre-rotation rows reproduces them bit for bit); ours are the
    correctly rounded values, so the two differ by that summation order only."""
    rule = rule_for("cact/dequant_vs_upstream", CACT_RULES)
    for slot in read[name].slots:
        if slot.dtype == cact.DTYPE_RAW:
            continue
        ref = upstream[f"{name}/slot{slot.index:03d}"]
        mine = slot.dequantize()
        assert mine.shape == ref.shape, slot.name
        if slot.dtype == cact.DTYPE_CQ:
            assert rule.check(mine, ref), (slot.name, rule.error(mine, ref))
        else:
            assert torch.equal(mine.view(torch.int32), ref.view(torch.int32)), slot.name


@pytest.mark.parametrize("name", FILES)
def test_bits_map_selects_upstreams_widths(name):
    m = MANIFEST["files"][name]
    table, default = cq.parse_bits_map(m["bits_map"])
    heads = tuple((k, CFG.contrastive_dim if k.startswith("contrastive") else 1)
                  for k in m["heads"])
    specs = canon(CFG, heads, m["tokenizer"])
    assert len(specs) == len(m["slots"])
    for spec, rec in zip(specs, m["slots"]):
        want = cq.bits_for(spec.name, table, default) if spec.kind == "cq" else 0
        assert rec["bits"] == want, spec.name


@pytest.mark.parametrize("name", FILES)
def test_reference_decode_on_file_matches_upstream_decode(read, upstream, name):
    """Upstream's decode ran on upstream's dequantisation of this file; ours runs on ours."""
    f, m = read[name], MANIFEST["files"][name]
    rule = rule_for("cact/upstream_logits", CACT_RULES)
    tokens, P = torch.tensor([m["tokens"]]), m["prompt_len"]
    hist = dict(hist=tokens, hist_valid=torch.ones_like(tokens, dtype=torch.bool))
    kc, vc = init_kv_cache(f.config, 1, tokens.shape[1])
    calls = [("prefill", 0, P)] + [(f"step{t:02d}", t, 1) for t in range(P, tokens.shape[1])]
    for call, pos, S in calls:
        logits, kc, vc = forward_cached(f.params, f.config, tokens[:, pos:pos + S], kc, vc, pos,
                                        kv_window=f.config.kv_window, **hist)
        ref = upstream[f"{name}/logits/{call}"]
        assert rule.check(logits, ref), (call, rule.error(logits, ref))
        assert torch.equal(logits.argmax(-1), ref.argmax(-1)), call


def _upstream_inputs(name):
    m = MANIFEST["files"][name]
    p = init_params(CFG, seed=MANIFEST["seed"], perturbed=True)
    p = {k: v for k, v in p.items() if "_head/" not in k or k.split("/")[0] in m["heads"]}
    tok = cact.read_cact(_path("w2")).tokenizer if m["tokenizer"] else None
    return p, m["bits_map"], tok


@pytest.mark.parametrize("name", FILES)
def test_writer_output_is_byte_identical_to_upstreams_writer(name):
    """Same parameters, bits map and tokenizer as the generator gave upstream's exporter."""
    params, bits_map, tok = _upstream_inputs(name)
    assert cact.build_cact(params, CFG, bits_map, tok).to_bytes() == _bytes(name)


@pytest.mark.parametrize("bits", ["2", "3", "4", "1.58"])
def test_write_read_round_trip(tmp_path, tiny_cfg, tiny_params, bits):
    path = tmp_path / "m.cact"
    written = cact.write_cact(path, tiny_params, tiny_cfg, f"default={bits}")
    data = path.read_bytes()
    back = cact.read_cact(path)
    assert back.to_bytes() == data                       # write -> read -> write: same bytes
    assert back.config == tiny_cfg.replace(attn_dim=tiny_cfg.attn_dim_eff)
    assert back.tokenizer is None and set(back.params) == set(tiny_params)
    for a, b in zip(written.slots, back.slots):
        assert (a.dtype, a.shape, a.bits) == (b.dtype, b.shape, b.bits)
    fp16_key = "stack/layers/block/hadamard_mlp/d3"        # an FP16 slot: exact f16 rounding
    assert torch.equal(back.params[fp16_key], tiny_params[fp16_key].half().float())
    width = cq.TERNARY if bits == "1.58" else int(bits)
    slot = back.slot("layer03.q_proj")
    assert slot.bits == width
    w = tiny_params["stack/layers/block/self_attn/q_proj/kernel"][3].T
    idx, norms = cq.quantize(w, width)
    assert torch.equal(slot.codes(), idx) and torch.equal(slot.norms, norms)


def test_reference_runs_on_read_params(tmp_path, tiny_cfg, tiny_params):
    f = cact.parse_cact(cact.build_cact(tiny_params, tiny_cfg, "default=4").to_bytes())
    tokens = torch.tensor([[3, 9, 27, 81, 243 % 256]])
    kc, vc = init_kv_cache(f.config, 1, 5)
    logits, _, _ = forward_cached(f.params, f.config, tokens, kc, vc, 0)
    assert logits.shape == (1, 5, tiny_cfg.vocab_size) and torch.isfinite(logits).all()


def test_probe_heads_each_optional(tiny_cfg, tiny_params):
    for keep in ((), ("confidence_head",), ("contrastive_head", "confidence_head")):
        p = {k: v for k, v in tiny_params.items() if "_head/" not in k or k.split("/")[0] in keep}
        f = cact.parse_cact(cact.build_cact(p, tiny_cfg, "default=2").to_bytes())
        assert {k.split("/")[0] for k in f.params if "_head/" in k} == set(keep)
        for k in f.params:
            if "_head/" in k:
                assert torch.equal(f.params[k], p[k].half().float()), k


def test_odd_geometries_round_trip():
    for over in (dict(engram_orders=(2, 3, 4), engram_heads=2, d_model=96, num_heads=4,
                      num_kv_heads=1, engram_layers=(0,)),
                 dict(engram_layers=(), num_layers=2),
                 dict(d_model=200, num_heads=5, num_kv_heads=5, engram_slots=31)):
        cfg = V2Config.preset("tiny").replace(**over)
        p = init_params(cfg, seed=1, perturbed=True)
        f = cact.parse_cact(cact.build_cact(p, cfg, "default=3,embedding=4").to_bytes())
        assert f.config.geometry_diff(cfg) in ([], ["attn_dim"]), over
        assert f.config.attn_dim_eff == cfg.attn_dim_eff
        assert {k: tuple(v.shape) for k, v in f.params.items()} == \
            {k: tuple(v.shape) for k, v in p.items()}


def test_writer_refuses_bad_inputs_naming_them(tiny_cfg, tiny_params):
    bad = dict(tiny_params)
    bad["embedding/embedding"] = tiny_params["embedding/embedding"].clone()
    bad["embedding/embedding"][5, 7] = float("nan")
    with pytest.raises(ValueError, match=r"embedding: non-finite weight nan at \[5, 7\]"):
        cact.build_cact(bad, tiny_cfg)
    bad = dict(tiny_params)
    bad["stack/final_norm/scale"] = tiny_params["stack/final_norm/scale"] + 1e5
    with pytest.raises(ValueError, match=r"final_norm: value .* not a finite float16"):
        cact.build_cact(bad, tiny_cfg)
    bad = dict(tiny_params)
    bad["embedding/embedding"] = tiny_params["embedding/embedding"] * 1e6
    with pytest.raises(ValueError, match="embedding: the norm of group 0 of row .* overflows"):
        cact.build_cact(bad, tiny_cfg)
    for spec, msg in (("embedding=4", "needs a default"), ("default=5", "not one of 2, 3, 4"),
                      ("default=2,mhc", "not prefix=bits"), ("default=four", "not a number")):
        with pytest.raises(ValueError, match=msg):
            cact.build_cact(tiny_params, tiny_cfg, spec)
    tok = Tokenizer(["<pad>", "</s>", "<s>", "<unk>", "a"], [0.0] * 5, [2, 2, 2, 1, 0])
    with pytest.raises(ValueError, match="tokenizer has 5 pieces but vocab_size=256"):
        cact.build_cact(tiny_params, tiny_cfg, tokenizer=tok)
    with pytest.raises(ValueError, match="kv_bits=6"):
        cact.build_cact(tiny_params, tiny_cfg.replace(kv_bits=6))


def test_fp32_records_are_read_exactly(tiny_cfg, tiny_params):
    """Upstream's format allows FP32 (dtype 2) for non-CQ tensors; its exporter never writes
    it, but a reader must take it, exactly, and re-emit it unchanged."""
    f = cact.build_cact(tiny_params, tiny_cfg, "default=2")
    s = f.slot("layer01.d2")
    s.dtype, s.values = cact.DTYPE_FP32, torch.linspace(-3, 3, s.shape[0]) / 7
    data = f.to_bytes()
    back = cact.parse_cact(data)
    assert back.slot("layer01.d2").dtype == cact.DTYPE_FP32 and back.to_bytes() == data
    assert torch.equal(back.params["stack/layers/block/hadamard_mlp/d2"][1], s.values)
