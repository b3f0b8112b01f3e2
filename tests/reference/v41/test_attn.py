"""reference/v41/attn.py against DeepSeek's own V4.1 attention (the committed fixture made by
tools/fixtures/gen_v41_attn_fixture.py from the official model.py), layer by layer from the official
inputs: index tensors exact, float tensors within the bf16 rule of ladder/engine/rules.py."""
import pytest
import torch

from ladder.engine.rules import V41_RULES
from ladder.sides.reference_rules import rule_for
from ladder.v41.sides import INDEX_POINTS, compare
from reference.v41.attn import AttnStackV41

OFFICIAL_SHA256 = "4e9ae23620edc8028ccc5d5fef552ab7fdc7dcd6f79608754fe9f67644056f65"


def test_fixture_provenance(v41_fx):
    man, rec, _ = v41_fx
    off = man["official"]
    assert off["sha256"] == OFFICIAL_SHA256
    assert off["revision"] == "dba1be0a40aa45a94ad051997016db3960a90277"
    assert off["used"] == "official" or off["used_file_sha256"] != OFFICIAL_SHA256
    # spec §8 coverage: prefills of 1, 3, 8, 13; decode past wraps of the 8-slot ring
    assert [s["prefill"] for s in man["scenarios"]] == [1, 3, 8, 13]
    assert max(c["start_pos"] for c in man["calls"]) >= 3 * man["model_args"]["window_size"]


def test_every_class_is_exercised(v41_fx):
    man, rec, _ = v41_fx
    seen = {p for calls in rec.values() for layer in calls.values() for p in layer}
    assert {"latent", "index_q", "compressed_rows"} <= seen
    # index selections that grew past index_topk, and partly filled rings with -1 first
    topk = man["model_args"]["index_topk"]
    widths = {int(rec[c["key"]][3]["topk_idxs"].shape[1]) for c in man["calls"]}
    assert max(widths) == man["model_args"]["window_size"] + topk
    c3 = next(c for c in man["calls"] if c["scenario"] == "p1" and c["start_pos"] == 3)
    assert rec[c3["key"]][0]["window_idxs"].tolist() == [[-1, -1, -1, -1, 0, 1, 2, 3]]


def test_reference_matches_official_layer_by_layer(v41_fx, v41_ref_run):
    man, rec, _ = v41_fx
    cmp = compare(v41_ref_run, rec, "v41_official", man["calls"])
    assert cmp.passed, f"{len(cmp.failures)} failing points, first {cmp.first}"
    points = {r.point.split(".", 1)[1] for r in cmp.rows}
    assert set(INDEX_POINTS) <= points and {"out", "o", "latent", "index_q"} <= points
    # index points are judged by the exact rule, the rest by the bf16 bound
    assert all(r.rule.exact == (r.point.split(".", 1)[1] in INDEX_POINTS) for r in cmp.rows)
    # every (call, layer) of the fixture was compared
    assert len({(r.step, r.layer) for r in cmp.rows}) == len(man["calls"]) * \
        man["model_args"]["n_layers"]


def test_rule_is_the_issue_bound():
    rule = rule_for("v41_official/L3.out", V41_RULES)
    b = torch.tensor([1.0, -2.0])
    allow = 2 * 2 ** -8 * 2.0 + 1e-6
    assert rule.check(b + torch.tensor([allow * 0.99, 0.0]), b)
    assert not rule.check(b + torch.tensor([allow * 1.01, 0.0]), b)


def test_comparison_can_fail(v41_fx, v41_ref_run):
    """A 5% change of one output element fails its rule; an index off by one fails exactly."""
    man, rec, _ = v41_fx
    key = man["calls"][-1]["key"]
    bent = {key: {layer: dict(p) for layer, p in v41_ref_run[key].items()}}
    out = bent[key][7]["out"].clone()
    i = out.abs().argmax()
    out.view(-1)[i] = out.view(-1)[i] * 1.05
    bent[key][7]["out"] = out
    sel = bent[key][3]["topk_idxs"].clone()
    sel[0, -1] = sel[0, -1] - 1
    bent[key][3]["topk_idxs"] = sel
    call = [c for c in man["calls"] if c["key"] == key]
    bad = {(r.layer, r.point) for r in compare(bent, {key: rec[key]}, "v41_official",
                                                call).failures}
    assert bad == {(7, "L07.out"), (3, "L03.topk_idxs")}


def test_args_need_every_field_the_attention_reads(v41_fx):
    """Fields the attention reads are required (none is filled from a default); the official
    ModelArgs' other fields (vocab_size, moe_*, hc_*, dtype, ...) are ignored."""
    from types import SimpleNamespace

    from reference.v41.config import V41Args, V41ConfigError
    man, _, w = v41_fx
    full = man["model_args"]
    assert "vocab_size" in full and V41Args.from_any(full).max_seq_len == full["max_seq_len"]
    assert V41Args.from_any(SimpleNamespace(**full)) == V41Args.from_any(full)
    for name in ("max_seq_len", "window_size", "compress_ratios", "norm_eps"):
        short = {k: v for k, v in full.items() if k != name}
        for given in (short, SimpleNamespace(**short)):
            with pytest.raises(V41ConfigError, match=f"args lack the field '{name}'"):
                V41Args.from_any(given)
        with pytest.raises(ValueError, match=f"'{name}'"):
            AttnStackV41(short, w)
    with pytest.raises(V41ConfigError, match=r"compress_ratios=7 must be a sequence"):
        V41Args.from_any(dict(full, compress_ratios=7))


def test_device_flip_bound_is_rule_data():
    """tests/port/v41/test_cuda.py's tolerated share of flipped selections lives in
    ladder/engine/rules.py with its reason; 2% of the fixture's 384 (call, layer) steps is 7."""
    from ladder.engine.rules import V41_DEVICE_FLIPS, CountBound, RulesError
    assert "near-tie" in V41_DEVICE_FLIPS.why
    assert V41_DEVICE_FLIPS.allows(7, 384) and not V41_DEVICE_FLIPS.allows(8, 384)
    with pytest.raises(RulesError, match="fraction=1.5 must be <= 1"):
        CountBound(1.5)
