"""The header a command prints before its table: the true ring and window, the rules file,
the CQ reference, the positions a compare counts.
"""
from ladder.cli.main import main


def run(*argv):
    lines = []
    rc = main(list(argv), out=lines.append)
    return rc, "\n".join(lines)


def test_header_names_the_true_ring_and_window(monkeypatch):
    rc, text = run("run", "--prompt-len", "4", "--steps", "8", "--window", "5", "--no-check-plain")
    assert rc == 0 and "the ring (8 slots, window 5) wraps at position 8" in text, text
    rc, text = run("run", "--prompt-len", "4", "--steps", "2", "--window", "5", "--no-check-plain")
    assert "6 positions fit in the ring of 8 slots (window 5), so the ring never wraps" in text
    from port.model import V2Model
    from port.state import V2State
    monkeypatch.setattr(V2Model, "make_state",
                        lambda self: V2State(self.cfg, ring=9, window=8, device=self.device))
    rc, text = run("run", "--no-check-plain")
    assert "make_state(): ring 9, window 8" in text
    assert "the ring (9 slots, window 8) wraps at position 9" in text, text


def test_the_header_names_the_rules_file_and_the_cq_reference(tmp_path):
    from ladder.engine.rules import DEFAULT_RULES, dump_rules
    rules = tmp_path / "mine.toml"
    rules.write_text(dump_rules(DEFAULT_RULES))
    rc, text = run("run", "--rules", str(rules), "--steps", "1", "--no-check-plain")
    assert rc == 0 and f"rules: {rules} ({len(DEFAULT_RULES.rules)} patterns;" in text, text
    assert "exactly dequantised" not in text
    rc, text = run("run", "--weights", "cq", "--steps", "1", "--no-check-plain")
    assert rc == 0 and "reference: runs on the exactly dequantised weights" in text, text
    assert "rules: " not in text.split("schedule:")[0]


def test_compare_of_a_last_only_dump_counts_the_positions_it_compares(tmp_path):
    out = str(tmp_path / "t.safetensors")
    rc, text = run("dump", "torch", "--out", out, "--last-only")
    assert rc == 0, text
    rc, text = run("compare", out)
    assert rc == 0 and "; compared: 13 last positions of 18 (the last of each step)" in text, text
