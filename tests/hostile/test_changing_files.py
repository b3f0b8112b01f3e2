"""Files that change between stat and read (grow, shrink, are truncated) and /proc files
that report size zero are refused, never read past their checked size.
"""
import pytest
import torch
from bounded import io as safe_io


# ---------------------------------------------------------------- files that change size
def _sized(monkeypatch, delta):
    """open_regular reporting the file's size off by `delta` (as if it changed between the
    fstat and the read)."""
    real = safe_io.open_regular

    def fake(path, limit, error=safe_io.InputFileError, what="file"):
        f, size = real(path, limit, error, what)
        return f, size + delta
    monkeypatch.setattr(safe_io, "open_regular", fake)


def test_a_file_that_grows_while_read_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "f.json"
    p.write_bytes(b'{"a": 1}')
    assert safe_io.read_capped(p, 100) == b'{"a": 1}'
    _sized(monkeypatch, -1)                        # one byte more than fstat said
    with pytest.raises(safe_io.InputFileError, match="grew past its size of 7 bytes"):
        safe_io.read_capped(p, 100)


def test_a_file_that_shrinks_while_read_is_refused(tmp_path, monkeypatch):
    """A truncated read must not pass for the whole file (a cut .cact or manifest would be
    parsed from fewer bytes than its size said)."""
    p = tmp_path / "f.json"
    p.write_bytes(b'{"a": 1}')
    _sized(monkeypatch, +3)                        # three bytes fewer than fstat said
    with pytest.raises(safe_io.InputFileError, match="shrank to 8 of its 11 bytes"):
        safe_io.read_capped(p, 100)


def test_a_real_file_truncated_between_stat_and_read_is_refused(tmp_path, monkeypatch):
    p = tmp_path / "f.bin"
    p.write_bytes(bytes(range(64)))
    real = safe_io.open_regular

    def cut_after_stat(path, limit, error=safe_io.InputFileError, what="file"):
        f, size = real(path, limit, error, what)
        with open(path, "r+b") as g:
            g.truncate(10)
        return f, size
    monkeypatch.setattr(safe_io, "open_regular", cut_after_stat)
    with pytest.raises(safe_io.InputFileError, match="shrank to 10 of its 64 bytes"):
        safe_io.read_capped(p, 100)


def test_a_safetensors_file_truncated_between_stat_and_read_is_refused(tmp_path, monkeypatch):
    """load_safetensors reads tensor by tensor (not through read_capped): a tensor cut short
    by a file that shrank after its size was taken is refused by name."""
    import reference.params as params
    from safetensors.torch import save_file
    p = str(tmp_path / "t.safetensors")
    save_file({"a": torch.arange(64, dtype=torch.float32)}, p)
    assert torch.equal(params.load_safetensors(p)[0]["a"], torch.arange(64.0))
    import bounded.safetensors as st
    real = st.open_regular

    def cut_after_stat(path, limit, error=safe_io.InputFileError, what="file"):
        f, size = real(path, limit, error, what)
        with open(path, "r+b") as g:
            g.truncate(size - 16)
        return f, size
    monkeypatch.setattr(st, "open_regular", cut_after_stat)
    with pytest.raises(params.ParamsError, match="tensor 'a' is truncated .*shrank"):
        params.load_safetensors(p)


def test_a_proc_file_of_size_zero_with_content_is_refused():
    import os
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc")
    assert os.stat("/proc/self/status").st_size == 0
    with pytest.raises(safe_io.InputFileError, match="grew past its size of 0 bytes"):
        safe_io.read_capped("/proc/self/status", 1 << 20)
    with pytest.raises(safe_io.InputFileError, match="grew past its size of 0 bytes"):
        safe_io.load_json("/proc/self/status", 1 << 20)
