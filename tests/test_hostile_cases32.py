"""Issue 32: the last hostile inputs. Each ends in the project's own error, exit status 2, one
line on stderr, nothing written; the oversized V4.1 geometry that used to take 69 s is cheap."""
import json
import os

import pytest
import torch

from ladder.cli.main import main as ladder_main
from ladder.v41.sides import DEFAULT_STEM as V41_STEM


def _v41_stem(tmp_path, **model_args):
    m = json.load(open(V41_STEM + ".json"))
    m["model_args"].update(model_args)
    (tmp_path / "v41.json").write_text(json.dumps(m))
    os.symlink(V41_STEM + ".safetensors", tmp_path / "v41.safetensors")
    return str(tmp_path / "v41")


def _refused(argv, capsys, tmp_path, match):
    before = sorted(os.listdir(tmp_path))
    assert ladder_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert match in err, err
    assert sorted(os.listdir(tmp_path)) == before            # nothing written
    return err


@pytest.mark.parametrize("field, value, match", [
    ("compress_ratios", [0, 0, 10 ** 9, 2, 1, 1, 1, 1],
     "compress_ratios[2]=1000000000 outside 0..max_seq_len=64"),
    ("original_seq_len", 0, "original_seq_len=0 outside 1..2147483647"),
    ("beta_slow", 10 ** 9, "beta_slow=1000000000, beta_fast=32: need 0 < beta_slow <= "
                           "beta_fast <= original_seq_len=32"),
])
def test_v41_fields_out_of_range_are_config_errors(tmp_path, capsys, field, value, match):
    stem = _v41_stem(tmp_path, **{field: value})
    _refused(["run", "--model", "attn_v41", "--fixture", stem], capsys, tmp_path, match)


def test_the_v41_budget_counts_the_compressors_state():
    from ladder.v41.sides import implied_bytes
    from reference.v41.config import V41Args
    m = json.load(open(V41_STEM + ".json"))
    a = V41Args.from_any(m["model_args"])
    terms = implied_bytes(a, m["calls"])
    ratios = [a.compress_ratios[i] for i in a.kv_sources if a.compress_ratios[i] > 1]
    assert ratios and terms["compressor states"][0] == \
        3 * sum(ratios) * (a.head_dim + a.index_head_dim) * 4 * 2


def test_the_sparse_attention_twin_widens_only_the_rows_it_gathers():
    """A 1M-position V4.1 geometry ran 69 s because the twin widened the whole compressed cache
    to float32 for every block of every query; widening the gathered rows gives the same bits."""
    from kernels.v41.sparse_attn import sparse_attn_v41_torch
    g = torch.Generator().manual_seed(3)
    T, H, D, na = 3, 2, 16, 4096
    q = torch.randn(T, H, D, generator=g).bfloat16()
    rows = torch.randn(na, D, generator=g).bfloat16()
    idx = torch.randint(-1, na, (T, 20), generator=g)
    sink = torch.randn(H, generator=g)
    widened = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.float and args[0].shape[0] == na:
                widened.append(tuple(args[0].shape))
            return super().__torch_function__(func, types, args, kwargs or {})

    got = sparse_attn_v41_torch(q, rows.as_subclass(Watched), None, idx, 0.25, sink)
    assert widened == []                                   # no pass over all `na` rows
    # the same bits as widening first (bf16 -> f32 is exact)
    r = rows.float()
    want = sparse_attn_v41_torch(q, r.bfloat16(), None, idx, 0.25, sink)
    assert torch.equal(torch.Tensor(got), want)


@pytest.mark.parametrize("pad", [-5, -2147483647])
def test_a_negative_pad_token_id_is_refused(tmp_path, capsys, pad, tiny_cfg, tiny_params):
    from reference.config import ConfigError, V2Config
    from reference.params import save_params
    with pytest.raises(ConfigError, match=f"pad_token_id={pad} outside 0..vocab_size-1"):
        V2Config(**{**tiny_cfg.__dict__, "pad_token_id": pad})
    cfg = json.loads(tiny_cfg.to_json())
    cfg["pad_token_id"] = pad
    path = tmp_path / "p.safetensors"
    save_params(path, tiny_params, None, metadata={"needle_config": json.dumps(cfg)})
    _refused(["run", "--params", str(path)], capsys, tmp_path,
             f"pad_token_id={pad} outside 0..vocab_size-1")


def test_a_look_alike_bits_map_key_is_refused(tmp_path, capsys):
    monkey = "\uff45mbedding=4,default=2"                  # fullwidth 'e'
    _refused(["run", "--weights", "cq", "--bits-map", monkey], capsys, tmp_path,
             "key '\uff45mbedding' holds '\uff45' (U+FF45) at character 0")


@pytest.mark.parametrize("argv", [["run", "--plant", ""], ["locate", "--plant", " "],
                                  ["dump", "torch", "--out", "x.safetensors", "--plant", ""],
                                  ["run", "--port", ""], ["run", "--dump", ""]])
def test_an_empty_plant_port_or_dump_is_refused(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)
    flag = next(a for a in argv if a in ("--plant", "--port", "--dump"))
    _refused(argv, capsys, tmp_path, f"{flag} '{argv[argv.index(flag) + 1]}': empty")
