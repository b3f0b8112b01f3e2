"""Input checks that nothing else in the suite reaches: each bad input below must be refused
with the project's own error naming the value and its limit (and would otherwise be read
silently: a hashed n-gram of an out-of-range id, a tokenizer of another vocabulary, a fixture
tensor of the wrong dtype or positions)."""
from tests import paths
import dataclasses
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from ladder.sides import fixtures
from reference import cact
from reference.cact import CactFormatError, parse_cact
from reference.decode import DecodeInputError, forward_cached, init_kv_cache
from reference.tokenizer import NORMAL, Tokenizer
from tests.captures import FIXTURE



@pytest.mark.parametrize("bad", ["vocab", "negative"])
def test_hist_token_ids_are_bounded(tiny_cfg, tiny_params, bad):
    V = tiny_cfg.vocab_size
    tokens = torch.tensor([[5, 17, 42]])
    hist = torch.tensor([[5, 17, 42, V if bad == "vocab" else -1]])
    kc, vc = init_kv_cache(tiny_cfg, 1, 8)
    with pytest.raises(DecodeInputError, match=f"hist holds ids outside 0..{V - 1}"):
        forward_cached(tiny_params, tiny_cfg, tokens, kc, vc, 0, hist=hist,
                       hist_valid=torch.ones(1, 4, dtype=torch.bool))
    hist[0, 3] = V - 1                                   # the largest valid id is fine
    forward_cached(tiny_params, tiny_cfg, tokens, kc, vc, 0, hist=hist,
                   hist_valid=torch.ones(1, 4, dtype=torch.bool))


@pytest.mark.parametrize("change", [-1, +1])
def test_a_tokenizer_of_another_vocabulary_is_refused(change):
    """A well-formed tokenizer blob whose piece count differs from the header's vocab."""
    with open(os.path.join(paths.FIXTURES, "cact_mixed.cact"), "rb") as f:
        good = parse_cact(f.read())
    tok = good.tokenizer
    assert tok is not None and tok.vocab_size == good.config.vocab_size
    if change < 0:
        other = Tokenizer(tok.pieces[:-1], tok.scores[:-1], tok.types[:-1])
    else:
        other = Tokenizer(tok.pieces + ["zz-extra"], tok.scores + [0.0], tok.types + [NORMAL])
    slot = good.slot("tokenizer")
    slots = [dataclasses.replace(s, raw=other.to_blob()) if s.index == slot.index else s
             for s in good.slots]
    data = dataclasses.replace(good, slots=slots).to_bytes()
    with pytest.raises(CactFormatError, match=f"field n_pieces={tok.vocab_size + change} at "
                                              f"byte .* differs from header vocab="
                                              f"{good.config.vocab_size}"):
        parse_cact(data)


def _fixture_with(tmp_path, key, edit):
    """A copy of the committed fixture with tensor `ladder/{key}` edited and its sha256 in
    the manifest updated, so only the dtype/shape check can refuse it."""
    tensors = load_file(FIXTURE + ".safetensors")
    with open(FIXTURE + ".json") as f:
        manifest = json.load(f)
    name = f"ladder/{key}"
    tensors[name] = edit(tensors[name]).contiguous()
    manifest["sha256"][name] = fixtures.tensor_sha256(tensors[name])
    stem = str(tmp_path / "fx")
    fixtures.write(stem, tensors, manifest)
    return stem


@pytest.mark.parametrize("key,edit,what", [
    ("prefill/L00.x", lambda t: t.double(), "torch.float64"),
    ("prefill/L00.x", lambda t: t[:1], "[1, "),                  # too few positions
    ("decode00/embed", lambda t: t[0], "torch.float32 [48]"),     # leading axis dropped
    ("decode00/logits", lambda t: t.repeat(2, 1), "[2, 256]"),   # one position too many
])
def test_fixture_tensors_need_float32_and_their_steps_positions(tmp_path, key, edit, what):
    fixtures.load(_fixture_with(tmp_path, key, lambda t: t))     # the copy itself loads
    stem = _fixture_with(tmp_path, key, edit)
    with pytest.raises(fixtures.FixtureError) as e:
        fixtures.load(stem)
    msg = str(e.value)
    assert f"tensor 'ladder/{key}' is " in msg and what in msg, msg
    assert "needs float32 with a leading axis of its step's positions" in msg
