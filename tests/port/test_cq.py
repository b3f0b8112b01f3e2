"""port.cq.CqWeight against the reference's CQ codec (reference/cq.py, exact dequantisation).

Measured at the shipped shapes (512x512, 256x512, 8192x512; 2 and 4 bits; tools/bench/bench_cq.py)
against the exactly dequantised matrix times x in float64, as a fraction of max|y|: dense
<= 3.7e-7, packed <= 2.2e-7; over every width and seeds, dense <= 5.3e-7, packed <= 2.8e-7.
The bound, 1.5e-6, is ladder.rules CACT_RULES["cq/matvec"].
"""
from tests import paths
import os

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ladder.engine.rules import CACT_RULES
from ladder.sides.reference_rules import rule_for
from port.cq import CqError, CqWeight, fwht
from reference import cact, cq

FIXTURES = paths.FIXTURES
MATVEC, ROW, FWHT = (rule_for(n, CACT_RULES) for n in ("cq/matvec", "cq/row", "cq/fwht"))


def _random_weight(out, in_dim, bits, seed):
    g = torch.Generator().manual_seed(seed)
    in_pad = cq.padded(in_dim)
    idx = torch.randint(0, cq.num_levels(bits), (out, in_pad), generator=g).to(torch.uint8)
    norms = (torch.rand(out, in_pad // cq.GROUP, generator=g) * 2 + 0.05).half()
    return cq.pack(idx, bits), norms, idx


@pytest.fixture(scope="module", params=[(512, 512), (256, 512), (8192, 512)],
                ids=lambda s: f"{s[0]}x{s[1]}")
def shipped_shape(request):
    return request.param


@pytest.mark.parametrize("bits", [2, 4])
def test_both_forms_match_exact_matvec_at_shipped_shapes(shipped_shape, bits):
    out, in_dim = shipped_shape
    packed, norms, idx = _random_weight(out, in_dim, bits, seed=out + bits)
    exact = cq.dequantize(idx, norms, bits, in_dim).double()
    x = torch.randn(3, in_dim, generator=torch.Generator().manual_seed(bits))
    want = x.double() @ exact.T
    for form in ("dense", "packed"):
        w = CqWeight(packed, norms, bits, in_dim, form)
        xp = w.prepare_input(x)
        y = w.matmat_prepared(xp)
        assert MATVEC.check(y, want), (form, MATVEC.error(y, want))
        for b in range(3):
            y1 = w.matvec_prepared(xp[b])
            assert MATVEC.check(y1, want[b]), (form, b)
        band = torch.full((2, 64), float("nan"))
        w.matmat_rows_prepared(xp[:2], out - 64, band)
        assert MATVEC.check(band, want[:2, out - 64:]), form
        rows = torch.full((16,), float("nan"))
        w.matvec_rows_prepared(xp[0], 16, rows)
        assert MATVEC.check(rows, want[0, 16:32]), form


@pytest.mark.parametrize("bits", cq.WIDTHS)
def test_every_width_and_padding(bits):
    packed, norms, idx = _random_weight(37, 200, bits, seed=bits)      # in_pad 256
    exact = cq.dequantize(idx, norms, bits, 200)
    dense, packd = (CqWeight(packed, norms, bits, 200, f) for f in ("dense", "packed"))
    # The port's own unpacking reproduces the reference's pre-rotation rows bit for bit.
    assert torch.equal(dense.rows, cq.prerotation(idx, norms, bits))
    x = torch.randn(200, generator=torch.Generator().manual_seed(5))
    want = exact.double() @ x.double()
    for w in (dense, packd):
        assert MATVEC.check(w.matvec(x), want), (w.form, MATVEC.error(w.matvec(x), want))
    for r in (0, 17, 36):
        row = dense.dequantize_row(r)
        assert torch.equal(row, packd.dequantize_row(r))
        assert ROW.check(row, exact[r]), ROW.error(row, exact[r])


def test_weights_read_from_an_upstream_file():
    f = cact.read_cact(os.path.join(FIXTURES, "cact_mixed.cact"))
    x_by_width = {}
    for slot in f.slots:
        if slot.dtype != cact.DTYPE_CQ:
            continue
        form = "packed" if slot.index % 2 else "dense"
        w = CqWeight.from_slot(slot, form)
        x = x_by_width.setdefault(slot.shape[1], torch.randn(slot.shape[1]))
        want = slot.dequantize().double() @ x.double()
        assert MATVEC.check(w.matvec(x), want), slot.name
        extra = 4 * w.out_features * w.in_pad if form == "dense" else 0
        assert w.nbytes == slot.nbytes + extra, slot.name


def test_resident_bytes_of_each_form():
    packed, norms, _ = _random_weight(512, 512, 2, seed=0)
    dense, packd = (CqWeight(packed, norms, 2, 512, f) for f in ("dense", "packed"))
    file_bytes = sum(cq.blob_size(512, 512, 2))                          # 65536 + 2048
    assert packd.nbytes == file_bytes
    assert dense.nbytes == file_bytes + 4 * 512 * 512


def test_fwht_is_the_normalised_walsh_matrix():
    H = torch.ones(1, 1, dtype=torch.float64)
    while H.shape[0] < 128:
        H = torch.cat([torch.cat([H, H], 1), torch.cat([H, -H], 1)], 0)
    H /= 128 ** 0.5
    x = torch.randn(5, 384, generator=torch.Generator().manual_seed(0))
    want = (x.double().reshape(5, 3, 128) @ H).reshape(5, 384)
    got = fwht(x)
    assert got.dtype == torch.float32 and FWHT.check(got, want), FWHT.error(got, want)
    assert FWHT.check(fwht(fwht(x)), x.double())                      # H is its own inverse


@settings(max_examples=60)
@given(st.sampled_from(cq.WIDTHS), st.integers(1, 5), st.integers(1, 3), st.integers(0, 2 ** 32))
def test_port_unpacking_equals_reference_codec(bits, rows, groups, seed):
    in_pad = groups * cq.GROUP
    idx = torch.randint(0, cq.num_levels(bits), (rows, in_pad),
                        generator=torch.Generator().manual_seed(seed)).to(torch.uint8)
    norms = torch.ones(rows, groups, dtype=torch.float16)
    w = CqWeight(cq.pack(idx, bits), norms, bits, in_pad - 5, "dense")
    assert torch.equal(w.rows, cq.levels(bits)[idx.long()])


def test_bad_inputs_are_refused_by_name():
    packed, norms, _ = _random_weight(8, 128, 4, seed=0)
    with pytest.raises(CqError, match="form='sparse'"):
        CqWeight(packed, norms, 4, 128, "sparse")
    with pytest.raises(CqError, match="bits=6"):
        CqWeight(packed, norms, 6, 128)
    with pytest.raises(CqError, match="packed rows of 64 bytes do not hold 256 4-bit codes"):
        CqWeight(packed, norms, 4, 200)
    with pytest.raises(CqError, match=r"norms must be float16 \[8, 1\]"):
        CqWeight(packed, norms.float(), 4, 128)
    w = CqWeight(packed, norms, 4, 128)
    with pytest.raises(CqError, match="input has 100 features, this weight takes 128"):
        w.prepare_input(torch.zeros(100))
    with pytest.raises(CqError, match=r"prepared input must be float32 \[128\]"):
        w.matvec_prepared(torch.zeros(128, dtype=torch.float64))
    with pytest.raises(CqError, match=r"rows 4..11 are outside 0..7"):
        w.matvec_rows_prepared(torch.zeros(128), 4, torch.zeros(8))
    with pytest.raises(CqError, match=r"rows 8..8 are outside"):
        w.dequantize_row(8)
    bad = cq.pack(torch.zeros(1, 128, dtype=torch.uint8), 2)
    bad[0, 3] = 0b10_000000                       # crumb 2: no ternary level
    with pytest.raises(CqError, match="row 0, column 15: ternary crumb 2"):
        CqWeight(bad, torch.ones(1, 1, dtype=torch.float16), cq.TERNARY, 128, "packed")
