"""Tokenizer blobs that break the reader's assumptions: an empty user-defined piece, byte
fallback declared without byte pieces. Each is the tokenizer's own error, at read time.
"""
import pytest
from reference.tokenizer import Tokenizer, TokenizerFormatError


def _marker_tokenizer() -> Tokenizer:
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "<m>"] + [f"p{i}" for i in range(11)]
    return Tokenizer(pieces, [0.0] * 16, [2, 2, 2, 1, 3] + [0] * 11)


def _empty_piece(blob: bytes, index: int) -> bytes:
    from reference.tokenizer import _HEAD, _REC
    off = _HEAD.size
    for _ in range(index):
        off += _REC.size + _REC.unpack_from(blob, off)[2]
    score, kind, length = _REC.unpack_from(blob, off)
    return blob[:off] + _REC.pack(score, kind, 0) + blob[off + _REC.size + length:]


def test_empty_user_defined_piece_is_refused_at_read():
    blob = _marker_tokenizer().to_blob()
    with pytest.raises(TokenizerFormatError, match="piece 4: len=0") as e:
        Tokenizer.from_blob(_empty_piece(blob, 4))      # encode() would never return
    assert e.value.field == "piece[4].len"
    assert e.value.offset == 24 + 4 * 7 + len("<pad></s><s><unk>") + 5   # header, 4 records
    with pytest.raises(ValueError, match="must be a non-empty string"):
        Tokenizer(["<pad>", "</s>", "<s>", "<unk>", ""], [0.0] * 5, [2, 2, 2, 1, 3])


# ---------------------------------------------------------------- 8. the tokenizer API
def _no_byte_pieces(byte_fallback=True):
    from reference.tokenizer import Tokenizer
    pieces = ["<pad>", "</s>", "<s>", "<unk>", "\u2581a", "a", "b"]
    return Tokenizer(pieces, [0.0] * 7, [2, 2, 2, 1, 0, 0, 0], byte_fallback=byte_fallback)


def test_byte_fallback_without_byte_pieces_is_the_tokenizer_error():
    from reference.tokenizer import Tokenizer, TokenizerFormatError
    tok = _no_byte_pieces()
    assert tok.encode("ab") == [4, 6]
    with pytest.raises(TokenizerFormatError, match=r"byte_fallback: byte 0x7A of 'z' has no "
                                                   r"<0x7A> piece") as e:
        tok.encode("az")
    assert e.value.field == "byte_fallback"
    # at load: a blob that claims byte fallback without the 256 BYTE pieces is refused
    with pytest.raises(TokenizerFormatError, match=r"byte_fallback=1 but 256 of the 256 <0xHH> "
                                                   r"BYTE pieces are missing") as e:
        Tokenizer.from_blob(tok.to_blob())
    assert (e.value.field, e.value.offset) == ("byte_fallback", 21)
    assert Tokenizer.from_blob(_no_byte_pieces(False).to_blob()).encode("az") == [4, 3]
