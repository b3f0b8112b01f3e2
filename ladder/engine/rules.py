"""Tolerance rules as data: every floating-point comparison in the project takes its bound here.

A rule bounds `|a - b| <= max(atol + rtol * scale, floor)`, where `scale` is either each
element's |b| ("elementwise", docs/design.md's rule) or the reference vector's max |b| ("maxabs",
the form the upstream comparison is specified in: 1e-5·max|logits|); `floor` keeps the
allowance of an all-zero reference finite (ZERO_FLOOR). `stat` says which statistic of
the per-element ratio |a - b| / allowance must stay <= 1: "max" (every element) or "p99" (all
but the worst 1%). Bit-exact claims never use a rule; they use torch.equal.

Rules are keyed by point-name patterns (fnmatch, first match wins, so a catch-all pattern is
the default). `RuleSet` bundles them with the logits checks and the relative-error floor, and
round-trips through a small TOML or JSON file (`load_rules`, `dump_rules`).
"""
from __future__ import annotations

import fnmatch
import json
import math
import os
from dataclasses import fields

from ladder.engine.rule import (  # noqa: F401  (the public surface of the rules)
    COMPARED_SIDES, MAX_PATTERN, MAX_RULES, MAX_RULES_FILE, MAX_TOLERANCE, REL_FLOOR, SCALES, STATS,
    V41_SIDES, ZERO_FLOOR, CountBound, LogitsRule, Rule, RuleSet, RulesError,
    UncoveredPointError)
from ladder.engine.rule_tables import (  # noqa: F401
    CACT_RULES, DEFAULT_RULES, KERNEL_RULES, NEEDLE_RS_RULES, OTHER_REFERENCE_RULES, PORT_RULES,
    UPSTREAM_RULES, V41_DEVICE_FLIPS, V41_INDEX_WHY, V41_RULES, V41_RULESET, NOISE_K, NOISE_RULES,
    PORT_NOISE_RULES, UNIT_EPS)


def rule_for(name: str, rules) -> Rule:
    """The rule for `name` in `rules` (a RuleSet or a pattern dict)."""
    if isinstance(rules, RuleSet):
        return rules.for_point(name)
    for pattern, rule in rules.items():
        if fnmatch.fnmatchcase(name, pattern):
            return rule
    raise KeyError(f"no tolerance rule matches {name!r}; patterns: {list(rules)}")


def _build(cls, data, where: str):
    if not isinstance(data, dict):
        raise RulesError(f"{where}: must be a table/object, got {type(data).__name__}")
    known = {f.name for f in fields(cls)}
    extra = sorted(set(data) - known)
    if extra:
        raise RulesError(f"{where}: unknown field {extra[0]!r}; known: {sorted(known)}")
    try:
        return cls(**data)
    except RulesError as e:
        raise RulesError(f"{where}: {e}") from None
    except TypeError as e:            # a required field missing
        raise RulesError(f"{where}: {e}") from None


def rules_from_dict(data, source: str = "<dict>") -> RuleSet:
    """A RuleSet from {"rules": [{"pattern", "rtol", ...}, ...], "logits": {...},
    "rel_floor": x}; "rules" may also map pattern -> fields (order kept)."""
    if not isinstance(data, dict):
        raise RulesError(f"{source}: top level must be a table/object")
    extra = sorted(set(data) - {"rules", "logits", "rel_floor"})
    if extra:
        raise RulesError(f"{source}: unknown field {extra[0]!r}; known: logits, rel_floor, rules")
    raw = data.get("rules")
    if isinstance(raw, dict):
        raw = [{"pattern": p, **(v if isinstance(v, dict) else {"rtol": v})}
               for p, v in raw.items()]
    if not isinstance(raw, list) or not raw:
        raise RulesError(f"{source}: field 'rules' must be a non-empty list of rules")
    if len(raw) > MAX_RULES:        # every point is matched against every pattern in turn
        raise RulesError(f"{source}: field 'rules' has {len(raw)} rules, over the limit "
                         f"{MAX_RULES}")
    rules = {}
    for i, item in enumerate(raw):
        where = f"{source}: rules[{i}]"
        if not isinstance(item, dict) or not isinstance(item.get("pattern"), str):
            raise RulesError(f"{where}: needs a string field 'pattern'")
        if len(item["pattern"]) > MAX_PATTERN:   # fnmatch's work grows with its length
            raise RulesError(f"{where}: field pattern of {len(item['pattern'])} characters "
                             f"({item['pattern'][:40]!r}...) exceeds the limit {MAX_PATTERN}")
        body = {k: v for k, v in item.items() if k != "pattern"}
        if item["pattern"] in rules:
            raise RulesError(f"{where}: pattern {item['pattern']!r} repeats an earlier rule")
        rules[item["pattern"]] = _build(Rule, body, f"{where} ({item['pattern']})")
    logits = _build(LogitsRule, data.get("logits", {}), f"{source}: logits")
    floor = data.get("rel_floor", REL_FLOOR)
    try:
        return RuleSet(rules=rules, logits=logits, rel_floor=floor, source=source)
    except RulesError as e:
        raise RulesError(f"{source}: {e}") from None


def load_rules(path, sides=COMPARED_SIDES) -> RuleSet:
    """Read a rules file: .toml (Python 3.11+'s tomllib) or .json, a regular file of at most
    MAX_RULES_FILE bytes, parsed with bounded nesting; every side in `sides` (the point-name
    prefixes the model's comparisons use) must be covered."""
    from bounded.io import parse_json, parse_toml, read_capped
    path = os.fspath(path)
    if not path.endswith((".toml", ".json")):
        raise RulesError(f"{path}: rules file must end in .toml or .json")
    raw = read_capped(path, MAX_RULES_FILE, RulesError, "rules file")
    if path.endswith(".toml"):
        data = parse_toml(raw, path, RulesError)
    else:
        data = parse_json(raw, path, RulesError)
    rs = rules_from_dict(data, path)
    rs.check_covers(sides)
    return rs


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)      # a JSON string is a valid TOML basic string
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
    return str(v)


def dump_rules(ruleset: RuleSet, fmt: str = "toml") -> str:
    """The rule set as a TOML or JSON document that load_rules reads back unchanged."""
    d = ruleset.to_dict()
    if fmt == "json":
        return json.dumps(d, indent=2) + "\n"
    if fmt != "toml":
        raise RulesError(f"format {fmt!r} must be 'toml' or 'json'")
    out = [f"rel_floor = {_toml_value(d['rel_floor'])}", "", "[logits]"]
    out += [f"{k} = {_toml_value(v)}" for k, v in d["logits"].items()]
    for r in d["rules"]:
        out += ["", "[[rules]]"] + [f"{k} = {_toml_value(v)}" for k, v in r.items()]
    return "\n".join(out) + "\n"
