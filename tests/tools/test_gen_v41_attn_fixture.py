"""tools/fixtures/gen_v41_attn_fixture.py without the official code: it refuses any file but the
official one, and its kernel stand-ins (written independently of the reference) agree with the
reference's quantisers bit for bit and with its sparse attention."""
from tests import paths
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(paths.TOOLS, "fixtures"))
import gen_v41_attn_fixture as gen  # noqa: E402
import v41_kernel_standins as standins  # noqa: E402

from reference.v41 import quant as Q  # noqa: E402
from reference.v41.attn import sparse_attn_sink  # noqa: E402


def test_refuses_other_sources(tmp_path):
    (tmp_path / "inference").mkdir()
    (tmp_path / "inference" / "model.py").write_text("print('not DeepSeek')\n")
    with pytest.raises(gen.FixtureSourceError, match="is not the official 4e9ae236"):
        gen.official_source(str(tmp_path), False)
    with pytest.raises(gen.FixtureSourceError, match="imports restored"):
        gen.official_source(str(tmp_path), True)
    assert gen.main(["--ref", str(tmp_path / "missing"), "--out", str(tmp_path / "x")]) == 2


def test_standins_agree_with_the_reference():
    g = torch.Generator().manual_seed(3)
    for scale in (1e-5, 0.3, 40.0):
        x = (torch.randn(6, 64, generator=g) * scale).bfloat16()
        for block, fn, kw in ((32, Q.fp8_roundtrip, None), (32, Q.fp4_roundtrip_e8m0, "e8m0"),
                              (16, Q.fp4_roundtrip_e4m3, "e4m3")):
            y = x.clone()
            if kw is None:
                standins.act_quant(y, block, "ue8m0", None, True)
            else:
                standins.fp4_act_quant(y, block, True, torch.float8_e4m3fn if kw == "e4m3"
                                       else torch.float8_e8m0fnu)
            assert torch.equal(y, fn(x, block))
    q = torch.randn(1, 3, 4, 32, generator=g).bfloat16()
    kv = torch.randn(1, 20, 32, generator=g).bfloat16()
    idx = torch.randint(-1, 20, (1, 3, 70), generator=g).int()        # two tiles of 64
    idx[0, 2] = -1                                                    # nothing selected: zeros
    sink = torch.randn(4, generator=g)
    got = standins.sparse_attn(q, kv, sink, idx, 0.2)
    assert torch.equal(got, sparse_attn_sink(q[0], kv[0], sink, idx[0], 0.2)[None])
    assert torch.equal(got[0, 2], torch.zeros_like(got[0, 2]))


def test_outputs_are_byte_reproducible(tmp_path):
    """The manifest holds nothing time- or run-dependent, and the tool's writer, given the
    committed fixture's own content, reproduces both committed files byte for byte (so a
    regeneration with equal tensors is byte-identical; `--check` does the same comparison
    against a fresh run of the official code)."""
    import json

    from safetensors.torch import load_file

    from ladder.v41.sides import DEFAULT_STEM
    with open(DEFAULT_STEM + ".json") as f:
        manifest = json.load(f)
    assert not {k for k in manifest if "second" in k or "time" in k or "date" in k}, manifest
    stem = str(tmp_path / "rewritten")
    tensors = load_file(DEFAULT_STEM + ".safetensors")
    gen.write_outputs(stem, tensors, manifest)
    assert gen.differing_outputs(stem, DEFAULT_STEM) == []
    manifest["seed"] += 1                                  # the comparison can fail
    gen.write_outputs(stem, tensors, manifest)
    assert gen.differing_outputs(stem, DEFAULT_STEM) == [DEFAULT_STEM + ".json"]
    assert gen.differing_outputs(str(tmp_path / "absent"), DEFAULT_STEM) == \
        [DEFAULT_STEM + ".json", DEFAULT_STEM + ".safetensors"]
    assert gen.main(["--ref", str(tmp_path / "missing"), "--check"]) == 2
