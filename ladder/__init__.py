"""The parity harness: capture, compare, locate, tolerance tables, fixtures, CLI.

    rules.py     tolerance rules as data (patterns -> Rule; RuleSet; TOML/JSON files)
    trace.py     the capture protocol: Ladder, recorders, the step schedule
    capture.py   run the reference / the port over a schedule and record their ladders
    compare.py   per-point metrics and verdicts, logits checks (Comparison, PointResult)
    locate.py    first divergence, a linear scan inside the layer, injection (local vs propagated)
    table.py     pandas tolerance tables; text / markdown / CSV
    plot.py      the error-growth figure (matplotlib PNG, or SVG written here)
    report.py    markdown, CSV and self-contained HTML reports
    fixtures.py  forward-parity fixtures (safetensors + JSON manifest)
    faults.py    planted port faults, for tests
    cli.py       `python -m ladder run | locate | report | regen | rules`
    judge.py     one check as a call: capture a port (any kind), compare, locate (Verdict)
    golden.py    golden trace archives with pytest-regressions' regen semantics
    pytest_plugin.py  the pytest11 plugin: ladder_check, ladder_fixture, --ladder-* flags
    session_summary.py  the plugin's end-of-session lines
    sweep.py     `python -m ladder sweep`: cases run, resumed, pooled (-j), sharded
    sweep_grid.py  the grid file: keys, cases, ids, --shard
    sweep_row.py   one case run and turned into its JSON row
    sweep_report.py  --merge, and the md/csv/html report with its heat map
    v41.py       DeepSeek-V4.1 attention: its fixture, both sides driven over it, Comparison
    v41_locate.py  V4.1 first divergence, local vs propagated (re-run from the reference's state)
    v41_cli.py   `--model attn_v41` for run, locate and report

The public names below are imported on first use, so `ladder.rules` stays light.

    from ladder import capture_reference, capture_port, compare_ladders, load_rules
"""
import sys
import types
from importlib import import_module

_LAZY = {
    "Ladder": "trace", "TraceError": "trace",
    "capture_reference": "capture", "capture_port": "capture",
    "compare_ladders": "compare", "Comparison": "compare", "CompareError": "compare",
    "Rule": "rules", "RuleSet": "rules", "RulesError": "rules", "DEFAULT_RULES": "rules",
    "load_rules": "rules", "dump_rules": "rules",
    "write_report": "report",
    "load_fixture": ("fixtures", "load"), "FixtureError": "fixtures",
    "main": "cli",
}

__all__ = list(_LAZY) + ["locate"]


class _Package(types.ModuleType):
    """`ladder.locate` is the first-divergence search, the function (`from ladder import
    locate`), while the module of that name stays importable (`from ladder.locate import
    locate, Location`): the import system's binding of the submodule on the package goes to
    the setter below and is dropped; `sys.modules["ladder.locate"]` keeps the module."""

    @property
    def locate(self):
        return import_module(".locate", __name__).locate

    @locate.setter
    def locate(self, module):
        pass


sys.modules[__name__].__class__ = _Package


def __getattr__(name):
    if name in _LAZY:
        mod, attr = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
        return getattr(import_module(f".{mod}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
