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


def test_new_refuses_a_part_that_is_not_float32(models, tiny_cfg):
    half = models["dense"].layers[2].pre_norm.half()
    with pytest.raises(PartError, match=r"^layers\[2\]\.pre_norm: expected float32, given "
                                        r"torch.float16"):
        V2Model.new(tiny_cfg, *_with(models["dense"].parts, "layers[2].pre_norm", half))


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


@pytest.fixture(scope="module")
def packed_parts(tiny_cfg, tiny_params):
    """A packed model's parts (codes as stored), built as from_cactfile builds them for the C
    step, without binding them to the C library."""
    from port.cq import CqWeight
    from port.parts import pack_parts, parts_from_weights
    from port.weights import prepare_weights
    from reference import cact
    f = cact.build_cact(tiny_params, tiny_cfg)
    cqw = {s.name: CqWeight.from_slot(s, "packed") for s in f.slots if s.dtype == cact.DTYPE_CQ}
    w = prepare_weights(f.params, tiny_cfg, None, "cpu")
    return pack_parts(parts_from_weights(w, tiny_cfg), cqw, tiny_cfg)


def test_packed_codes_of_the_wrong_shape_are_named(tiny_cfg, packed_parts):
    embedding, layers, mhc, engrams, final_norm = packed_parts
    codes = dict(layers[1].codes, q_proj=layers[1].codes["k_proj"])      # [kv, d] for [attn, d]
    wrong = list(layers)
    wrong[1] = dataclasses.replace(layers[1], codes=codes)
    with pytest.raises(PartError, match=rf"^layers\[1\]\.codes\[q_proj\]: expected codes "
                                        rf"\[{tiny_cfg.attn_dim_eff}, {tiny_cfg.d_model}\], "
                                        rf"given \[{tiny_cfg.kv_dim}, {tiny_cfg.d_model}\]"):
        V2Model.new(tiny_cfg, embedding, wrong, mhc, engrams, final_norm, backend="native")
    with pytest.raises(PartError, match=r"^embedding\.codes: expected codes"):
        V2Model.new(tiny_cfg, dataclasses.replace(embedding, codes=mhc.codes["pre"]), layers,
                    mhc, engrams, final_norm, backend="native")


def test_packed_codes_run_on_the_native_backend_only(tiny_cfg, packed_parts):
    with pytest.raises(PartError, match="backend='native' only"):
        V2Model.new(tiny_cfg, *packed_parts, backend="torch")
