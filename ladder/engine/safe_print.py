"""Printing text that came from files and the command line: never a UnicodeEncodeError.

A JSON escape can carry a lone surrogate ("\\ud800" in a rule's `why`, a V4.1 manifest field),
and a file name that is not UTF-8 reaches Python as surrogate escapes; printing either to a
strict UTF-8 (or ASCII) stream raises. `escaped` shows what the stream cannot encode as
backslash escapes (a surrogate-escaped byte as \\xNN, a lone surrogate as \\udNNN), and
`safe_print` is print with that applied.
"""
from __future__ import annotations

import sys


def escaped(text: str, encoding: str | None = None) -> str:
    """`text` with every character `encoding` (default UTF-8) cannot encode backslash-escaped."""
    enc = encoding or "utf-8"
    try:
        text.encode(enc)
        return text
    except UnicodeEncodeError:
        pass
    out = []
    for ch in text:
        try:
            ch.encode(enc)
            out.append(ch)
        except UnicodeEncodeError:
            o = ord(ch)
            out.append(f"\\x{o - 0xDC00:02x}" if 0xDC80 <= o <= 0xDCFF else
                       ch.encode("ascii", "backslashreplace").decode("ascii"))
    return "".join(out)


def safe_print(*args, sep=" ", end="\n", file=None, flush=False) -> None:
    stream = sys.stdout if file is None else file
    text = sep.join(str(a) for a in args)
    print(escaped(text, getattr(stream, "encoding", None)), end=end, file=stream, flush=flush)
