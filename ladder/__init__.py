"""The parity harness: capture, compare, locate, tolerance tables, fixtures, CLI.

    rules.py     tolerance rules as data (patterns -> Rule; RuleSet; TOML/JSON files)
    trace.py     the capture protocol: Ladder, recorders, the step schedule
    capture.py   run the reference / the port over a schedule and record their ladders
    compare.py   per-point metrics and verdicts, logits checks (Comparison, PointResult)
    locate.py    first divergence, bisection inside the layer, injection (local vs propagated)
    table.py     pandas tolerance tables; text / markdown / CSV
    plot.py      the error-growth figure (matplotlib PNG, or SVG written here)
    report.py    markdown, CSV and self-contained HTML reports
    fixtures.py  forward-parity fixtures (safetensors + JSON manifest)
    faults.py    planted port faults, for tests
    cli.py       `python -m ladder run | locate | report | regen | rules`
    v41.py       DeepSeek-V4.1 attention: its fixture, both sides driven over it, Comparison
    v41_locate.py  V4.1 first divergence, local vs propagated (re-run from the reference's state)
    v41_cli.py   `--model attn_v41` for run, locate and report

Submodules are imported on demand: `ladder.rules` stays light for reference/.
"""
