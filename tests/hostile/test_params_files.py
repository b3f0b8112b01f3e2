"""Parameter files whose values cannot be the model's: non-finite, integer or bool tensors.
They are refused, never cast.
"""
import pytest
import torch
from safetensors.torch import save_file
from reference.config import V2Config
from reference.params import ParamsError, init_params, load_params


def _params_file(tmp_path, change) -> str:
    cfg = V2Config.preset("tiny")
    params = init_params(cfg, 0, perturbed=True)
    change(params)
    path = str(tmp_path / "p.safetensors")
    save_file(params, path, metadata={"needle_config": cfg.to_json()})
    return path


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_params_are_refused(tmp_path, value):
    def poke(p):
        p["stack/final_norm/scale"][5] = value
    with pytest.raises(ParamsError, match=rf"'stack/final_norm/scale' value \[5\].* = "
                                          rf"{value} is not finite"):
        load_params(_params_file(tmp_path, poke))


@pytest.mark.parametrize("cast, name", [(lambda t: t > 0, "BOOL"),
                                        (lambda t: t.round().to(torch.int32), "I32"),
                                        (lambda t: t.round().to(torch.uint8), "U8")])
def test_integer_and_bool_params_are_refused_not_cast(tmp_path, cast, name):
    def convert(p):
        p["embedding/embedding"] = cast(p["embedding/embedding"])
    with pytest.raises(ParamsError, match=f"'embedding/embedding' has dtype {name}"):
        load_params(_params_file(tmp_path, convert))
