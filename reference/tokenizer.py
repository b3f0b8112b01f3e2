"""The tokenizer a .cact file carries: its RAW blob, and the encoding upstream specifies (§e.5).

Semantics follow upstream's reference tokenizer (`export.RefTokenizer`), which equals
SentencePiece BPE for a model trained with identity normalisation and no whitespace collapsing:
spaces become U+2581 and one U+2581 is prepended; the user-defined chat markers are cut out
first (longest marker wins at each position); every other stretch is merged pairwise, always
taking the adjacent pair whose concatenation is the highest-scoring piece (leftmost on ties);
symbols left outside the vocabulary fall back to their UTF-8 bytes (`<0xHH>` pieces).
"""
from __future__ import annotations

import heapq
import json
import struct

PAD_ID, EOS_ID, BOS_ID, UNK_ID = 0, 1, 2, 3
CHAT_MARKERS = ("<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tools>", "</tools>",
                "<tool_call>", "</tool_call>", "<tool_result>", "</tool_result>")
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = range(5)
TYPE_NAMES = ("NORMAL", "UNKNOWN", "CONTROL", "USER_DEFINED", "BYTE")
SPACE = "\u2581"

_HEAD = struct.Struct("<IIIIIBBH")      # n_pieces, pad, eos, bos, unk, dummy prefix, fallback, 0
_REC = struct.Struct("<fBH")            # score, type, byte length of the piece


class TokenizerFormatError(ValueError):
    """A malformed tokenizer blob; `offset` is the byte offset inside the blob, `field` the
    field being read (the .cact reader re-raises it with the slot and file offset)."""

    def __init__(self, message: str, field: str, offset: int):
        super().__init__(message)
        self.field, self.offset = field, offset


