"""reference.tokenizer: the RAW blob, upstream's reference encoding, and SentencePiece parity.

The blob is the one upstream's exporter embedded in tests/fixtures/cact_w2.cact for the small
BPE model tests/fixtures/cact_tok.model (identity normalisation, byte fallback, chat markers
at 4..13; trained by tools/fixtures/gen_cact_fixture.py). Expected ids come from upstream's RefTokenizer.
"""
from tests import paths
import json
import os
import struct

import pytest
from hypothesis import example, given, settings, strategies as st

from reference.cact import read_cact
from reference.tokenizer import (BOS_ID, BYTE, CHAT_MARKERS, CONTROL, NORMAL, UNKNOWN,
                                 USER_DEFINED, Tokenizer, TokenizerFormatError)

FIXTURES = paths.FIXTURES
with open(os.path.join(FIXTURES, "cact_upstream.json")) as _f:
    UP = json.load(_f)["tokenizer"]
BLOB = read_cact(os.path.join(FIXTURES, "cact_w2.cact")).slot("tokenizer").raw
TOK = Tokenizer.from_blob(BLOB)
ALPHABET = (list("abcdefghij thequickbrownfoxATZ0123456789  \n\t.,:{}[]\"'<>|/_-")
            + ["é", "ü", "日", "本", "\U0001F600", "ß", "\u2581"]
            + list(CHAT_MARKERS) + ["<s>", "</s>", "<unk>", "<pad>", "<0x41>", "<|im_"])
texts = st.lists(st.sampled_from(ALPHABET), max_size=40).map("".join)


def test_piece_table_is_upstreams():
    assert TOK.pieces == UP["pieces"] and TOK.types == UP["types"]
    assert [f"{x:08x}" for x in struct.unpack(f"<{len(TOK.scores)}I",
                                              struct.pack(f"<{len(TOK.scores)}f", *TOK.scores))] \
        == UP["scores_hex"]
    assert (TOK.pad_id, TOK.eos_id, TOK.bos_id, TOK.unk_id) == \
        (UP["pad_id"], UP["eos_id"], UP["bos_id"], UP["unk_id"]) == (0, 1, 2, 3)
    assert (TOK.add_dummy_prefix, TOK.byte_fallback) == \
        (UP["add_dummy_prefix"], UP["byte_fallback"]) == (True, True)
    assert [TOK.pieces[i] for i in range(4, 14)] == list(CHAT_MARKERS)
    assert all(TOK.types[i] == USER_DEFINED for i in range(4, 14))
    assert sum(t == BYTE for t in TOK.types) == 256 and TOK.types[BOS_ID] == CONTROL
    assert TOK.to_blob() == BLOB


@pytest.mark.parametrize("case", UP["cases"], ids=lambda c: repr(c["text"])[:24])
def test_encode_decode_match_upstream_reftokenizer(case):
    assert TOK.encode(case["text"]) == case["ids"]
    assert TOK.decode(case["ids"]) == case["decoded"]


def test_sentencepiece_blob_is_what_upstream_exports():
    spm = pytest.importorskip("sentencepiece")
    sp = spm.SentencePieceProcessor(model_file=os.path.join(FIXTURES, "cact_tok.model"))
    assert Tokenizer.from_sentencepiece(sp).to_blob() == BLOB


@settings(max_examples=300)
@given(texts)
def test_encode_decode_equal_sentencepiece(text):
    spm = pytest.importorskip("sentencepiece")
    sp = _sp(spm)
    ids = TOK.encode(text)
    assert ids == sp.encode(text)
    assert TOK.decode(ids) == sp.decode(ids)
    if "\u2581" not in text:                        # U+2581 itself decodes as a space
        assert TOK.decode(ids) == text


_SP = []


def _sp(spm):
    if not _SP:
        _SP.append(spm.SentencePieceProcessor(model_file=os.path.join(FIXTURES, "cact_tok.model")))
    return _SP[0]


def _naive_merge(tok, seg):
    """The merge rule as stated: take the highest-scoring adjacent pair (leftmost on ties)."""
    syms = list(seg)
    while True:
        best = None
        for j in range(len(syms) - 1):
            pid = tok.piece_id.get(syms[j] + syms[j + 1])
            if pid is not None and (best is None or tok.scores[pid] > tok.scores[best[1]]):
                best = (j, pid)
        if best is None:
            return syms
        syms[best[0]:best[0] + 2] = [syms[best[0]] + syms[best[0] + 1]]


@settings(max_examples=200)
@given(st.lists(st.text("abc", min_size=2, max_size=4), min_size=1, max_size=12, unique=True),
       st.lists(st.sampled_from([-3.0, -2.0, -1.0]), min_size=12, max_size=12),
       st.text("abc", max_size=24))
