"""bounded.safetensors.write_safetensors: the trace archive's writer. Its files must read back
bit for bit through safetensors' own reader and through the bounded reader, for every dtype an
archive holds, including the shapes that need care (0-d, empty, transposed, 16-bit)."""
import json
import os
import struct

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from bounded.safetensors import load_safetensors, write_safetensors


def _tensors():
    g = torch.Generator().manual_seed(3)
    return {
        "f32": torch.randn(3, 4, generator=g),
        "f64_scalar": torch.tensor(3.5, dtype=torch.float64),
        "bf16": torch.randn(7, generator=g).to(torch.bfloat16),
        "f16": torch.randn(2, 5, generator=g).half(),
        "i64": torch.arange(-3, 5),
        "i32": torch.arange(4, dtype=torch.int32),
        "u8": torch.arange(250, 256, dtype=torch.uint8),
        "bool_scalar": torch.tensor(True),
        "bool": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 5),
        "transposed": torch.randn(2, 3, generator=g).t(),
        "nan_inf": torch.tensor([float("nan"), float("inf"), -0.0]),
    }


def _same(a, b):
    """Bit for bit: dtype, shape and the raw bytes (NaN payloads and -0.0 included)."""
    b = b.contiguous()
    return (a.dtype == b.dtype and a.shape == b.shape
            and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)))


def test_every_dtype_reads_back_bit_for_bit_through_both_readers(tmp_path):
    ts = _tensors()
    path = tmp_path / "x.safetensors"
    write_safetensors(path, ts, {"note": "kept"})
    theirs, (ours, meta) = load_file(path), load_safetensors(path)
    for name, t in ts.items():
        assert _same(theirs[name], t), name
        assert _same(ours[name], t), name
    assert meta == {"note": "kept"}
    with safe_open(path, "pt") as f:
        assert f.metadata() == {"note": "kept"}
        assert sorted(f.keys()) == sorted(ts)


def test_the_header_is_padded_to_8_and_the_data_tiles_the_file(tmp_path):
    path = tmp_path / "x.safetensors"
    write_safetensors(path, _tensors())
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    spans = sorted(v["data_offsets"] for k, v in header.items() if k != "__metadata__")
    assert spans[0][0] == 0 and spans[-1][1] == len(raw) - 8 - n
    assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert "__metadata__" not in header                  # none given, none written


def test_an_unsupported_dtype_is_refused_naming_the_tensor(tmp_path):
    path = tmp_path / "x.safetensors"
    with pytest.raises(TypeError, match="'c'.*complex"):
        write_safetensors(path, {"ok": torch.zeros(2), "c": torch.zeros(2, dtype=torch.cfloat)})
    assert not os.path.exists(path)                      # refused before the file is opened
