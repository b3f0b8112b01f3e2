"""Hostile tolerance-rule files: numbers out of range, patterns too many or too long, a
rule set that lacks the arbiter or leaves a point uncovered. Refused at load, naming the field.
"""
import json
import pytest
from ladder.engine.rules import DEFAULT_RULES, RulesError, UncoveredPointError, load_rules


@pytest.mark.parametrize("text, msg", [
    ('{"rules": {"*": ' + "1" + "0" * 30 + "}}", r"rtol=1000000000000000000000000000000 must "
                                                r"be a finite number in 0\.\.1000"),
    ('{"rules": {"*": 1e308}}', r"rtol=1e\+308 must be a finite number in 0\.\.1000"),
    ('{"rules": {"*": 1e999}}', r"overflows a float64"),
    ('{"rules": {"*": {"rtol": 1e-5, "atol": 1e300}}}', r"atol=1e\+300"),
    ('{"rules": {"*": 1e-5}, "logits": {"topk": 1e3}}', r"topk=1000\.0 must be an integer"),
    ('{"rules": {"*": 1e-5}, "rel_floor": 2}', r"rel_floor=2 must be a finite number in 0\.\.1"),
    ('{"rules": {"*": 1e-5}, "logits": {"tie_factor": NaN}}', r"NaN is not a JSON number"),
    ('{"rules": {"port/*": 1e-5}}', r"no rule covers every arbiter/ point"),
    ('{"rules": {"port/L*": 1e-5, "arbiter/*": 1e-5}}', r"no rule covers every port/ point"),
])
def test_rules_numbers_in_range_and_every_point_covered(tmp_path, text, msg):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(RulesError, match=msg):
        load_rules(path)


def test_default_rules_minus_arbiter_are_refused_at_load(tmp_path):
    d = DEFAULT_RULES.to_dict()
    d["rules"] = [r for r in d["rules"] if not r["pattern"].startswith("arbiter/")]
    (tmp_path / "r.json").write_text(json.dumps(d))
    with pytest.raises(RulesError, match="no rule covers every arbiter/ point"):
        load_rules(tmp_path / "r.json")
    # A programmatic set with a gap still fails as a RulesError (exit 2), not a bare KeyError.
    with pytest.raises(UncoveredPointError, match="no tolerance rule matches 'arbiter/logits'"):
        DEFAULT_RULES.__class__(rules={"port/*": DEFAULT_RULES.rules["port/*"]}) \
            .for_point("arbiter/logits")


@pytest.mark.parametrize("rules, msg", [
    ([{"pattern": f"port/p{i}", "rtol": 1e-3} for i in range(600)] + [{"pattern": "*",
                                                                      "rtol": 1e-3}],
     r"field 'rules' has 601 rules, over the limit 512"),
    ([{"pattern": "*" + "a*" * 5000, "rtol": 1e-3}, {"pattern": "*", "rtol": 1e-3}],
     r"rules\[0\]: field pattern of 10001 characters \('\*a\*a.*exceeds the limit 256"),
])
def test_rules_pattern_count_and_length_are_bounded(tmp_path, rules, msg):
    from ladder.engine.rules import RulesError, load_rules
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"rules": rules}))
    with pytest.raises(RulesError, match=msg):
        load_rules(path)


# ---------------------------------------------------------------- rules-file bounds
def _rules_file(tmp_path, rules, **extra):
    import json
    p = tmp_path / "rules.json"
    p.write_text(json.dumps(dict({"rules": rules}, **extra)))
    return p


def test_rules_file_counts_and_pattern_length_at_the_limit_and_one_past(tmp_path):
    from ladder.engine.rules import MAX_PATTERN, MAX_RULES, RulesError, load_rules
    catch = [{"pattern": "*", "rtol": 1e-5}]
    many = [{"pattern": f"port/p{i}", "rtol": 1e-5} for i in range(MAX_RULES - 1)]
    assert len(load_rules(_rules_file(tmp_path, many + catch)).rules) == MAX_RULES
    with pytest.raises(RulesError, match=f"{MAX_RULES + 1}.*{MAX_RULES}|{MAX_RULES}.*"
                                         f"{MAX_RULES + 1}"):
        load_rules(_rules_file(tmp_path, many + [{"pattern": "port/x", "rtol": 1e-5}] + catch))
    long = "port/" + "a" * (MAX_PATTERN - 5)
    assert len(long) == MAX_PATTERN
    load_rules(_rules_file(tmp_path, [{"pattern": long, "rtol": 1e-5}] + catch))
    with pytest.raises(RulesError, match=f"exceeds the limit {MAX_PATTERN}"):
        load_rules(_rules_file(tmp_path, [{"pattern": long + "a", "rtol": 1e-5}] + catch))


def test_rule_tolerances_and_topk_at_the_limit_and_one_past():
    from ladder.engine.rules import MAX_TOLERANCE, LogitsRule, Rule, RulesError
    Rule(MAX_TOLERANCE, atol=MAX_TOLERANCE, floor=MAX_TOLERANCE)
    for field in ("rtol", "atol", "floor"):
        kw = dict(rtol=1e-5)
        kw[field] = MAX_TOLERANCE * (1 + 1e-12)
        with pytest.raises(RulesError, match=f"field {field}="):
            Rule(**kw)
        kw[field] = -1e-300 if field != "rtol" else -1e-300
        with pytest.raises(RulesError, match=f"field {field}="):
            Rule(**kw)
    LogitsRule(topk=1 << 20, tie_factor=MAX_TOLERANCE)
    LogitsRule(topk=1)
    for kw in (dict(topk=(1 << 20) + 1), dict(topk=0), dict(tie_factor=MAX_TOLERANCE * 1.001)):
        with pytest.raises(RulesError):
            LogitsRule(**kw)
