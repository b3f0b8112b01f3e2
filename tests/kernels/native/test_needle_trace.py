"""The C step as a standalone program (kernels/native/needle_trace.c): no Python in its process,
it writes a trace archive that `ladder compare` judges, and a planted C fault is located from
that file alone."""
import json
import struct
import subprocess

import pytest
import torch

from kernels import native
from ladder.cli.main import main
from ladder.engine.trace import Ladder

pytestmark = pytest.mark.skipif(not native.available(), reason="no C compiler here")


@pytest.fixture(scope="module")
def exe_dump(tmp_path_factory):
    path = tmp_path_factory.mktemp("exe") / "exe.safetensors"
    assert main(["dump", "native-exe", "--out", str(path)]) == 0
    return path


def test_the_program_writes_what_the_library_computes_bit_for_bit(exe_dump, tmp_path):
    lib_dump = tmp_path / "lib.safetensors"
    assert main(["dump", "native", "--out", str(lib_dump)]) == 0
    a, b = Ladder.load(exe_dump), Ladder.load(lib_dump)
    assert a.keys() == b.keys() and a.steps == b.steps
    assert all(torch.equal(a[k], b[k]) for k in a.keys())
    assert a.meta["argmax"] == b.meta["argmax"] and a.meta["producer"]["name"] == "needle_trace"


def test_the_programs_dump_compares_clean(exe_dump, capsys):
    assert main(["compare", str(exe_dump), "reference"]) == 0
    assert "0 failing (PASS)" in capsys.readouterr().out


def test_a_planted_c_fault_is_located_from_the_dump_alone(tmp_path, capsys):
    path = tmp_path / "fault.safetensors"
    assert main(["dump", "native-exe", "--plant", "rope_pos_plus_1", "--out", str(path)]) == 0
    capsys.readouterr()
    assert main(["compare", str(path), "reference", "--locate"]) == 1
    text = capsys.readouterr().out
    assert "first divergence: prefill/L03.q" in text
    assert "the layer's own error" in text and "reference's L03 does not reproduce" in text
    # locate and report take the dump too
    assert main(["locate", "--dump", str(path)]) == 1
    assert "first divergence: prefill/L03.q" in capsys.readouterr().out
    assert main(["report", "--dump", str(path), "--out", str(tmp_path / "r"), "--stem", "x",
                 "--plot", "svg"]) == 1
    md = (tmp_path / "r" / "x.md").read_text()
    assert "L03.q" in md and "own error" in md


def _image(tmp_path):
    """A real image, as dump native-exe writes it, and the program built clean."""
    import argparse
    from ladder.cli.compare import native_exe_image
    from reference.config import V2Config
    from reference.params import init_params
    cfg = V2Config.preset("tiny")
    args = argparse.Namespace(weights=None, cact=None, params=None, plant=None)
    path = tmp_path / "image.safetensors"
    exe = native_exe_image(args, init_params(cfg, 0, perturbed=True), cfg, [5, 6, 7], 2,
                           cfg.kv_window, path)
    return path.read_bytes(), exe


def _reframe(raw: bytes, edit) -> bytes:
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    edit(header)
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


@pytest.mark.parametrize("edit,needle", [
    # renamed, not dropped: its bytes stay, so the data still tiles (a gap is refused first)
    (lambda h: h.__setitem__("emb_renamed", h.pop("emb")), "no tensor emb"),
    (lambda h: h["qn"].update(dtype="I64"), "tensor qn has the wrong dtype"),
    (lambda h: h["s/L"].update(data_offsets=[0, 10 ** 12]), "past the file"),
    (lambda h: h["d1"].update(shape=[3]), "shape and data_offsets disagree"),
])
def test_the_program_refuses_a_hostile_image_naming_the_tensor(tmp_path, edit, needle):
    raw, exe = _image(tmp_path)
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(_reframe(raw, edit))
    res = subprocess.run([exe, str(bad), str(tmp_path / "out.st")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 2 and needle in res.stderr, res.stderr
    assert not (tmp_path / "out.st").exists()


def test_the_program_refuses_a_truncated_file(tmp_path):
    raw, exe = _image(tmp_path)
    for cut in (4, 20):
        bad = tmp_path / "cut.safetensors"
        bad.write_bytes(raw[:cut])
        res = subprocess.run([exe, str(bad), str(tmp_path / "o.st")], capture_output=True,
                             text=True, timeout=60)
        assert res.returncode == 2 and "needle_trace:" in res.stderr
