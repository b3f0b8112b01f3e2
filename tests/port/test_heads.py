"""Probe heads on the port take what upstream's take: a batch [B, T] and `window=`."""
import pytest
import torch

from ladder.engine.rules import PORT_RULES
from ladder.sides.reference_rules import rule_for
from port import V2Model
from reference import heads


@pytest.fixture(scope="module", params=["torch", "native"])
def model(request, tiny_cfg, tiny_params):
    return V2Model.from_params(tiny_params, tiny_cfg, backend=request.param)


def _batch(cfg):
    t = torch.randint(1, cfg.vocab_size, (2, 24), generator=torch.Generator().manual_seed(11))
    t[1, -3:] = cfg.pad_token_id
    return t


@pytest.mark.parametrize("window", [0, 10])
def test_batched_heads_match_the_reference(tiny_cfg, tiny_params, model, window):
    t = _batch(tiny_cfg)
    rc = heads.encode_contrastive(tiny_params, tiny_cfg, t, window=window, dtype="float32")
    rf = heads.forward_confidence(tiny_params, tiny_cfg, t, window=window, dtype="float32")
    pc = model.encode_contrastive(t, window=window)
    pf = model.confidence(t, window=window)
    assert pc.shape == rc.shape and pf.shape == rf.shape
    rule = rule_for("port/heads", PORT_RULES)
    assert rule.check(pc, rc) and rule.check(pf, rf)
    # one sequence alone gives that row's bits: the batch is a loop, not a mixed product
    assert torch.equal(model.encode_contrastive(t[1].tolist(), window=window), pc[1])


def test_window_changes_the_pooled_cells(tiny_cfg, model):
    t = _batch(tiny_cfg)[0]
    assert not torch.equal(model.confidence(t, window=10), model.confidence(t))


# 9: the tiny model's Engram reaches 9 positions back (3 taps x dilation 3), so a window of
# 9 would cut it in upstream's heads but not here: refused rather than silently different.
@pytest.mark.parametrize("window", [-1, 9, 65, 2.5, True])
def test_bad_window_is_refused(tiny_cfg, model, window):
    with pytest.raises(ValueError, match="window="):
        model.confidence(_batch(tiny_cfg), window=window)