@example(["aa"], [-1.0] * 12, "aaa")                     # equal pairs overlap: leftmost wins
@example(["ab", "bc"], [-1.0] * 12, "abc")               # equal scores, different pairs
def test_heap_merge_equals_the_stated_rule_with_ties(extra, scores, text):
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "a", "b", "c"] + extra
    types = [CONTROL, CONTROL, CONTROL, 1] + [NORMAL] * (len(pieces) - 4)
    sc = [0.0] * 7 + scores[:len(extra)]             # few distinct scores: many ties
    tok = Tokenizer(pieces, sc, types, add_dummy_prefix=False, byte_fallback=False)
    assert [tok.pieces[i] for i in tok.encode(text)] == _naive_merge(tok, text)


def test_byte_fallback_and_unknown():
    ids = TOK.encode("\U0001F600")                 # not a piece: its four UTF-8 bytes
    assert [TOK.pieces[i] for i in ids][-4:] == ["<0xF0>", "<0x9F>", "<0x98>", "<0x80>"]
    assert TOK.decode(ids) == "\U0001F600"
    nofb = Tokenizer(TOK.pieces, TOK.scores, TOK.types, byte_fallback=False)
    assert nofb.encode("\U0001F600")[-1] == nofb.unk_id
    assert TOK.decode([BOS_ID, TOK.unk_id] + TOK.encode("hi")) == "hi"   # control/unk skipped


def test_chat_prompt_is_the_finetuning_template():
    text = Tokenizer.render_prompt("Weather in Paris?", [{"name": "get_weather"}])
    assert text == ('<|im_start|>user\n<tools>[{"name":"get_weather"}]</tools>\n'
                    'Weather in Paris?<|im_end|>\n<|im_start|>assistant\n')
    assert Tokenizer.render_prompt("q", "[]", system="be brief").startswith(
        "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n")
    ids = TOK.chat_prompt("Weather in Paris?", [{"name": "get_weather"}])
    assert ids[0] == BOS_ID and ids[1:] == TOK.encode(text) and 4 in ids and 5 in ids


def test_bad_inputs_are_refused_by_name():
    with pytest.raises(ValueError, match=r"token id 512 is outside 0..511"):
        TOK.decode([1, 512])
    with pytest.raises(ValueError, match=r"token id -1"):
        TOK.decode([-1])
    with pytest.raises(TypeError, match="encode takes str, got bytes"):
        TOK.encode(b"x")
    with pytest.raises(ValueError, match="piece 'a' at id 5 repeats id 4"):
        Tokenizer(["<pad>", "</s>", "<s>", "<unk>", "a", "a"], [0.0] * 6, [2, 2, 2, 1, 0, 0])
    with pytest.raises(ValueError, match=r"BYTE piece '<0xZZ>' at id 4"):
        Tokenizer(["<pad>", "</s>", "<s>", "<unk>", "<0xZZ>"], [0.0] * 5, [2, 2, 2, 1, 4])
    with pytest.raises(ValueError, match="unk_id=9 is outside 0..4"):
        Tokenizer(["<pad>", "</s>", "<s>", "<unk>", "a"], [0.0] * 5, [2, 2, 2, 1, 0], unk_id=9)


def test_malformed_blobs_name_field_and_offset():
    cases = [
        (BLOB[:10], "header", 10),
        (struct.pack("<I", 10 ** 6) + BLOB[4:], "n_pieces", 0),
        (BLOB[:20] + b"\x02" + BLOB[21:], "add_dummy_prefix", 20),
        (BLOB[:24 + 4] + b"\x07" + BLOB[29:], "piece[0].type", 28),
        (BLOB[:24] + struct.pack("<f", float("nan")) + BLOB[28:], "piece[0].score", 24),
        (BLOB[:24 + 5] + struct.pack("<H", 60000) + BLOB[31:], "piece[0].len", 29),
        (BLOB + b"\0", "trailing", len(BLOB)),
        (BLOB[:-1], "piece[511]", None),
    ]
    for blob, field, offset in cases:
        with pytest.raises(TokenizerFormatError) as e:
            Tokenizer.from_blob(blob)
        assert e.value.field.startswith(field), (field, e.value.field, str(e.value))
        assert offset is None or e.value.offset == offset, (field, e.value.offset)


@settings(max_examples=50)
@given(st.lists(st.tuples(st.text(min_size=1, max_size=6),
                          st.floats(-1e6, 1e6, width=32, allow_subnormal=False),
                          st.sampled_from([NORMAL, USER_DEFINED])), min_size=1, max_size=20))
def test_blob_round_trip(rows):
    pieces = ["<pad>", "</s>", "<s>", "<unk>"] + [p for p, _, _ in rows]
    if len(set(pieces)) != len(pieces):
        return
    tok = Tokenizer(pieces, [0.0] * 4 + [s for _, s, _ in rows],   # no BYTE pieces: no
                    [CONTROL] * 3 + [UNKNOWN] + [t for *_, t in rows],  # fallback (a blob
                    byte_fallback=False)                     # claiming one is refused at read)
    back = Tokenizer.from_blob(tok.to_blob())
    assert (back.pieces, back.scores, back.types) == (tok.pieces, tok.scores, tok.types)
    assert back.to_blob() == tok.to_blob()
