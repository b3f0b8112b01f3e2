"""The ladder's layout holds in every line, function bodies included (docs/design.md, "Layout").

- Each subpackage imports only the layers below it: model/ nothing of the project; engine/
  model/ and bounded/; formats/ those and engine/; sides/ and everything above may import
  reference/, port/ and kernels/. No file in model/, engine/ or formats/ imports reference/,
  port/ or kernels/, not even lazily inside a function.
- No import circle among ladder's modules, counting imports inside functions.
- No module imports another module's underscore names.
- bounded/ imports nothing of the project.
"""
from tests import paths
import ast
import glob
import os

ROOT = paths.ROOT
PROJECT = {"reference", "port", "kernels", "ladder", "bounded"}
# what each part of ladder/ may import from the project (besides itself)
ALLOWED = {
    "model": {"bounded"},
    "engine": {"bounded", "ladder.model"},
    "formats": {"bounded", "ladder.model", "ladder.engine"},
}
MAX_LINES = 450


def _module_of(path):
    rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
    return rel[:-len(".__init__")] if rel.endswith(".__init__") else rel


def _imports(path):
    """(imported module, line, names) of every import in the file, at any depth."""
    mod = _module_of(path)
    pkg = mod if path.endswith("__init__.py") else mod.rpartition(".")[0]
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            for a in n.names:
                yield a.name, n.lineno, []
        elif isinstance(n, ast.ImportFrom):
            if n.level:
                base = pkg.split(".")
                base = base[:len(base) - (n.level - 1)]
                target = ".".join(base + ([n.module] if n.module else []))
            else:
                target = n.module
            names = [a.name for a in n.names]
            if n.module is None or n.level and not n.module:
                for a in names:                       # from . import x: x is a module
                    yield f"{target}.{a}", n.lineno, []
            else:
                yield target, n.lineno, names


def _files(package):
    return sorted(glob.glob(os.path.join(ROOT, package, "**", "*.py"), recursive=True))


def _ladder_modules():
    return {_module_of(p): p for p in _files("ladder")}


def _project_modules():
    return {_module_of(p): p for pkg in sorted(PROJECT) for p in _files(pkg)}


def _resolve(name, modules):
    """The ladder module an import names (a package resolves to its __init__)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def boundary_violations(files=None):
    bad = []
    for path in files or _files("ladder"):
        mod = _module_of(path)
        part = mod.split(".")[1] if mod.count(".") >= 1 else None
        if part not in ALLOWED:
            continue
        for target, line, _ in _imports(path):
            top = target.split(".")[0]
            if top not in PROJECT or target.startswith(f"ladder.{part}"):
                continue
            if not any(target == a or target.startswith(a + ".") for a in ALLOWED[part]):
                bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {target} "
                           f"(ladder/{part}/ may import {sorted(ALLOWED[part])})")
    return bad


def import_circles(modules=None):
    """Import circles among `modules` ({name: path}; default ladder's), each a sorted list.
    A package's __init__ is not an edge target: importing a.b runs a's __init__, but an
    __init__ that re-exports its modules would otherwise close a circle with every one."""
    modules = _ladder_modules() if modules is None else modules
    tops = {m.split(".")[0] for m in modules}
    graph = {m: set() for m in modules}
    for m, path in modules.items():
        for target, _, names in _imports(path):
            if target.split(".")[0] not in tops:
                continue
            hits = {_resolve(target, modules)}
            for n in names:                              # from ladder.sides import fixtures
                if f"{target}.{n}" in modules:
                    hits.add(f"{target}.{n}")
            for t in hits - {None, m} - tops:
                graph[m].add(t)
    # strongly connected components (Tarjan)
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def private_imports():
    bad = []
    for path in _files("ladder") + _files("bounded"):
        for target, line, names in _imports(path):
            if target.split(".")[0] in PROJECT:
                for n in names:
                    if n.startswith("_"):
                        bad.append(f"{os.path.relpath(path, ROOT)}:{line} imports {target}.{n}")
    return bad


def test_model_engine_formats_import_nothing_of_the_sides():
    bad = boundary_violations()
    assert not bad, "\n".join(bad)


def test_a_lazy_reference_import_inside_an_engine_function_is_caught(tmp_path):
    planted = tmp_path / "ladder" / "engine" / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text("def f():\n    import reference.decode\n    return reference\n")
    global ROOT
    saved, ROOT = ROOT, str(tmp_path)
    try:
        bad = boundary_violations([str(planted)])
    finally:
        ROOT = saved
    assert len(bad) == 1 and "imports reference.decode" in bad[0], bad


def test_no_import_circle_inside_ladder():
    circles = import_circles()
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_no_import_circle_in_any_package_of_the_project():
    """Every package (bounded, reference, port, kernels, ladder) and every import between them,
    counting imports inside functions."""
    circles = import_circles(_project_modules())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_a_planted_lazy_circle_is_caught(tmp_path):
    pkg = tmp_path / "reference"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import B\nA = 1\n")
    (pkg / "b.py").write_text("B = 2\n\ndef f():\n    from .a import A\n    return A\n")
    global ROOT
    saved, ROOT = ROOT, str(tmp_path)
    try:
        modules = {_module_of(str(p)): str(p) for p in sorted(pkg.glob("*.py"))}
        circles = import_circles(modules)
    finally:
        ROOT = saved
    assert circles == [["reference.a", "reference.b"]], circles


def test_no_module_imports_another_modules_underscore_names():
    bad = private_imports()
    assert not bad, "\n".join(bad)


def test_bounded_imports_nothing_of_the_project():
    bad = [f"{os.path.relpath(p, ROOT)}:{line} imports {t}" for p in _files("bounded")
           for t, line, _ in _imports(p) if t.split(".")[0] in PROJECT - {"bounded"}]
    assert not bad, "\n".join(bad)


def test_no_ladder_file_is_over_450_lines():
    long = [f"{os.path.relpath(p, ROOT)}: {n} lines" for p in _files("ladder")
            for n in [sum(1 for _ in open(p, encoding="utf-8"))] if n > MAX_LINES]
    assert not long, "\n".join(long)


def test_every_subpackage_says_what_it_is_and_may_import():
    for init in glob.glob(os.path.join(ROOT, "ladder", "*", "__init__.py")):
        with open(init, encoding="utf-8") as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
        assert len(doc) > 80 and "import" in doc, f"{os.path.relpath(init, ROOT)}: {doc!r}"
