"""REFERENCE_RULES: the rules the reference is judged by (against upstream, against float64,
against itself). The reference's own self-check bounds (reference/self_checks.py) join the
tables of ladder/engine/rule_tables.py here, on the sides, because the reference imports nothing
from the harness and the engine imports nothing from the reference: the bounds are stated once,
in reference/, and taken over unchanged.
"""
from __future__ import annotations

from reference.self_checks import SELF_CHECKS, max_rel  # noqa: F401  (re-exported)
from ladder.engine.rules import rule_for as engine_rule_for
from ladder.engine.rule import Rule
from ladder.engine.rule_tables import OTHER_REFERENCE_RULES, UPSTREAM_RULES

REFERENCE_RULES = {**UPSTREAM_RULES,
                   **{name: Rule(bound, why=why) for name, (bound, why) in SELF_CHECKS.items()},
                   **OTHER_REFERENCE_RULES}


def rule_for(name: str, rules=None) -> Rule:
    """The rule for `name` in `rules` (a RuleSet or a pattern dict; default REFERENCE_RULES)."""
    return engine_rule_for(name, REFERENCE_RULES if rules is None else rules)
