"""`run` folds its rows as `compare` does (issue 48 item 6): without --per-step the comparison
keeps each point's worst row, never every row, and prints the same table and verdict as the
comparison that keeps them all (one line more says the rows were folded)."""
import re

import pytest

import ladder.cli.commands as commands
from ladder.cli.main import main


def _printed(argv, keep=None, monkeypatch=None) -> tuple:
    if keep is not None:
        real = commands.compare_run
        monkeypatch.setattr(commands, "compare_run",
                            lambda args, out=print, _keep="all": real(args, out, keep))
    lines = []
    rc = main(argv, out=lines.append)
    # timings differ run to run (the step's, the noise floor's seconds); the rest must not
    text = "\n".join(str(x) for x in lines).splitlines()
    return rc, [re.sub(r"\d+\.\d+ s\b", "T s", x) for x in text if "s, total" not in x]


@pytest.mark.parametrize("extra", [[], ["--fine"], ["--plant", "rope_pos_plus_1"],
                                   ["--plant", "rope_pos_plus_1", "--fine"],
                                   ["--port-precision", "bfloat16"]])
def test_run_prints_the_same_folded_or_whole(monkeypatch, extra):
    argv = ["run", "--prompt-len", "3", "--steps", "4", "--no-check-plain", *extra]
    folded = _printed(argv)
    with monkeypatch.context() as m:
        whole = _printed(argv, "all", m)
    # one line more, saying the rows were folded; every other line the same, in order
    assert [x for x in folded[1] if not x.startswith("  streamed: ")] == whole[1]
    assert sum(x.startswith("  streamed: ") for x in folded[1]) == 1
    assert folded[0] == whole[0]
    assert folded[0] == (1 if "--plant" in extra else 0)


def test_run_folds_unless_every_row_is_printed(monkeypatch):
    seen, real = [], commands.compare_ladders

    def spy(*a, **kw):
        seen.append(kw.get("keep", "all"))
        return real(*a, **kw)
    monkeypatch.setattr(commands, "compare_ladders", spy)
    for flags, want in (([], "summary"), (["--per-step"], "all")):
        seen.clear()
        main(["run", "--prompt-len", "2", "--steps", "1", "--no-check-plain", *flags],
             out=lambda *a: None)
        assert seen == [want]
