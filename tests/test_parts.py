"""V2Model.new: the model is its typed parts (port/parts.py), every shape checked against the
config; a wrong part is refused by name, with the expected and the given shape."""
import dataclasses

import pytest
import torch

from port import PartError, V2Model


@pytest.fixture(scope="module")
def models(tiny_cfg, tiny_params):
    return {w: V2Model.from_params(tiny_params, tiny_cfg, weights=w) for w in ("dense", "cq")}


def _grown(t, axis=-1):
    """t with one more entry along `axis`."""
    pad = torch.zeros(*t.shape[:axis % t.dim()], 1, *t.shape[axis % t.dim() + 1:])
    return torch.cat([t, pad], axis)


def _with(parts, name, value):
    """parts with the part at `name` ("layers[1].q_norm", "mhc.b_res", "final_norm") replaced."""
    embedding, layers, mhc, engrams, final_norm = parts
    layers, engrams = list(layers), list(engrams)
    if name == "final_norm":
        final_norm = value
    elif name.startswith("embedding."):
        embedding = dataclasses.replace(embedding, **{name.split(".")[1]: value})
    elif name.startswith("mhc."):
        mhc = dataclasses.replace(mhc, **{name.split(".")[1]: value})
    else:
        group, field = name.split(".")
        which, idx = group.split("[")
        seq = layers if which == "layers" else engrams
        seq[int(idx[:-1])] = dataclasses.replace(seq[int(idx[:-1])], **{field: value})
    return embedding, layers, mhc, engrams, final_norm


def _get(model, name):
    obj = model
    for piece in name.replace("[", ".").replace("]", "").split("."):
        obj = obj[int(piece)] if piece.isdigit() else getattr(obj, piece)
    return obj


@pytest.mark.parametrize("weights", ["dense", "cq"])
@pytest.mark.parametrize("name, axis", [
    ("embedding.table", -1), ("layers[1].q_norm", -1), ("layers[0].qkvg", 0),
    ("layers[1].out", -1), ("layers[0].d2", -1), ("mhc.router", 1), ("mhc.b_res", -1),
    ("engrams[0].kv", 0), ("engrams[0].taps", 0), ("final_norm", -1)])
def test_new_refuses_a_wrong_shape_naming_the_part(models, tiny_cfg, weights, name, axis):
    model = models[weights]
    given = _grown(_get(model, name), axis)
    with pytest.raises(PartError) as err:
        V2Model.new(tiny_cfg, *_with(model.parts, name, given))
    msg = str(err.value)
    assert msg.startswith(f"{name}: expected shape {list(_get(model, name).shape)}")
    assert msg.endswith(f"given {list(given.shape)}")


def test_new_refuses_a_missing_layer_or_site_and_a_wrong_type(models, tiny_cfg):
    embedding, layers, mhc, engrams, final_norm = models["dense"].parts
    with pytest.raises(PartError, match=rf"^layers: expected {tiny_cfg.num_layers} V2Layer"):
        V2Model.new(tiny_cfg, embedding, layers[:-1], mhc, engrams, final_norm)
    with pytest.raises(PartError, match=r"^engrams: expected \d+ V2Engram"):
        V2Model.new(tiny_cfg, embedding, layers, mhc, engrams + engrams[:1], final_norm)
    with pytest.raises(PartError, match=r"^mhc: expected a V2Mhc, given dict"):
        V2Model.new(tiny_cfg, embedding, layers, {}, engrams, final_norm)


def test_rotated_matrices_need_whole_128_groups(models, tiny_cfg):
    # A dense [d, out] matrix in a model whose products rotate [d_pad, out] inputs.
    dense, cq = models["dense"], models["cq"]
    assert cq.form == "rotated" and cq.layers[0].qkvg.shape[0] > tiny_cfg.d_model
    with pytest.raises(PartError, match=r"^layers\[0\]\.qkvg: expected shape"):
        V2Model.new(tiny_cfg, *_with(cq.parts, "layers[0].qkvg", dense.layers[0].qkvg))


@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_a_model_rebuilt_from_its_parts_steps_bit_for_bit(models, tiny_cfg, weights):
    model = models[weights]
    again = V2Model.new(tiny_cfg, *model.parts, heads=model.heads)
    a, b = model.make_state(), again.make_state()
    for t in (5, 17, 3, 250):
        assert torch.equal(model.step(t, a), again.step(t, b))
