"""Every tensor a model holds lives on the model's device (issue 12: weights="cq" on CUDA failed
on its first step with a CPU-resident Engram key|value matrix). Checked without a GPU on the
"meta" device: its tensors carry a device and shapes but no data, so any CPU tensor left in the
weights, or mixed into a step, shows up here as it would on CUDA."""
import pytest
import torch

from port.model import V2Model


def tensors(v, path=""):
    if isinstance(v, torch.Tensor):
        yield path, v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield from tensors(x, f"{path}/{k}")
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            yield from tensors(x, f"{path}[{i}]")


@pytest.fixture(scope="module")
def meta_models(tiny_cfg, tiny_params):
    return {w: V2Model.from_params(tiny_params, tiny_cfg, weights=w, device="meta")
            for w in ("dense", "cq")}


@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_every_weight_lives_on_the_model_device(meta_models, weights):
    model = meta_models[weights]
    held = list(model.tensors())
    assert len(held) > 20
    elsewhere = [(p, str(t.device)) for p, t in held if t.device.type != "meta"]
    assert elsewhere == []


@pytest.mark.parametrize("decode", ["eager", "graph"])
@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_steps_mix_no_devices(meta_models, tiny_cfg, weights, decode):
    # torch backend only: the Triton launch wrappers need data (meta has none).
    model = V2Model.new(tiny_cfg, *meta_models[weights].parts, device="meta", decode=decode)
    state = model.make_state()
    for t in (3, 5):                   # a prefill, then one decode step
        out = model.step(t, state)
    assert out.device.type == "meta" and state.pos == 2
    assert all(t.device.type == "meta" for _, t in tensors(state.__dict__))


@pytest.mark.parametrize("weights", ["dense", "cq"])
def test_the_fused_body_mixes_no_devices(meta_models, tiny_cfg, weights):
    # The triton backend's fused body on its torch twins (the Triton wrappers need data):
    # every operand it lays out at load, packed codes included, and every step tensor on
    # the model's device.
    from port.fused import FusedBody
    model = V2Model.new(tiny_cfg, *meta_models[weights].parts, device="meta", backend="triton")
    model.fused = FusedBody(model, "twin")
    w = model.fused.w
    ops = [t for p in w.router + w.qkvg + w.out + w.engram_kv + [w.head]
           for t in ([p.w] if p.w is not None else []) + [x for b in p.blocks
                                                           for x in b.operands()[:3]]]
    assert ops and all(t.device.type == "meta" for t in ops)
    assert (w.form == "packed") == (weights == "cq")
    state = model.make_state()
    # position 0 is a prefill (rows, whose Triton attention needs data): the torch backend's
    V2Model.new(tiny_cfg, *meta_models[weights].parts, device="meta").step(3, state)
    for t in (5, 7):                   # two fused decode steps
        out = model.step(t, state)
    assert out.device.type == "meta" and state.pos == 3
    assert all(t.device.type == "meta" for _, t in tensors(state.__dict__))
