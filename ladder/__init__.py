"""The parity harness: capture, compare, locate, tolerance tables, fixtures, CLI.

Subpackages, lowest first; each may import only the ones above it (docs/design.md, "Layout";
tests/project/test_imports.py holds every line of every file to it):

    model/          needle v2 as the harness sees it, as data: point names, the registry of
                    points, the geometry. Imports nothing of the project.
    engine/         the comparison, knowing no model: ladders, metrics and verdicts, rules,
                    tables, first divergence, reports and plots. Imports model/ and bounded/.
    formats/        files a ladder comes from or goes to: trace archives, needle-rs fixtures,
                    name maps (maps/), foreign safetensors. Imports engine/, model/, bounded/.
    sides/          the live sides: our reference and port captured, the --port protocol,
                    planted faults, our fixtures, local-vs-inherited re-runs, `judge`. The
                    first layer that imports reference/, port/ and kernels/.
    cli/            `python -m ladder`: the parser, the commands, argument checks.
    sweep/          `python -m ladder sweep`: grids, cases, rows, reports.
    pytest_plugin/  the pytest11 plugin (ladder_check, ladder_fixture, golden files).
    v41/            DeepSeek-V4.1 attention: its fixture, sides, locate and CLI.

The public names below are imported on first use, so `import ladder` stays light:

    from ladder import capture_reference, capture_port, compare_ladders, load_rules

The flat layout's module paths (`ladder.compare`, `ladder.rules`, ...) still import: each is
the moved module itself (one module object, so a monkeypatch through either path holds), for
code written before the split. New code imports the new paths.
"""
import importlib.abc
import importlib.util
import sys
import types
from importlib import import_module

_LAZY = {
    "Ladder": "engine.trace", "TraceError": "model.names",
    "capture_reference": "sides.capture", "capture_port": "sides.capture",
    "compare_ladders": "engine.compare", "Comparison": "engine.compare",
    "CompareError": "engine.compare",
    "Rule": "engine.rules", "RuleSet": "engine.rules", "RulesError": "engine.rules",
    "DEFAULT_RULES": "engine.rules", "load_rules": "engine.rules",
    "dump_rules": "engine.rules",
    "write_report": "engine.report",
    "load_fixture": ("sides.fixtures", "load"), "FixtureError": "sides.fixtures",
    "main": "cli.main",
}

# old flat module -> where it lives now
MOVED = {
    "names": "model.names", "points": "model.points", "geometry": "model.geometry",
    "trace": "engine.trace", "compare": "engine.compare", "rules": "engine.rules",
    "table": "engine.table", "locate": "engine.locate", "report": "engine.report",
    "plot": "engine.plot", "stand_in": "engine.stand_in", "atomic": "engine.atomic",
    "safe_print": "engine.safe_print",
    "archive": "engine.archive", "needle_rs": "formats.needle_rs",
    "namemap": "formats.namemap", "foreign": "formats.foreign",
    "capture": "sides.capture", "ports": "sides.ports", "faults": "sides.faults",
    "dump_locate": "sides.dump_locate", "fixtures": "sides.fixtures", "judge": "sides.judge",
    "runinfo": "sides.runinfo",
    "cli": "cli.main", "args": "cli.args", "compare_cli": "cli.compare",
    "points_cli": "cli.points", "progress": "cli.progress",
    "sweep_grid": "sweep.grid", "sweep_row": "sweep.row", "sweep_report": "sweep.report",
    "golden": "pytest_plugin.golden", "session_summary": "pytest_plugin.session_summary",
    "v41_locate": "v41.locate", "v41_cli": "v41.cli", "v41_archive": "v41.archive",
}

__all__ = list(_LAZY) + ["locate"]


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import ladder.compare` answers with the module `ladder.engine.compare` itself."""

    def find_spec(self, name, path=None, target=None):
        head, _, tail = name.partition(".")
        if head == __name__ and tail in MOVED:
            return importlib.util.spec_from_loader(name, self)
        return None

    def create_module(self, spec):
        return import_module(f"{__name__}.{MOVED[spec.name.partition('.')[2]]}")

    def exec_module(self, module):
        pass


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.append(_Moved())


class _Package(types.ModuleType):
    """`ladder.locate` is the first-divergence search, the function (`from ladder import
    locate`), while the module stays importable (`from ladder.engine.locate import locate,
    Location`): the import system's binding of a submodule named `locate` on the package goes
    to the setter below and is dropped; `sys.modules` keeps the module."""

    @property
    def locate(self):
        return import_module(".engine.locate", __name__).locate

    @locate.setter
    def locate(self, module):
        pass


sys.modules[__name__].__class__ = _Package


def __getattr__(name):
    if name in _LAZY:
        mod, attr = _LAZY[name] if isinstance(_LAZY[name], tuple) else (_LAZY[name], name)
        return getattr(import_module(f".{mod}", __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
