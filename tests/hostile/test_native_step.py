"""The native C step checks its own inputs (kernels/native): nat_rows and nat_layer refuse
bad positions, tokens and layers; needle_trace refuses an image that does not tile.
"""
import json
import os
import pytest
import torch
import ctypes


@pytest.mark.parametrize("edit, match", [
    (lambda h, body: (h, body + b"\0" * 8), "8 bytes follow the last tensor"),
    (lambda h, body: ({**h, **{k: {**v, "data_offsets": [-4, v["data_offsets"][1]]}
                              for k, v in list(h.items())[:1] if k != "__metadata__"}}, body),
     "a non-negative integer was expected"),
])
def test_needle_trace_refuses_an_image_that_does_not_tile(tmp_path, edit, match):
    import subprocess
    from tests.hostile import readers as hr
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


# ---------------------------------------------------------------- the C step's own checks
native = pytest.importorskip("kernels.native")


@pytest.fixture(scope="module")
def c_step(tiny_cfg, tiny_params):
    if not native.available():
        pytest.skip(native.unavailable_reason())
    from port.model import V2Model
    model = V2Model.from_params(tiny_params, tiny_cfg, backend="native")
    state = model.make_state()
    model.step(3, state)
    nm = model._native
    b = nm.buffers(state)
    b.grow(2)
    return model, nm, b, state


def _snapshot(state, out):
    return [t.clone() for t in (state.k, state.v, state.vraw, state.lanes, state.hidden, out)]


def _rows(nm, b, m, pos0, toks, out):
    for r, t in enumerate(toks):
        b.tok[r] = t
    return nm.lib.nat_rows(ctypes.byref(nm.m), ctypes.byref(b.s), m, pos0, b.tok, b.flat,
                           b.ok, b.tap_ok, b.valid, native.ptr(b.scratch), None, 1,
                           native.ptr(out))


def test_nat_rows_refuses_bad_positions_and_tokens_itself(c_step, tiny_cfg):
    model, nm, b, state = c_step
    V, S = tiny_cfg.vocab_size, tiny_cfg.max_seq_len
    assert (nm.m.vocab, nm.m.max_seq) == (V, S)
    out = torch.zeros(V)
    before = _snapshot(state, out)
    for m, pos0, toks in ((0, 1, [3]), (1, -1, [3]), (1, S, [3]), (2, S - 1, [3, 3]),
                          (1, 1, [-1]), (1, 1, [V]), (2, 1, [3, V]), (2, 1, [-5, 3])):
        assert _rows(nm, b, m, pos0, toks, out) == -1, (m, pos0, toks)
        now = _snapshot(state, out)
        assert all(torch.equal(x, y) for x, y in zip(before, now)), (m, pos0, toks)
    # the edges themselves run: the last position, the largest token id
    assert _rows(nm, b, 1, S - 1, [V - 1], out) == 0
    assert torch.isfinite(out).all() and out.abs().sum() > 0
    assert _rows(nm, b, 2, S - 2, [0, V - 1], out) == 0


def test_nat_layer_refuses_bad_layers_and_positions_itself(c_step, tiny_cfg):
    model, nm, b, state = c_step
    L, S = tiny_cfg.num_layers, tiny_cfg.max_seq_len
    X = torch.ones(tiny_cfg.mhc_lanes, tiny_cfg.d_model)

    def run(i, pos):
        return nm.lib.nat_layer(ctypes.byref(nm.m), ctypes.byref(b.s), i, pos, native.ptr(X),
                                None, None, b.flat, b.ok, b.tap_ok, 1, native.ptr(b.scratch),
                                None)
    before = _snapshot(state, X)
    for i, pos in ((-1, 0), (L, 0), (0, -1), (0, S), (L, S)):
        assert run(i, pos) == -1, (i, pos)
        assert all(torch.equal(x, y) for x, y in zip(before, _snapshot(state, X))), (i, pos)
    assert run(L - 1, S - 1) == 0 and not torch.equal(X, torch.ones_like(X))
    assert run(0, 0) == 0
