"""All-or-nothing output: every file a command writes lands, or none does.

    write_all({path: bytes | str | writer(file object)}) -> [path, ...]

Each file is written to a temporary file beside its target (mkstemp: a fresh name, never a
link someone left there), flushed and fsynced; only when every one is complete are they renamed
into place. A target that is a directory is refused before anything is renamed; if a rename
still fails, the targets already replaced get their old contents back (each was moved to a
backup first) and every temporary file is removed. A failed write (a full disk, a file-size
limit) raises OutputError, an OSError naming the file, never a library's own error. Text is
written as UTF-8, what UTF-8 cannot hold (a lone surrogate) backslash-escaped.
"""
from __future__ import annotations

import os
import tempfile

from ladder.engine.safe_print import escaped


class OutputError(OSError):
    """A file the command could not write (names it and the reason); nothing was left."""


def _fail(path: str, e: BaseException):
    why = getattr(e, "strerror", None) or str(e) or type(e).__name__
    raise OutputError(getattr(e, "errno", None) or 0, f"cannot write {path}: {why}; nothing "
                                                      f"was written") from None


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_all(contents: dict) -> list:
    """Write every {path: bytes | str | callable(binary file)} or none of them; the paths."""
    paths = [os.fspath(p) for p in contents]
    for p in paths:
        if os.path.isdir(p):
            raise OutputError(21, f"cannot write {p}: it is a directory; nothing was written")
    tmps = {}
    try:
        for p, body in zip(paths, contents.values()):
            d = os.path.dirname(os.path.abspath(p))
            try:
                fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", suffix=".tmp",
                                           dir=d)
            except OSError as e:
                _fail(p, e)
            tmps[p] = tmp
            try:
                os.fchmod(fd, 0o666 & ~current_umask())    # mkstemp's 0600 is not what open() gives
                with os.fdopen(fd, "wb") as f:
                    if callable(body):
                        body(f)
                    else:
                        f.write(escaped(body).encode("utf-8") if isinstance(body, str) else body)
                    f.flush()
                    os.fsync(f.fileno())
            except OSError as e:
                _fail(p, e)
        _rename_all(paths, tmps)
    finally:
        for tmp in tmps.values():
            if os.path.lexists(tmp):
                os.unlink(tmp)
    return paths


def _rename_all(paths: list, tmps: dict) -> None:
    backups, done = {}, []
    try:
        for p in paths:
            if os.path.lexists(p):
                backups[p] = f"{tmps[p]}.old"
                os.replace(p, backups[p])
            os.replace(tmps[p], p)
            done.append(p)
    except OSError as e:
        for p in done:                      # undo: the new files out, the old ones back
            if os.path.lexists(p):
                os.unlink(p)
        for p, bak in backups.items():
            if os.path.lexists(bak):
                os.replace(bak, p)
        _fail(p, e)
    for bak in backups.values():
        if os.path.lexists(bak):
            os.unlink(bak)
