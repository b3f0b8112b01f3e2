"""reference.cq: packing, the index rule, exact dequantisation, distortion, bits maps."""
import math
import struct
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings, strategies as st

from ladder.engine.rules import CACT_RULES
from ladder.sides.reference_rules import rule_for
from reference import cq


@settings(max_examples=80)
@given(st.sampled_from(cq.WIDTHS), st.integers(1, 4), st.integers(1, 3), st.integers(0, 2 ** 32))
def test_pack_unpack_round_trip_and_bit_positions(bits, rows, groups, seed):
    in_pad = groups * cq.GROUP
    idx = torch.randint(0, cq.num_levels(bits), (rows, in_pad),
                        generator=torch.Generator().manual_seed(seed)).to(torch.uint8)
    packed = cq.pack(idx, bits)
    b = cq.storage_bits(bits)
    assert packed.shape == (rows, in_pad * b // 8)
    assert torch.equal(cq.unpack(packed, bits, in_pad), idx)
    # Spec §e.4: one LSB-first bitstream per row; code k at bits [k*b, (k+1)*b).
    stream = int.from_bytes(packed[0].numpy().tobytes(), "little")
    crumb = {0: 3, 1: 0, 2: 1}                    # ternary level index -> stored crumb
    for k in range(in_pad):
        code = int(idx[0, k])
        want = crumb[code] if bits == cq.TERNARY else code
        assert (stream >> (k * b)) & ((1 << b) - 1) == want


def test_four_bit_low_nibble_is_the_even_column():
    idx = torch.tensor([[1, 2] * 64], dtype=torch.uint8)
    assert int(cq.pack(idx, 4)[0, 0]) == 0x21


def test_levels_are_the_header_constants():
    assert [f"{int(x) & 0xFFFFFFFF:08x}" for x in cq.levels(2).view(torch.int32)] == \
        ["be085e47", "bd237060", "3d23fc09", "3e08a9db"]
    t = cq.levels(cq.TERNARY)
    assert t[1] == 0 and t[0] == -t[2] and float(t[2]) == pytest.approx(1.2240064 / math.sqrt(128))
    for bits in (2, 3, 4):
        assert torch.all(cq.levels(bits)[1:] > cq.levels(bits)[:-1])


def test_ties_take_the_lower_level():
    for bits in cq.WIDTHS:
        cb = cq.levels(bits)
        for k in range(len(cb) - 1):
            lo, hi = cb[k], cb[k + 1]
            mid = (lo + hi) / 2                     # f32; nudge onto an exact f32 tie
            for x in (mid, torch.nextafter(mid, hi), torch.nextafter(mid, lo)):
                d_lo, d_hi = (x - lo).abs(), (x - hi).abs()
                want = k if d_lo <= d_hi else k + 1
                assert int(cq.nearest(x.reshape(1), cb)[0]) == want
        assert int(cq.nearest(torch.tensor([-9.0]), cb)[0]) == 0
        assert int(cq.nearest(torch.tensor([9.0]), cb)[0]) == len(cb) - 1


def _f32_round(q: Fraction) -> float:
    """Round an exact rational to the nearest float32 (ties to even), exactly."""
    f = struct.unpack("<f", struct.pack("<f", float(q)))[0]
    best = None
    for c in (f, math.nextafter(f, math.inf), math.nextafter(f, -math.inf)):
        c = struct.unpack("<f", struct.pack("<f", c))[0]
        err = abs(Fraction(c) - q)
        key = (err, struct.unpack("<I", struct.pack("<f", c))[0] & 1)
        if best is None or key < best[0]:
            best = (key, c)
    return best[1]


@pytest.mark.parametrize("bits", cq.WIDTHS)
def test_dequantize_is_correctly_rounded(bits):
    g = torch.Generator().manual_seed(bits)
    idx = torch.randint(0, cq.num_levels(bits), (3, 128), generator=g).to(torch.uint8)
    norms = (torch.rand(3, 1, generator=g) * 5).half()
    w = cq.dequantize(idx, norms, bits, 128)
    v = cq.prerotation(idx, norms, bits).double().tolist()
    h = Fraction(float(torch.tensor(1 / math.sqrt(128), dtype=torch.float64).float()))
    for r in range(3):
        for j in range(0, 128, 7):
            exact = sum(Fraction(v[r][k]) * (h if bin(j & k).count("1") % 2 == 0 else -h)
                        for k in range(128))
            assert float(w[r, j]) == _f32_round(exact), (r, j)


@pytest.mark.parametrize("bits,expected", [(2, 0.116), (3, 0.034), (4, 0.0093),
                                           (cq.TERNARY, 0.19)])
def test_distortion_on_gaussian_weights_is_the_specs(bits, expected):
    w = torch.randn(256, 1024, generator=torch.Generator().manual_seed(0))
    idx, norms = cq.quantize(w, bits)
    deq = cq.dequantize(idx, norms, bits, 1024).double()
    rel = ((deq - w.double()) ** 2).mean() / (w.double() ** 2).mean()
    rule = rule_for("cq/distortion", CACT_RULES)
    assert rule.check(rel.reshape(1), torch.tensor([expected])), float(rel)


def test_quantize_refuses_bad_matrices():
    with pytest.raises(ValueError, match=r"q: CQ needs a 2-D \[out, in\] matrix, got shape \[4\]"):
        cq.quantize(torch.zeros(4), 2, "q")
    with pytest.raises(ValueError, match=r"non-finite weight inf at \[1, 2\]"):
        cq.quantize(torch.zeros(2, 3).index_put_((torch.tensor(1), torch.tensor(2)),
                                                 torch.tensor(float("inf"))), 2)
    with pytest.raises(ValueError, match="CQ width 6"):
        cq.levels(6)
    zero_idx, zero_norms = cq.quantize(torch.zeros(2, 130), 4)   # zero rows: norm 0, no NaN
    assert torch.equal(cq.dequantize(zero_idx, zero_norms, 4, 130), torch.zeros(2, 130))


def test_round_to_f16_is_a_single_rounding():
    mid = 0.783935546875                     # halfway between two float16 values
    x = torch.tensor([mid - 2 ** -40, mid, mid + 2 ** -40, 65519.0, 65520.0],
                     dtype=torch.float64)
    got = cq.round_to_f16(x).tolist()
    assert got[0] == 0.78369140625 and got[1] == 0.7841796875 and got[2] == 0.7841796875
    assert got[3] == 65504.0 and math.isinf(got[4])


def test_bits_map_semantics():
    table, default = cq.parse_bits_map("embedding=4, mhc=4,attn.q_proj=3,engram0=1.58,default=2")
    assert default == 2 and table == {"embedding": 4, "mhc": 4, "attn.q_proj": 3,
                                      "engram0.": cq.TERNARY}
    pick = lambda n: cq.bits_for(n, table, default)      # noqa: E731
    assert [pick(n) for n in ("embedding", "mhc_phi_res", "layer05.q_proj", "layer05.k_proj",
                              "engram0.tables", "engram0.value_proj", "engram1.tables")] == \
        [4, 4, 3, 2, cq.TERNARY, cq.TERNARY, 2]
    # Flax paths canonicalise to the same names; a layer index selects every layer.
    assert cq.canonical_name("stack/layers/block/self_attn/q_proj/kernel") == "attn.q_proj"
    assert cq.canonical_name("engrams_1/embedding") == "engram1.tables"
    assert cq.bits_for("layer00.q_proj", *cq.parse_bits_map("layer07.q_proj=4,default=2")) == 4
    # Longest prefix wins.
    assert cq.bits_for("attn.q_proj", *cq.parse_bits_map("attn=3,attn.q=4,default=2")) == 4
