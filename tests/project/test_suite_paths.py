"""The suite runs from any working directory: every data file a test reads is found from the
test's own file, never from the current directory."""
import ast
import glob
import os

from ladder.sides import fixtures
from tests import paths
from tests.captures import FIXTURE



def test_the_committed_fixture_loads_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert os.path.isabs(FIXTURE)
    fx = fixtures.load(FIXTURE)
    assert len(fx.ladder) > 0


def _path_literals(tree):
    """String constants that are not docstrings."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for n in ast.walk(tree):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n


def test_no_test_names_a_data_file_relative_to_the_working_directory():
    bad = []
    for path in sorted(glob.glob(os.path.join(paths.TESTS, "**", "*.py"), recursive=True)):
        if os.path.samefile(path, __file__):          # the patterns below are not paths
            continue
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for n in _path_literals(tree):
            if n.value.startswith(("tests/fixtures", "fixtures/")) or n.value == "tests":
                bad.append(f"{os.path.relpath(path, paths.TESTS)}:{n.lineno}: {n.value!r}")
    assert not bad, "cwd-relative data paths (resolve them from __file__):\n" + "\n".join(bad)
