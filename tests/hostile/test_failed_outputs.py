"""A run that fails leaves nothing half-written: fixtures, reports and the V4.1 report are
all or nothing, a full disk is an OS error, an empty --out is refused up front.
"""
import os
import pytest
import torch
from ladder.cli.main import main as ladder_main


# ---------------------------------------------------------------- 5. outputs of failed runs
def _tiny_fixture():
    return {"a": torch.arange(6.0), "b": torch.ones(2, 3)}, {"schema": 1, "note": "x"}


def test_fixture_write_is_all_or_nothing_when_the_manifest_fails(tmp_path):
    from ladder.sides import fixtures
    from ladder.engine.atomic import OutputError
    stem = tmp_path / "fx"
    tensors, manifest = _tiny_fixture()
    fixtures.write(stem, tensors, manifest)
    before = (tmp_path / "fx.safetensors").read_bytes()
    os.unlink(tmp_path / "fx.json")
    os.mkdir(tmp_path / "fx.json")                    # the manifest cannot be written
    with pytest.raises(OutputError, match=r"fx\.json: it is a directory; nothing was written"):
        fixtures.write(stem, {"a": torch.zeros(3)}, manifest)
    assert (tmp_path / "fx.safetensors").read_bytes() == before     # tensors not replaced
    assert sorted(os.listdir(tmp_path)) == ["fx.json", "fx.safetensors"]   # no .tmp left


def test_fixture_write_on_a_full_disk_is_an_os_error_and_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: the write fails with EFBIG, not SIGXFSZ."""
    import resource
    import signal
    from ladder.sides import fixtures
    from ladder.engine.atomic import OutputError
    tensors = {"a": torch.zeros(1 << 16)}            # 256 KB, over the 64 KB limit below
    old_sig = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, old[1]))
    try:
        with pytest.raises(OutputError, match=r"cannot write .*fx\.safetensors: File too large"):
            fixtures.write(tmp_path / "fx", tensors, {"schema": 1})
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, old_sig)
    assert os.listdir(tmp_path) == []


def test_report_is_all_or_nothing(tmp_path):
    from ladder.engine.atomic import OutputError
    from ladder.engine.compare import compare_ladders
    from ladder.engine.report import write_report
    from ladder.engine.rules import Rule, RuleSet
    from ladder.engine.trace import Ladder, schedule
    steps = schedule([1, 2, 3], 1)
    values = {f"{st.name}/L00.x": torch.ones(len(st.tokens), 4) for st in steps}
    cmp = compare_ladders(Ladder(steps, values, "port"), Ladder(steps, values, "ref"),
                          RuleSet(rules={"port/*": Rule(1e-3)}))
    os.mkdir(tmp_path / "ladder.html")                 # the last of the three cannot land
    with pytest.raises(OutputError, match=r"ladder\.html: it is a directory"):
        write_report(cmp, tmp_path, plot_backend="svg")
    assert os.listdir(tmp_path) == ["ladder.html"]     # no .md, no .csv, no temporary file
    os.rmdir(tmp_path / "ladder.html")
    assert sorted(os.path.basename(p) for p in write_report(cmp, tmp_path,
                                                            plot_backend="svg").values()) == \
        ["ladder.csv", "ladder.html", "ladder.md"]
    mask = os.umask(0o022)
    os.umask(mask)
    assert os.stat(tmp_path / "ladder.md").st_mode & 0o777 == 0o666 & ~mask   # as open() makes


@pytest.mark.parametrize("argv, flag", [(["regen", "--out", ""], "--out ''"),
                                        (["regen", "--out", "/tmp/"], "--out '/tmp/'"),
                                        (["report", "--out", ""], "--out ''")])
def test_empty_out_is_refused(tmp_path, monkeypatch, capsys, argv, flag):
    monkeypatch.chdir(tmp_path)
    assert ladder_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {flag}: ") and err.count("\n") == 1, err
    assert os.listdir(tmp_path) == []


def test_v41_report_writes_its_six_files_together(tmp_path, monkeypatch):
    """The V4.1 report is two reports (port vs reference, reference vs official): a failure
    on the second leaves neither, where the first used to be written already."""
    import argparse
    import ladder.v41.cli as v41_cli
    from ladder.engine.atomic import OutputError
    from ladder.engine.compare import compare_ladders
    from ladder.engine.rules import Rule, RuleSet
    from ladder.engine.trace import Ladder, schedule
    steps = schedule([1, 2, 3], 1)
    values = {f"{st.name}/L00.x": torch.ones(len(st.tokens), 4) for st in steps}
    cmp = compare_ladders(Ladder(steps, values, "port"), Ladder(steps, values, "ref"),
                          RuleSet(rules={"port/*": Rule(1e-3)}))
    monkeypatch.setattr(v41_cli, "compare_run", lambda args, out: (cmp, cmp, {}, {}))
    monkeypatch.setattr(v41_cli, "_locate", lambda cmp, ctx: None)
    args = argparse.Namespace(out=str(tmp_path), stem="v41", plot="svg")
    os.mkdir(tmp_path / "v41-official.html")
    with pytest.raises(OutputError, match=r"v41-official\.html: it is a directory"):
        v41_cli.cmd_report(args, out=lambda *a: None)
    assert os.listdir(tmp_path) == ["v41-official.html"]
    os.rmdir(tmp_path / "v41-official.html")
    assert v41_cli.cmd_report(args, out=lambda *a: None) == 0
    assert len(os.listdir(tmp_path)) == 6
