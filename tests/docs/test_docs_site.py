"""The docs/ site and the README that points into it: the MkDocs site builds strictly (every
link between pages and every #anchor resolves, every page is in the nav), every repository path
the README or a page names in backticks exists (a moved or renamed file fails here, not in a
reader's shell), and the README stays a front door of at most README_MAX_LINES lines."""
from tests import paths
import os
import re
import subprocess
import sys

import pytest

ROOT = paths.ROOT
DOCS = os.path.join(ROOT, "docs")
README_MAX_LINES = 250

# A backticked path is checked when its first component is one of the repository's own
# top-level directories (so `inference/model.py`, DeepSeek's file, or `sweep-tiny/report.md`,
# a directory a command writes, are not) and it names a file of these kinds or a directory.
TOP = ("bounded", "reference", "port", "kernels", "ladder", "tools", "test" + "s", "docs", ".ci")
FILE_ENDINGS = (".py", ".toml", ".sh", ".c", ".h", ".md", ".yml", ".json", ".safetensors")


def _pages():
    """Every .md file under docs/, relative to docs/ with '/' separators."""
    out = []
    for base, _, files in os.walk(DOCS):
        for f in files:
            if f.endswith(".md"):
                out.append(os.path.relpath(os.path.join(base, f), DOCS).replace(os.sep, "/"))
    return sorted(out)


def _texts():
    """(name, text) of README.md and every docs page."""
    yield "README.md", open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    for page in _pages():
        yield f"docs/{page}", open(os.path.join(DOCS, page), encoding="utf-8").read()


def _inline_code(text):
    """The inline code spans of a markdown text (a span may wrap a line), fenced blocks left
    out."""
    prose = re.sub(r"^```.*?^```[ \t]*$", "", text, flags=re.S | re.M)
    return re.findall(r"`([^`]+)`", prose)


def _repo_path(span):
    """The repository path a code span names, or None when it names none."""
    span = span.strip().split("::")[0]            # tests/test_x.py::test_name
    if not re.fullmatch(r"[\w.\-/]+", span) or "/" not in span:
        return None                               # spaces, wildcards, {fields}, <ids>, $VARS
    if span.split("/")[0] not in TOP:
        return None
    if span.endswith("/") or span.endswith(FILE_ENDINGS):
        return span
    return None


def _nav_pages(nav):
    """Every page a mkdocs nav lists (nested sections included), in order."""
    out = []
    for item in nav:
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            for value in item.values():
                out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def _config():
    import yaml
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_the_site_builds_strictly(tmp_path):
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "--config-file", os.path.join(ROOT, "mkdocs.yml"),
                          "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    print(res.stdout + res.stderr)
    assert res.returncode == 0, f"mkdocs build --strict failed:\n{res.stdout}{res.stderr}"
    assert (tmp_path / "site" / "index.html").is_file()


def test_the_strict_build_refuses_a_broken_anchor(tmp_path):
    """The validation settings are what makes a broken link fail: a copy of the site with one
    link to a missing anchor must not build."""
    import shutil
    site = tmp_path / "src"
    shutil.copytree(DOCS, site / "docs")
    shutil.copy(os.path.join(ROOT, "mkdocs.yml"), site / "mkdocs.yml")
    with open(site / "docs" / "index.md", "a", encoding="utf-8") as f:
        f.write("\n[broken](cli.md#no-such-heading)\n")
    res = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict",
                          "--site-dir", str(tmp_path / "site")],
                         cwd=site, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0, res.stdout + res.stderr
    assert "no-such-heading" in res.stdout + res.stderr


def test_every_page_is_in_the_nav_and_every_nav_entry_is_a_page():
    cfg = _config()
    assert cfg.get("docs_dir", "docs") == "docs"
    listed = _nav_pages(cfg["nav"])
    assert len(listed) == len(set(listed)), f"pages listed twice: {listed}"
    pages = _pages()
    assert sorted(listed) == pages, (
        f"in docs/ but not in the nav: {sorted(set(pages) - set(listed))}; "
        f"in the nav but not in docs/: {sorted(set(listed) - set(pages))}")