class Tokenizer:
    def __init__(self, pieces, scores, types, pad_id=PAD_ID, eos_id=EOS_ID, bos_id=BOS_ID,
                 unk_id=UNK_ID, add_dummy_prefix=True, byte_fallback=True):
        self.pieces, self.scores, self.types = list(pieces), list(scores), list(types)
        self.pad_id, self.eos_id, self.bos_id, self.unk_id = pad_id, eos_id, bos_id, unk_id
        self.add_dummy_prefix, self.byte_fallback = bool(add_dummy_prefix), bool(byte_fallback)
        n = len(self.pieces)
        if not (len(self.scores) == len(self.types) == n):
            raise ValueError(f"pieces/scores/types lengths differ: {n}, {len(self.scores)}, "
                             f"{len(self.types)}")
        for name in ("pad_id", "eos_id", "bos_id", "unk_id"):
            if not 0 <= getattr(self, name) < n:
                raise ValueError(f"{name}={getattr(self, name)} is outside 0..{n - 1}")
        self.piece_id = {}
        for i, p in enumerate(self.pieces):
            if not isinstance(p, str) or not p:
                raise ValueError(f"piece {p!r} at id {i} must be a non-empty string (an empty "
                                 f"piece matches at every position)")
            if p in self.piece_id:
                raise ValueError(f"piece {p!r} at id {i} repeats id {self.piece_id[p]}")
            self.piece_id[p] = i
        self.byte_id = {}
        for i, (p, t) in enumerate(zip(self.pieces, self.types)):
            if t == BYTE:
                if len(p) != 6 or not (p.startswith("<0x") and p.endswith(">")) \
                        or any(c not in "0123456789abcdefABCDEF" for c in p[3:5]):
                    raise ValueError(f"BYTE piece {p!r} at id {i} is not of the form <0xHH>")
                self.byte_id[int(p[3:5], 16)] = i
        # Longest first; equal lengths keep id order (what a stable sort gives upstream).
        self.markers = sorted((p for p, t in zip(self.pieces, self.types) if t == USER_DEFINED),
                              key=len, reverse=True)

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    # ---- the RAW blob ----
    @classmethod
    def from_blob(cls, blob: bytes) -> "Tokenizer":
        blob = bytes(blob)
        if len(blob) < _HEAD.size:
            raise TokenizerFormatError(f"tokenizer blob is {len(blob)} bytes, shorter than its "
                                       f"{_HEAD.size}-byte header", "header", len(blob))
        n, pad, eos, bos, unk, dummy, fallback, zero = _HEAD.unpack_from(blob, 0)
        if n > (len(blob) - _HEAD.size) // _REC.size:    # before building any list of n
            raise TokenizerFormatError(f"n_pieces={n} cannot fit in the {len(blob)}-byte blob "
                                       f"(each piece takes >= {_REC.size} bytes)", "n_pieces", 0)
        for field, value, off in (("add_dummy_prefix", dummy, 20), ("byte_fallback", fallback, 21)):
            if value > 1:
                raise TokenizerFormatError(f"{field}={value} must be 0 or 1", field, off)
        if zero:
            raise TokenizerFormatError(f"header padding={zero} must be 0", "padding", 22)
        pieces, scores, types, off = [], [], [], _HEAD.size
        for i in range(n):
            if off + _REC.size > len(blob):
                raise TokenizerFormatError(f"piece {i}: record header runs past the end of the "
                                           f"{len(blob)}-byte blob", f"piece[{i}]", off)
            score, kind, length = _REC.unpack_from(blob, off)
            if kind > BYTE:
                raise TokenizerFormatError(f"piece {i}: type={kind} is not one of 0..4",
                                           f"piece[{i}].type", off + 4)
            if score != score or abs(score) == float("inf"):
                raise TokenizerFormatError(f"piece {i}: score={score} is not finite",
                                           f"piece[{i}].score", off)
            start = off + _REC.size
            if length == 0:      # an empty marker matches everywhere: encode() would not end
                raise TokenizerFormatError(f"piece {i}: len=0; a piece must not be empty",
                                           f"piece[{i}].len", off + 5)
            if start + length > len(blob):
                raise TokenizerFormatError(f"piece {i}: len={length} runs past the end of the "
                                           f"{len(blob)}-byte blob", f"piece[{i}].len", off + 5)
            try:
                text = blob[start:start + length].decode("utf-8")
            except UnicodeDecodeError as e:
                raise TokenizerFormatError(f"piece {i}: bytes are not UTF-8 ({e.reason})",
                                           f"piece[{i}].text", start + e.start) from None
            pieces.append(text), scores.append(score), types.append(kind)
            off = start + length
        if off != len(blob):
            raise TokenizerFormatError(f"{len(blob) - off} bytes follow the last piece",
                                       "trailing", off)
        try:
            tok = cls(pieces, scores, types, pad, eos, bos, unk, dummy, fallback)
        except ValueError as e:
            raise TokenizerFormatError(str(e), "pieces", _HEAD.size) from None
        missing = tok.missing_bytes()
        if missing:
            raise TokenizerFormatError(tok._fallback_message(missing), "byte_fallback", 21)
        return tok

    def missing_bytes(self) -> list:
        """With byte_fallback, the bytes 0..255 that have no <0xHH> piece (encode() could not
        fall back on them); [] without byte_fallback."""
        return [b for b in range(256) if b not in self.byte_id] if self.byte_fallback else []

    def _fallback_message(self, missing) -> str:
        return (f"byte_fallback=1 but {len(missing)} of the 256 <0xHH> BYTE pieces are missing "
                f"(first <0x{missing[0]:02X}>): a symbol outside the vocabulary could not be "
                f"encoded")

    def to_blob(self) -> bytes:
        out = bytearray(_HEAD.pack(len(self.pieces), self.pad_id, self.eos_id, self.bos_id,
                                   self.unk_id, int(self.add_dummy_prefix),
                                   int(self.byte_fallback), 0))
        for p, s, t in zip(self.pieces, self.scores, self.types):
            b = p.encode("utf-8")
            out += _REC.pack(s, t, len(b)) + b
        return bytes(out)

    @classmethod
    def from_sentencepiece(cls, sp) -> "Tokenizer":
        """What upstream's exporter stores for a SentencePieceProcessor: the fixed special ids
        0-3, and USER_DEFINED only for the ten chat markers (whatever the model calls them)."""
        pieces, scores, types = [], [], []
        for i in range(sp.GetPieceSize()):
            p = sp.IdToPiece(i)
            kind = (CONTROL if sp.IsControl(i) else UNKNOWN if sp.IsUnknown(i) else
                    BYTE if sp.IsByte(i) else USER_DEFINED if p in CHAT_MARKERS else NORMAL)
            # The blob stores f32 scores; round here so to_blob() writes the same bytes.
            scores.append(struct.unpack("<f", struct.pack("<f", sp.GetScore(i)))[0])
            pieces.append(p), types.append(kind)
        return cls(pieces, scores, types)

    # ---- encode / decode ----
    def encode(self, text: str) -> list:
        if not isinstance(text, str):
            raise TypeError(f"encode takes str, got {type(text).__name__}")
        if not text:
            return []
        s = text.replace(" ", SPACE)
        if self.add_dummy_prefix:
            s = SPACE + s
        ids, start, i = [], 0, 0
        while i < len(s):
            marker = next((m for m in self.markers if s.startswith(m, i)), None)
            if marker is None:
                i += 1
                continue
            ids += self._merge(s[start:i])
            ids.append(self.piece_id[marker])
            i = start = i + len(marker)
        return ids + self._merge(s[start:])

    def _merge(self, seg: str) -> list:
        """Highest-score pair merging, leftmost on ties, with a heap over adjacent pairs."""
        if not seg:
            return []
        syms = list(seg)
        nxt, prv = list(range(1, len(syms) + 1)), list(range(-1, len(syms) - 1))
        heap = []

        def push(a):
            b = nxt[a]
            if b < len(syms):
                pid = self.piece_id.get(syms[a] + syms[b])
                if pid is not None:
                    # The left symbol's start index orders ties left to right; the two texts
                    # let a popped entry be recognised as stale after either side merged.
                    heapq.heappush(heap, (-self.scores[pid], a, syms[a], syms[b]))

        for a in range(len(syms) - 1):
            push(a)
        while heap:
            _, a, left, right = heapq.heappop(heap)
            b = nxt[a]
            if syms[a] != left or b >= len(syms) or syms[b] != right:
                continue
            syms[a], syms[b] = left + right, None
            nxt[a] = nxt[b]
            if nxt[b] < len(syms):
                prv[nxt[b]] = a
            if prv[a] >= 0:
                push(prv[a])
            push(a)
        ids, a = [], 0
        while a < len(syms):
            pid = self.piece_id.get(syms[a])
            if pid is not None:
                ids.append(pid)
            elif self.byte_fallback:
                for byte in syms[a].encode("utf-8"):
                    if byte not in self.byte_id:
                        raise TokenizerFormatError(
                            f"byte_fallback: byte 0x{byte:02X} of {syms[a]!r} has no "
                            f"<0x{byte:02X}> piece to fall back on "
                            f"({len(self.missing_bytes())} of 256 missing)", "byte_fallback", 21)
                    ids.append(self.byte_id[byte])
            else:
                ids.append(self.unk_id)
            a = nxt[a]
        return ids

    def decode(self, ids) -> str:
        buf = bytearray()
        for i in ids:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < len(self.pieces):
                raise ValueError(f"token id {i!r} is outside 0..{len(self.pieces) - 1}")
            kind = self.types[i]
            if kind == BYTE:
                buf.append(int(self.pieces[i][3:5], 16))
            elif kind not in (CONTROL, UNKNOWN):
                buf += self.pieces[i].encode("utf-8")
        text = buf.decode("utf-8", "replace").replace(SPACE, " ")
        return text[1:] if self.add_dummy_prefix and text.startswith(" ") else text

    # ---- the chat prompt the model was fine-tuned on ----
    @staticmethod
    def render_prompt(query: str, tools="[]", system: str = "") -> str:
        """The prompt text upstream's fine-tuning renders (tools: a JSON string or a value to
        serialise compactly)."""
        tools_json = tools if isinstance(tools, str) else json.dumps(tools, separators=(",", ":"))
        prefix = f"<|im_start|>system\n{system}<|im_end|>\n" if system else ""
        return (f"{prefix}<|im_start|>user\n<tools>{tools_json}</tools>\n{query}<|im_end|>\n"
                f"<|im_start|>assistant\n")

    def chat_prompt(self, query: str, tools="[]", system: str = "") -> list:
        """Token ids to feed the model: BOS, then the encoded prompt."""
        return [self.bos_id] + self.encode(self.render_prompt(query, tools, system))
