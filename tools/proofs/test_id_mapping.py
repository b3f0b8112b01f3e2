"""Proof that a reorganisation of tests/ lost, added or changed no test: the collected test IDs
and outcomes of two runs (pytest's JUnit XML), mapped one to one through the record of where
each test file, or each test of a split file, went.

    python -m pytest -q -n 2 --junitxml=/tmp/before.xml     # on the old tree
    python -m pytest -q -n 2 --junitxml=/tmp/after.xml      # on the new tree
    python tools/proofs/test_id_mapping.py /tmp/before.xml /tmp/after.xml \
        [--moves tools/proofs/test_moves.json] [--print] [--allow-new]

The moves file maps an old file name to {"*": new path} (moved whole) or to {test: new path}
(split by test). A test keeps its name, so an old ID maps to the same name in its new file; a
parametrised ID whose parameter text changed with the move (a module path inside it) is paired
by position among that test's cases. Exit 0 when every old ID maps to exactly one new ID, none is
left over on either side, and each pair has the same outcome (passed, failed, skipped, error).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))


def outcomes(path: str) -> dict[tuple[str, str], str]:
    """{(test file, test name with its parameters): outcome} of a JUnit file."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        # classname: tests.<dirs>.<module>[.<Class>]; the module is the last part named test_*
        idx = max(i for i, p in enumerate(parts) if p.startswith("test_"))
        rel = "/".join(parts[:idx + 1]) + ".py"
        name = ".".join(parts[idx + 1:] + [case.get("name")])
        kind = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = {"failure": "failed"}.get(child.tag, child.tag)
        out[(rel, name)] = kind
    return out


def new_file(moves: dict, rel: str, name: str) -> str | None:
    entry = moves.get(rel)
    if entry is None:
        return None
    if "*" in entry:
        return entry["*"]
    return entry.get(name.split("[")[0].split(".")[-1])


def mapping(before: dict, after: dict, moves: dict):
    """[(old id, new id or None, old outcome, new outcome or None)], and the new IDs left over."""
    pairs, used = [], set()
    pending = collections.defaultdict(list)              # (new file, base name) -> old ids
    for (rel, name), kind in sorted(before.items()):
        target = new_file(moves, rel, name) or rel
        if (target, name) in after:
            pairs.append(((rel, name), (target, name), kind, after[(target, name)]))
            used.add((target, name))
        else:
            pending[(target, name.split("[")[0])].append(((rel, name), kind))
    left = collections.defaultdict(list)
    for (rel, name) in sorted(after):
        if (rel, name) not in used:
            left[(rel, name.split("[")[0])].append((rel, name))
    for key, olds in pending.items():
        news = left.pop(key, [])
        for i, (old, kind) in enumerate(olds):
            new = news[i] if i < len(news) else None
            pairs.append((old, new, kind, after.get(new) if new else None))
        if len(news) > len(olds):
            left[key] = news[len(olds):]
    return pairs, [n for ns in left.values() for n in ns]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--moves", default=os.path.join(HERE, "test_moves.json"))
    ap.add_argument("--print", action="store_true", help="print every old -> new pair")
    ap.add_argument("--allow-new", action="store_true",
                    help="tests added beside the move are listed but do not fail the proof")
    a = ap.parse_args(argv)
    with open(a.moves, encoding="utf-8") as f:
        moves = json.load(f)
    before, after = outcomes(a.before), outcomes(a.after)
    pairs, extra = mapping(before, after, moves)
    lost = [p for p in pairs if p[1] is None]
    changed = [p for p in pairs if p[1] is not None and p[2] != p[3]]
    if a.print:
        for old, new, k1, k2 in pairs:
            print(f"{old[0]}::{old[1]} -> "
                  + (f"{new[0]}::{new[1]}" if new else "LOST") + f"  {k1}"
                  + (f" -> {k2}" if k2 and k2 != k1 else ""))
    counts = collections.Counter(before.values()), collections.Counter(after.values())
    print(f"before: {len(before)} tests {dict(sorted(counts[0].items()))}")
    print(f"after:  {len(after)} tests {dict(sorted(counts[1].items()))}")
    print(f"mapped one to one: {len(pairs) - len(lost)}; lost: {len(lost)}; new, unmapped: "
          f"{len(extra)}; outcome changed: {len(changed)}")
    renamed = sum(1 for old, new, *_ in pairs if new and old[1] != new[1])
    print(f"pairs whose parameter text changed with the move (paired by position): {renamed}")
    for old, *_ in lost:
        print(f"  lost: {old[0]}::{old[1]}")
    for new in extra:
        print(f"  unmapped: {new[0]}::{new[1]}")
    for old, new, k1, k2 in changed:
        print(f"  changed: {old[0]}::{old[1]} {k1} -> {new[0]}::{new[1]} {k2}")
    return 0 if not (lost or changed or extra and not a.allow_new) else 1


if __name__ == "__main__":
    sys.exit(main())