def test_every_backticked_repository_path_exists():
    missing = []
    for name, text in _texts():
        for span in _inline_code(text):
            path = _repo_path(span)
            if path and not os.path.exists(os.path.join(ROOT, path)):
                missing.append(f"{name}: `{span}`")
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(
        sorted(set(missing)))


def test_the_path_check_sees_paths_and_only_paths():
    assert _repo_path("ladder/engine/rules.py") == "ladder/engine/rules.py"
    assert _repo_path("ladder/engine/") == "ladder/engine/"
    assert _repo_path("tests/test_x.py::test_y") == "tests/test_x.py"
    assert _repo_path("docs/sweep-tiny.toml") == "docs/sweep-tiny.toml"
    for not_a_path in ("port/L*.hres", "decode03/L07.y", "{step}/{point}", "inference/model.py",
                       os.path.join("test" + "s", "fixtures", "v2_forward_vectors.*"), "python -m ladder run",
                       "sweep-tiny/report.md", "v41_official/*", "rules.py"):
        assert _repo_path(not_a_path) is None, not_a_path
    assert _inline_code("a `ladder/x.py` b\n```bash\nls `tools/y.py`\n```\n") == ["ladder/x.py"]
    assert _inline_code("`python\ntools/y.py` and `ladder/z.py`")[1] == "ladder/z.py"


def test_readme_links_resolve():
    """The README is not a page of the site, so the build does not check its links: every
    relative link must name a file of the checkout, and an #anchor a heading of that page."""
    import markdown
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links, "README links nowhere"
    for link in links:
        assert not re.match(r"[a-z]+://|/", link), f"README link {link}: make it relative"
        path, _, anchor = link.partition("#")
        full = os.path.join(ROOT, path)
        assert os.path.isfile(full), f"README links to {path}, which does not exist"
        if anchor:
            md = markdown.Markdown(extensions=["toc"])
            md.convert(open(full, encoding="utf-8").read())

            def ids(tokens):
                for t in tokens:
                    yield t["id"]
                    yield from ids(t["children"])
            assert anchor in set(ids(md.toc_tokens)), f"README link {link}: no such heading"


def test_readme_is_a_front_door():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, over {README_MAX_LINES}: move the detail into a "
        f"docs/ page and link it")
    heads = [ln for ln in lines if ln.startswith("## ")]
    assert heads and heads[0] == "## Quickstart", heads


@pytest.mark.parametrize("page", ["sweep-tiny.toml", "sweep-ci-matrix.yml", "sweep-slurm.sh"])
def test_the_sweep_examples_stay_in_docs(page):
    # tests and tools read them where they are; the site copies them beside the pages
    assert os.path.isfile(os.path.join(DOCS, page))


def test_the_tools_index_names_every_tool_at_its_path():
    """tools/README.md lists every script of tools/ under its folder, and names none that is
    not there; no script lies loose in tools/ but the GPU entry point."""
    tools = os.path.join(ROOT, "tools")
    text = open(os.path.join(tools, "README.md"), encoding="utf-8").read()
    listed, folder = set(), None
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") \
            else []
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        if cells[0].startswith("`"):
            folder = cells[0].strip("`").rstrip("/")
        elif cells[0] == "(here)":
            folder = ""
        listed.add(os.path.join(folder, cells[1].strip("`")))
    present = {os.path.relpath(os.path.join(d, f), tools) for d, _, fs in os.walk(tools)
               for f in fs if f.endswith((".py", ".sh"))}
    assert listed == present, (sorted(listed - present), sorted(present - listed))
    loose = sorted(p for p in present if os.sep not in p)
    assert loose == ["device_check.sh"], loose
