"""Malformed .cact files raise CactFormatError naming slot, field and byte offset - nothing else.

The base file is upstream's mixed-width fixture (2/3/4-bit and ternary CQ, both probe heads,
a tokenizer), so every kind of record is in play.
"""
from tests import paths
import os
import struct

import pytest
import torch
from hypothesis import given, settings, strategies as st

from reference import cact
from reference.cact import CactFormatError, parse_cact

with open(os.path.join(paths.FIXTURES, "cact_mixed.cact"), "rb") as _f:
    GOOD = _f.read()
BASE = parse_cact(GOOD)
DIR = cact.DIRECTORY_AT
REC = 44


def _put(data, offset, fmt, value):
    out = bytearray(data)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def _slot(name):
    return BASE.slot(name)


def _rec(name, field_offset):
    return DIR + REC * _slot(name).index + field_offset


def _raises(data, *parts):
    with pytest.raises(CactFormatError) as e:
        parse_cact(data)
    for p in parts:
        assert p in str(e.value), (p, str(e.value))
    return str(e.value)


def test_base_file_is_valid():
    assert BASE.to_bytes() == GOOD and {s.bits for s in BASE.slots} >= {2, 3, 4, 5}


def test_header_errors_name_field_and_offset():
    _raises(GOOD[:10], "header field codebook_len at byte 8 is truncated", "10 bytes")
    _raises(_put(GOOD, 0, "<I", 0x12345678), "field tag=305419896 at byte 0")
    _raises(_put(GOOD, 8, "<I", 27), "codebook_len=27 at byte 8")
    _raises(_put(GOOD, 120 + 4 * 5, "<f", 0.5), "codebook[5] at byte 140")
    _raises(_put(GOOD, 4, "<I", 0xFFFFFFFF), "num_tensors=4294967295 at byte 4",
            "past the end")
    _raises(_put(GOOD, 4, "<I", len(BASE.slots) - 2), "num_tensors=81 at byte 4",
            "does not fit the canon")
    # One slot fewer reads as "no tokenizer": the directory no longer ends where blobs begin.
    _raises(_put(GOOD, 4, "<I", len(BASE.slots) - 1), "slot 0 (embedding) field offset=")
    _raises(_put(GOOD, 24, "<I", 200), "field hada_n=64 at byte 48 must be 256")
    _raises(_put(GOOD, 48, "<I", 128), "hada_n=128 at byte 48 must be 64")
    _raises(_put(GOOD, 16, "<I", 5), "kv_bits=5 at byte 16")
    _raises(_put(GOOD, 88, "<I", 7), "engram_orders[2]=7 at byte 88 must be 0")
    _raises(_put(GOOD, 100, "<I", 9), "not a valid needle v2 config", "engram_layers[0]=9")
    _raises(_put(GOOD, 116, "<f", float("nan")), "rope_theta=nan at byte 116")
    # A header claiming 2**31 layers is refused on the slot count, before any list is built.
    _raises(_put(GOOD, 36, "<I", 2 ** 31), "num_tensors=83 at byte 4", "num_layers=2147483648")


def test_directory_errors_name_slot_field_and_offset():
    q = _slot("layer02.q_proj")
    _raises(_put(GOOD, _rec("layer02.q_proj", 4), "<I", 49),
            f"slot {q.index} (layer02.q_proj) field shape[0]=49 at byte {_rec('layer02.q_proj', 4)}"
            f" must be 48")
    _raises(_put(GOOD, _rec("layer02.q_proj", 0), "<B", 1), "field dtype=1", "must be 3")
    _raises(_put(GOOD, _rec("layer02.q_proj", 40), "<I", 7), "field bits=7", "must be one of")
    _raises(_put(GOOD, _rec("layer02.q_proj", 36), "<I", 64), "field group=64")
    _raises(_put(GOOD, _rec("final_norm", 28), "<Q", 1 << 40), "(final_norm) field nbytes=")
    _raises(_put(GOOD, _rec("final_norm", 20), "<Q", len(GOOD) + 64), "(final_norm) field offset=")
    _raises(_put(GOOD, _rec("final_norm", 2), "<H", 1), "(final_norm) field pad=1")
    _raises(_put(GOOD, _rec("embedding", 1), "<B", 3), "(embedding) field ndim=3")


