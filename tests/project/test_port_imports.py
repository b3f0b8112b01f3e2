"""No import circle inside port/ or port/v41/ (issue 23): every `import` and `from ... import`
of every module, at module level or inside a function, read with ast; the graph of the
package's own modules must have no cycle. A newcomer reads the modules in an order where each
one only needs those before it."""
from __future__ import annotations

from tests import paths
import ast
import os

ROOT = paths.ROOT


def modules(pkg: str) -> dict:
    """Dotted module name -> file path, for every .py file under the package directory."""
    out = {}
    base = os.path.join(ROOT, *pkg.split("."))
    for dirpath, _, files in os.walk(base):
        for f in files:
            if f.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[:-3].split(os.sep)
                if rel[-1] == "__init__":
                    rel = rel[:-1]
                out[".".join(rel)] = os.path.join(dirpath, f)
    return out


def imports_of(name: str, path: str, known: dict) -> set:
    """The package's own modules that module `name` imports (anywhere in its body). A
    package's __init__ is not counted as a dependency of its submodules' imports of each
    other (`from . import x` names module x)."""
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    is_pkg = path.endswith("__init__.py")
    here = name.split(".") if is_pkg else name.split(".")[:-1]
    deps = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in known:
                    deps.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for a in node.names:
                sub = f"{mod}.{a.name}"
                if sub in known:
                    deps.add(sub)           # `from . import x`: the submodule x
                elif mod in known:
                    deps.add(mod)
    deps.discard(name)
    return deps


def find_cycle(graph: dict):
    """One cycle of the graph as a list of names, or None."""
    colour, stack = {}, []

    def visit(n):
        colour[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if colour.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if not colour.get(m):
                c = visit(m)
                if c:
                    return c
        stack.pop()
        colour[n] = 2
        return None
    for n in sorted(graph):
        if not colour.get(n):
            c = visit(n)
            if c:
                return c
    return None


def graph_of(pkg: str) -> dict:
    known = modules(pkg)
    # A package's __init__ re-exports; its submodules never need it, so leave it out.
    return {n: {m for m in imports_of(n, p, known) if m != pkg}
            for n, p in known.items()}


def test_port_has_no_import_circle():
    g = graph_of("port")
    assert {"port.model", "port.graph", "port.backend", "port.v41.attn"} <= set(g)
    cycle = find_cycle(g)
    assert cycle is None, " -> ".join(cycle)


def test_port_v41_has_no_import_circle():
    g = {n: deps for n, deps in graph_of("port").items() if n.startswith("port.v41")}
    cycle = find_cycle({n: {m for m in d if m in g} for n, d in g.items()})
    assert cycle is None, " -> ".join(cycle)


def test_the_check_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# Modules allowed to test a backend's or decode mode's name: the place that picks the port's
# backend, the V4.1 runtime's own constructor (which picks its ring kernel and graphs there),
# and the plot module, whose `backend` is matplotlib's, not the port's.
NAME_TESTS_ALLOWED = {"port/backend.py", "port/v41/attn.py", "ladder/engine/plot.py"}


def name_tests(path: str) -> list:
    """(line, source) of every comparison of a `backend`/`decode` name or attribute with a
    string constant (or a tuple of them) in the file."""
    src = open(path, encoding="utf-8").read()
    found = []

    def named(n):
        return (isinstance(n, ast.Name) and n.id in ("backend", "decode")) or \
            (isinstance(n, ast.Attribute) and n.attr in ("backend", "decode"))

    def strings(n):
        return (isinstance(n, ast.Constant) and isinstance(n.value, str)) or \
            (isinstance(n, (ast.Tuple, ast.List, ast.Set)) and n.elts and
             all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts))
    for node in ast.walk(ast.parse(src, path)):
        if isinstance(node, ast.Compare):
            sides = [node.left] + list(node.comparators)
            if any(named(s) for s in sides) and any(strings(s) for s in sides):
                found.append((node.lineno, ast.get_source_segment(src, node)))
    return found


def test_only_the_backend_module_tests_backend_names():
    bad = []
    for pkg in ("port", "ladder"):
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if not f.endswith(".py"):
                    continue
                rel = os.path.relpath(os.path.join(dirpath, f), ROOT).replace(os.sep, "/")
                if rel not in NAME_TESTS_ALLOWED:
                    bad += [f"{rel}:{ln}: {seg}" for ln, seg in name_tests(
                        os.path.join(dirpath, f))]
    assert not bad, "\n".join(bad)
    assert name_tests(os.path.join(ROOT, "port", "backend.py"))    # the check sees them
