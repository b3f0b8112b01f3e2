"""Reading files the project did not write: regular files only, capped reads, bounded parsing.

Every reader of a user-supplied file (.cact, parameter safetensors, fixture manifests, rules,
configs carried in metadata) goes through these functions, in this order:

    open_regular(path, limit)      refuses FIFOs, devices, directories (a link to /dev/zero
                                   reports size 0 and then never ends), and files over `limit`
    read_capped(path, limit)       the bytes, never more than `limit` however the file grows
    parse_json(raw, where)         nesting, number lengths and container and entry counts
                                   checked by a linear pre-scan
    parse_toml(raw, where)         the same pre-scan for TOML (dotted keys nest too)

Each takes `error`, the caller's exception class, so a .cact reader raises CactFormatError and
a rules loader RulesError; the message always names the file, the byte offset where there is
one, the value and the limit. The C json scanner recurses per nesting level and tomllib's memory
grows quadratically with dotted-key depth, so both limits are enforced *before* parsing.
"""
from __future__ import annotations

import json
import math
import os
import re
import stat

MAX_DEPTH = 64              # nesting of arrays/objects/tables; the project's files use <= 4
MAX_NUMBER_CHARS = 64       # a float64 needs <= 25 characters, an int64 <= 20
MAX_KEY_DOTS = 32           # a TOML key a.b.c has 2; nothing the project reads has more than 1
# Counts, not only bytes: a 63 MB file of nested empty lists is 21 million containers, tens of
# seconds and ~2 GB to parse. The largest file the project reads (a 260-step fixture's
# safetensors header) has ~75,000 containers and ~130,000 entries.
MAX_CONTAINERS = 1 << 19    # arrays/objects (JSON), arrays/inline tables/table headers (TOML)
MAX_ENTRIES = 1 << 22       # separators: ',' (and '=' in TOML), one per element or key


class InputFileError(ValueError):
    """A file refused before or while reading it (names the file, the value and the limit)."""


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def open_regular(path, limit: int, error=InputFileError, what: str = "file"):
    """(binary file object, size) for a regular file of at most `limit` bytes.

    O_NONBLOCK keeps a FIFO from blocking open() forever; the type is checked on the open
    descriptor, so a path swapped after the check cannot slip a device in."""
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except IsADirectoryError:
        raise error(f"{path}: {what} is a directory, not a regular file") from None
    except OSError as e:
        raise error(f"{path}: cannot open {what}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{path}: {what} is {_kind(st.st_mode)}, not a regular file; refused "
                        f"before reading")
        if st.st_size > limit:
            raise error(f"{path}: {st.st_size} bytes exceeds the {what} limit {limit}")
        if hasattr(os, "O_NONBLOCK"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def read_capped(path, limit: int, error=InputFileError, what: str = "file") -> bytes:
    """The whole of a regular file of at most `limit` bytes. Reads at most its size + 1 bytes
    (so the buffer follows the real size, not the limit), and refuses a file that grew or
    shrank while it was read."""
    f, size = open_regular(path, limit, error, what)
    with f:
        data = f.read(size + 1)
    if len(data) > size:
        raise error(f"{os.fspath(path)}: {what} grew past its size of {size} bytes while "
                    f"being read")
    if len(data) < size:     # truncated under us: the bytes read are not the file it was
        raise error(f"{os.fspath(path)}: {what} shrank to {len(data)} of its {size} bytes "
                    f"while being read")
    return data


# ---------------------------------------------------------------- JSON
# One alternation: a string (skipped whole, so brackets and digits inside it do not count), a
# bracket, or a run of number characters. A string always matches, up to its closing quote or
# the end of the text: a failed match would be retried from every later quote, quadratic in an
# unterminated string of escaped quotes. Possessive (*+) so the body never backtracks either.
_JSON_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)|[\[\]{}]|[-+0-9.eE]+', re.S)
_JSON_TOKENS_COMMAS = re.compile(rb'"(?:[^"\\]|\\.)*+(?:"|\\?\Z)|[\[\]{},]|[-+0-9.eE]+',
                                 re.S)


def check_json_bounds(raw: bytes, where: str, error=InputFileError, max_depth: int = MAX_DEPTH,
                      max_number: int = MAX_NUMBER_CHARS, base: int = 0):
    """Refuse nesting deeper than `max_depth`, number literals longer than `max_number`
    characters, more than MAX_CONTAINERS arrays/objects or MAX_ENTRIES elements (counted by
    their ',' separators), naming the byte offset (`base` is added: the text's offset in its
    file)."""
    depth = containers = entries = 0
    # raw.count(b",") bounds the entries from above (it counts commas in strings too): the
    # scan only matches separators when the file may hold too many
    tokens = _JSON_TOKENS_COMMAS if raw.count(b",") >= MAX_ENTRIES else _JSON_TOKENS
    for m in tokens.finditer(raw):
        c = raw[m.start()]
        if c in b"[{":
            depth += 1
            containers += 1
            if depth > max_depth:
                raise error(f"{where}: JSON nesting depth {depth} at byte {base + m.start()} "
                            f"exceeds the limit {max_depth}")
            if containers > MAX_CONTAINERS:
                raise error(f"{where}: JSON array or object number {containers} at byte "
                            f"{base + m.start()} exceeds the limit of {MAX_CONTAINERS}")
        elif c in b"]}":
            depth -= 1
        elif c == ord(","):
            entries += 1
            if entries >= MAX_ENTRIES:
                raise error(f"{where}: JSON element number {entries + 1} at byte "
                            f"{base + m.start()} exceeds the limit of {MAX_ENTRIES}")
        elif c != ord('"') and m.end() - m.start() > max_number:
            raise error(f"{where}: number literal of {m.end() - m.start()} characters at byte "
                        f"{base + m.start()} exceeds the limit {max_number}")