def test_blob_errors_name_slot_and_offset():
    last = BASE.slots[-1]
    _raises(GOOD[:-1], f"slot {last.index} (tokenizer) field nbytes", "runs past the end")
    _raises(GOOD + b"\0", "1 bytes follow the last blob", f"at byte {len(GOOD)}")
    gapped = next(b for a, b in zip(BASE.slots, BASE.slots[1:]) if b.offset > a.offset + a.nbytes)
    _raises(_put(GOOD, gapped.offset - 1, "<B", 1), f"slot {gapped.index} ({gapped.name}): "
            f"alignment padding byte at {gapped.offset - 1} is 0x01")
    s = _slot("layer00.norm_in")
    _raises(_put(GOOD, s.offset + 6, "<e", float("inf")),
            f"(layer00.norm_in) field values[3]=inf is not finite at byte {s.offset + 6}")
    e = _slot("embedding")
    n_packed = e.packed.numel()
    _raises(_put(GOOD, e.offset + n_packed + 2, "<e", -0.5),
            "(embedding) field norms[1, 0]=-0.5", f"at byte {e.offset + n_packed + 2}")
    t = next(s for s in BASE.slots if s.bits == cact.TERNARY)
    _raises(_put(GOOD, t.offset + 3, "<B", 0b10_00_00_00), f"({t.name}) field codes[0, 15] holds "
            f"crumb 2", f"at byte {t.offset + 3}")
    b = _slot("contrastive_head.bias")
    _raises(_put(GOOD, b.offset, "<e", 1.0), "contrastive_head.bias) field values[0]=1.0 must be 0")
    m = _slot("heads.manifest")
    _raises(_put(GOOD, m.offset, "<e", 3.0), "(heads.manifest) values [3.0, 2.0]")


def test_tokenizer_errors_name_slot_and_file_offset():
    t = _slot("tokenizer")
    _raises(_put(GOOD, t.offset, "<I", 10 ** 8), f"slot {t.index} (tokenizer) field n_pieces at "
            f"byte {t.offset}", "cannot fit")
    _raises(_put(GOOD, t.offset, "<I", 511), "(tokenizer) field", "bytes follow the last piece")
    first_text = t.offset + 24 + 7                       # piece 0's text: b"<pad>"
    _raises(_put(GOOD, first_text, "<B", 0xFF), f"field piece[0].text at byte {first_text}",
            "not UTF-8")
    _raises(_put(GOOD, t.offset + 24 + 4, "<B", 9), "field piece[0].type at byte", "0..4")


@settings(max_examples=60)
@given(st.integers(0, len(GOOD) - 1))
def test_every_truncation_is_refused(n):
    _raises(GOOD[:n], "byte")


@settings(max_examples=150)
@given(st.lists(st.tuples(st.integers(0, len(GOOD) - 1), st.integers(1, 255)), min_size=1,
                max_size=4))
def test_byte_flips_raise_format_error_or_read_back_valid_data(flips):
    data = bytearray(GOOD)
    for pos, mask in flips:
        data[pos] ^= mask
    data = bytes(data)
    try:
        f = parse_cact(data)
    except CactFormatError as e:
        assert "byte" in str(e)
        return
    assert f.to_bytes() == data                      # what was read is what is there
    assert all(torch.isfinite(v).all() for v in f.params.values())
    assert f.tokenizer is None or f.tokenizer.vocab_size == f.config.vocab_size


@settings(max_examples=40)
@given(st.binary(max_size=400))
def test_arbitrary_bytes_are_refused(blob):
    with pytest.raises(CactFormatError):
        parse_cact(blob)
    with pytest.raises(CactFormatError):
        parse_cact(GOOD[:240] + blob)
