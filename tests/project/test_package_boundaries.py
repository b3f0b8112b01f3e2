"""Package boundaries (docs/design.md, "Layout"): the reference imports nothing from port/, kernels/ or ladder/
(it is the specification, and must know nothing of the harness); kernels/ imports neither
side; port/ takes from reference/ only the description (config, params, cact)."""
from tests import paths
import ast
import glob
import os

import pytest
import torch

ROOT = paths.ROOT
FORBIDDEN = {"reference": {"port", "kernels", "ladder"}, "kernels": {"reference", "port", "ladder"}}


def _imported_packages(path):
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                yield a.name.split(".")[0], n.lineno
        elif isinstance(n, ast.ImportFrom) and n.level == 0 and n.module:
            yield n.module.split(".")[0], n.lineno


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_none_of_the_forbidden(package):
    bad = [f"{os.path.relpath(p, ROOT)}:{line} imports {mod}"
           for p in sorted(glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True))
           for mod, line in _imported_packages(p) if mod in FORBIDDEN[package]]
    assert not bad, "\n".join(bad)


def test_the_reference_self_checks_are_the_harness_rules():
    """ladder/engine/rules.py takes the reference's self-check bounds over: same bound, same verdict."""
    from ladder.sides.reference_rules import REFERENCE_RULES
    from reference.self_checks import SELF_CHECKS, within
    g = torch.Generator().manual_seed(0)
    b = torch.randn(3, 50, generator=g)
    for name, (bound, why) in SELF_CHECKS.items():
        rule = REFERENCE_RULES[name]
        assert (rule.rtol, rule.why) == (bound, why)
        for f in (0.5, 0.99, 1.01, 2.0):
            a = b.clone()
            a[1, 7] += f * bound * float(b.abs().max())
            assert within(name, a, b) == rule.check(a, b) == (f < 1), (name, f)
        a = b.clone()
        a[0, 0] = float("nan")
        assert not within(name, a, b) and not rule.check(a, b)
