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

    sparse_attn_v41_torch(q, rows.as_subclass(Watched), None, idx, 0.25, sink)
    assert widened == []                                   # no pass over all `na` rows
    # the bits are held by the twin's own tests against float64 and the V4.1 fixture
    # (tests/test_kernels_sparse_attn_v41.py, tests/test_attn_v41_official.py)


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


# ---- found by the fuzzing of the new readers (tests/hostile_readers.py) ----

def _doctored_archive(tmp_path, edit):
    """A trace archive of ours with `edit(manifest)` applied in its metadata."""
    import struct
    from ladder.engine.archive import META_KEY
    src = tmp_path / "a.safetensors"
    assert ladder_main(["dump", "torch", "--out", str(src), "--prompt-len", "2", "--steps",
                        "1"]) == 0
    data = src.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    m = json.loads(header["__metadata__"][META_KEY])
    edit(m)
    header["__metadata__"][META_KEY] = json.dumps(m)
    h = json.dumps(header).encode()
    out = tmp_path / "bad.safetensors"
    out.write_bytes(struct.pack("<Q", len(h)) + h + data[8 + n:])
    src.unlink()
    return str(out)


@pytest.mark.parametrize("edit, match", [
    (lambda m: m["points"].__setitem__(0, ["L00.u"]), "point name \"['L00.u']\" must be a string"),
    (lambda m: m["producer"].update(backend=1e308), "field producer.backend must be a string"),
    (lambda m: m["geometry"].update(vocab_size=[0] * 5000), "geometry field vocab_size is [0, 0,"),
    (lambda m: m["geometry"].update(engram_layers=7), "geometry field engram_layers is 7"),
])
def test_an_archive_manifest_of_the_wrong_types_is_refused(tmp_path, capsys, edit, match):
    path = _doctored_archive(tmp_path, edit)
    capsys.readouterr()
    err = _refused(["compare", path], capsys, tmp_path, match)
    assert len(err) < 400, err                         # a 5,000-entry list is not printed


def test_a_needle_rs_blob_with_a_zero_dimension_is_refused(tmp_path, capsys):
    stem = tmp_path / "nrs"
    assert ladder_main(["regen", "--format", "needle-rs", "--out", str(stem), "--prompt-len",
                        "2", "--steps", "1"]) == 0
    m = json.loads((tmp_path / "nrs.json").read_text())
    key = next(iter(m["blob_index"]))
    m["blob_index"][key]["shape"] = [1, 0]
    (tmp_path / "nrs.json").write_text(json.dumps(m))
    capsys.readouterr()
    _refused(["compare", str(stem)], capsys, tmp_path, "shape[1]=0 must be an integer in 1..")


@pytest.mark.parametrize("edit, match", [
    (lambda h, body: (h, body + b"\0" * 8), "8 bytes follow the last tensor"),
    (lambda h, body: ({**h, **{k: {**v, "data_offsets": [-4, v["data_offsets"][1]]}
                              for k, v in list(h.items())[:1] if k != "__metadata__"}}, body),
     "a non-negative integer was expected"),
])
def test_needle_trace_refuses_an_image_that_does_not_tile(tmp_path, edit, match):
    import subprocess
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import hostile_readers as hr
    image = str(tmp_path / "image.safetensors")
    exe = hr._image(image)
    data = open(image, "rb").read()
    header, body = hr.st_parts(data)
    header = {k: v for k, v in header.items()}
    if "__metadata__" in header:
        header = {"__metadata__": header.pop("__metadata__"), **header}
    h, b = edit(header, body)
    with open(image, "wb") as f:
        f.write(hr.st_join(json.dumps(h), b))
    res = subprocess.run([exe, image, str(tmp_path / "out.safetensors")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and match in res.stderr, \
        res.stderr
    assert not os.path.exists(tmp_path / "out.safetensors")


PORTS = {
    "raises": ("def build(params, cfg):\n    raise ZeroDivisionError('boom')\n",
               ":build: its factory raised ZeroDivisionError: boom"),
    "not a port": ("def build(params, cfg):\n    return 7\n",
                   "the object its factory returned lacks make_state()"),
    "sleeps": ("import time\ndef build(params, cfg):\n    time.sleep(30)\n",
               "its factory did not return within 1 s (--port-timeout)"),
    "step sleeps": ("import time\nclass P:\n    def make_state(self):\n        return 0\n"
                    "    def step_traced(self, *a):\n        time.sleep(30)\n"
                    "def build(params, cfg):\n    return P()\n",
                    "step_traced at prefill (token"),
}


@pytest.mark.parametrize("kind", sorted(PORTS))
def test_a_misbehaving_port_is_one_line_naming_the_call(tmp_path, capsys, monkeypatch, kind):
    src, match = PORTS[kind]
    mod = "bad_port_" + kind.replace(" ", "_")          # its own name: imports are cached
    (tmp_path / f"{mod}.py").write_text(src)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    import time
    t0 = time.monotonic()
    _refused(["run", "--port", f"{mod}:build", "--port-timeout", "1", "--steps", "1",
              "--no-check-plain"], capsys, tmp_path, match)
    assert time.monotonic() - t0 < 20                 # the 30 s sleep was cut at 1 s


def test_port_timeout_needs_a_port_and_a_positive_bound(tmp_path, capsys):
    _refused(["run", "--port-timeout", "5"], capsys, tmp_path, "--port-timeout 5: bounds an "
             "in-process --port's calls")
    _refused(["run", "--port", "x:y", "--port-timeout", "0"], capsys, tmp_path,
             "--port-timeout 0.0: seconds in (0, 86400]")