def _refuse_constant(name):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text):
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"number {text} overflows a float64")
    return v


def _unique_keys(pairs):
    """A JSON object as a dict, refusing a key given twice (json.loads keeps the last one)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                shown = repr(k) if len(repr(k)) <= 60 else repr(k)[:57] + "..."
                raise ValueError(f"key {shown} appears twice in one object")
            seen.add(k)
    return out


def parse_json(raw, where: str, error=InputFileError, base: int = 0):
    """JSON from bytes or str after the bounds pre-scan. NaN/Infinity (not JSON), floats
    that overflow to inf and an object key given twice are refused."""
    if isinstance(raw, str):
        raw = raw.encode("utf-8", "surrogatepass")
    check_json_bounds(raw, where, error, base=base)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 at byte {base + e.start}") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                          object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        at = base + len(text[:e.pos].encode("utf-8", "surrogatepass"))
        raise error(f"{where}: malformed JSON at line {e.lineno} column {e.colno} "
                    f"(offset {at}): {e.msg}") from None
    except (ValueError, RecursionError) as e:      # the hooks above; a guard, not a path
        raise error(f"{where}: malformed JSON: {e}") from None


def load_json(path, limit: int, error=InputFileError, what: str = "JSON file"):
    """read_capped + parse_json: what the V4.1 fixture loader should call instead of json.load."""
    return parse_json(read_capped(path, limit, error, what), os.fspath(path), error)


# ---------------------------------------------------------------- TOML
# Multi-line strings, one-line strings, comments; as for JSON, each also ends at the end of its
# line or of the text, so no match ever fails and gets retried.
_TOML_STRINGS = re.compile(rb'"""(?:[^\\]|\\.)*?(?:"""|\\?\Z)|\'\'\'.*?(?:\'\'\'|\Z)'
                           rb'|"(?:[^"\\\n]|\\[^\n])*+(?:"|\\?(?=\n)|\\?\Z)'
                           rb"|'[^'\n]*+(?:'|(?=\n)|\Z)|#[^\n]*", re.S)
_TOML_DIGITS = re.compile(rb"[0-9][0-9_]*")


def check_toml_bounds(raw: bytes, where: str, error=InputFileError, max_depth: int = MAX_DEPTH,
                      max_dots: int = MAX_KEY_DOTS, max_number: int = MAX_NUMBER_CHARS):
    """The TOML counterpart of check_json_bounds. Strings and comments are blanked first (same
    length, so offsets still hold); then each key's dots, the bracket nesting and count, the
    entries ('=' and ',') and every digit run are counted. Linear in the file size."""
    def blank_out(m):
        n = m.end() - m.start()
        return (b'"' + b"x" * (n - 2) + b'"')[:n] if m.group()[:1] in (b'"', b"'") else b" " * n
    blank = _TOML_STRINGS.sub(blank_out, raw)
    depth = containers = entries = 0
    many = blank.count(b",") + blank.count(b"=") >= MAX_ENTRIES
    for m in re.finditer(rb"[\[\]{}=,]" if many else rb"[\[\]{}]", blank):
        c = blank[m.start()]
        if c in b"[{":
            depth += 1
            containers += 1
            if depth > max_depth:
                raise error(f"{where}: TOML nesting depth {depth} at byte {m.start()} exceeds "
                            f"the limit {max_depth}")
            if containers > MAX_CONTAINERS:
                raise error(f"{where}: TOML array or table number {containers} at byte "
                            f"{m.start()} exceeds the limit of {MAX_CONTAINERS}")
        elif c in b"]}":
            depth -= 1
        else:
            entries += 1
            if entries >= MAX_ENTRIES:
                raise error(f"{where}: TOML entry number {entries + 1} at byte {m.start()} "
                            f"exceeds the limit of {MAX_ENTRIES}")
    # A key ends at '=' (or ']' for a table header); separators ',', '{', '[' and newlines
    # start the next one. Counting dots between separators bounds every key's depth.
    pos = 0
    for piece in re.split(rb"[=,{}\[\]\n]", blank):
        dots = piece.count(b".")
        if dots > max_dots:
            raise error(f"{where}: TOML key with {dots} dotted levels at byte "
                        f"{pos + piece.index(b'.')} exceeds the limit {max_dots}")
        pos += len(piece) + 1
    for m in _TOML_DIGITS.finditer(blank):
        if m.end() - m.start() > max_number:
            raise error(f"{where}: number literal of {m.end() - m.start()} characters at byte "
                        f"{m.start()} exceeds the limit {max_number}")


def parse_toml(raw: bytes, where: str, error=InputFileError) -> dict:
    """TOML (Python 3.11+'s tomllib) from bytes after the bounds pre-scan."""
    try:
        import tomllib
    except ImportError:
        raise error(f"{where}: TOML needs Python 3.11+ (tomllib); use JSON") from None
    check_toml_bounds(raw, where, error)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{where}: not UTF-8 at byte {e.start}") from None
    try:
        return tomllib.loads(text)
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as e:
        raise error(f"{where}: malformed TOML: {e}") from None
