import json

import pytest
import torch
from hypothesis import given, strategies as st

from ladder.engine.rules import DEFAULT_RULES, PORT_RULES, LogitsRule, Rule, RuleSet, RulesError, dump_rules, load_rules, rules_from_dict
from ladder.sides.reference_rules import REFERENCE_RULES, rule_for


@given(st.integers(1, 4), st.integers(1, 40), st.sampled_from(["maxabs", "elementwise"]),
       st.sampled_from(["max", "p99"]), st.floats(0, 1e-3, allow_subnormal=False),
       st.integers(0, 2**31 - 1))
def test_position_errors_equal_the_rule_on_each_slice(S, n, scale, stat, atol, seed):
    g = torch.Generator().manual_seed(seed)
    b = torch.randn(S, n, generator=g)
    a = b + 1e-4 * torch.randn(S, n, generator=g)
    a[0, 0] = b[0, 0]                               # exact zeros in the ratios too
    rule = Rule(1e-4, atol=atol, scale=scale, stat=stat)
    assert rule.position_errors(a, b) == [rule.error(a[j], b[j]) for j in range(S)]


def test_a_nonfinite_slice_is_inf_only_in_its_own_position():
    b = torch.ones(3, 5)
    a = b.clone()
    a[1, 2] = float("nan")
    errs = Rule(1e-5).position_errors(a, b)
    assert errs[0] == errs[2] == 0.0 and errs[1] == float("inf")


def test_p99_forgives_one_percent_and_no_more():
    b = torch.ones(1000)
    a = b.clone()
    a[:5] = 2.0                                     # 0.5% of the elements far off
    p99, mx = Rule(1e-5, stat="p99"), Rule(1e-5)
    assert p99.check(a, b) and not mx.check(a, b)
    a[:20] = 2.0                                    # 2%: the 99th percentile is far off too
    assert not p99.check(a, b)


@pytest.mark.parametrize("kw, msg", [
    (dict(rtol=-1.0), "rtol=-1.0"), (dict(rtol=float("nan")), "rtol=nan"),
    (dict(rtol=1e-5, atol=-2), "atol=-2"), (dict(rtol=1e-5, scale="abs"), "scale='abs'"),
    (dict(rtol=1e-5, stat="p50"), "stat='p50'"), (dict(rtol="1e-5"), "rtol='1e-5'"),
])
def test_rule_fields_are_checked(kw, msg):
    with pytest.raises(RulesError, match=msg.replace("(", r"\(")):
        Rule(**kw)


def test_logits_rule_fields_are_checked():
    with pytest.raises(RulesError, match="topk=0"):
        LogitsRule(topk=0)
    with pytest.raises(RulesError, match="tie_factor=-1"):
        LogitsRule(tie_factor=-1)


def test_existing_names_resolve_to_their_rules():
    assert rule_for("port/logits", PORT_RULES) is PORT_RULES["port/logits"]
    assert rule_for("port/L03.u", PORT_RULES) is PORT_RULES["port/*"]
    assert rule_for("port/L03.hres", PORT_RULES) is PORT_RULES["port/L*.hres"]
    assert rule_for("self/f32_vs_f64") is REFERENCE_RULES["self/f32_vs_f64"]
    assert rule_for("port/L03.u", DEFAULT_RULES) is PORT_RULES["port/*"]
    with pytest.raises(KeyError, match="no tolerance rule matches 'x/y'"):
        rule_for("x/y", PORT_RULES)


def test_first_matching_pattern_wins():
    rs = rules_from_dict({"rules": {"port/L*.q": 1e-3, "port/*": 1e-5}})
    assert rs.for_point("port/L03.q").rtol == 1e-3
    assert rs.for_point("port/logits").rtol == 1e-5
    flipped = rules_from_dict({"rules": {"port/*": 1e-5, "port/L*.q": 1e-3}})
    assert flipped.for_point("port/L03.q").rtol == 1e-5


@pytest.mark.parametrize("fmt", ["toml", "json"])
def test_rules_round_trip_through_a_file(tmp_path, fmt):
    custom = RuleSet(rules={"port/L*.q": Rule(1e-3, atol=1e-7, scale="elementwise", stat="p99",
                                              why='a "quoted" reason, with unicode ·'),
                            **DEFAULT_RULES.rules},
                     logits=LogitsRule(topk=3, tie_factor=4.0), rel_floor=1e-4)
    path = tmp_path / f"rules.{fmt}"
    path.write_text(dump_rules(custom, fmt), encoding="utf-8")
    back = load_rules(path)
    assert back.rules == custom.rules and list(back.rules) == list(custom.rules)
    assert back.logits == custom.logits and back.rel_floor == custom.rel_floor
    assert back.source == str(path)


@pytest.mark.parametrize("text, msg", [
    ('{"rules": [{"pattern": "*", "rtol": -1}]}', r"rules\[0\] \(\*\): Rule: field rtol=-1"),
    ('{"rules": [{"pattern": "*", "rtoll": 1}]}', "unknown field 'rtoll'"),
    ('{"rules": [{"rtol": 1}]}', r"rules\[0\]: needs a string field 'pattern'"),
    ('{"rules": [{"pattern": "*"}]}', r"rules\[0\] \(\*\).*rtol"),
    ('{"rules": []}', "field 'rules' must be a non-empty list"),
    ('{"rules": [{"pattern": "*", "rtol": 1}, {"pattern": "*", "rtol": 2}]}', "repeats"),
    ('{"rules": {"*": 1e-5}, "logits": {"topk": 0}}', "logits: LogitsRule: field topk=0"),
    ('{"rules": {"*": 1e-5}, "rel_floor": -1}', "rel_floor=-1"),
    ('{"rules": {"*": 1e-5}, "extra": 1}', "unknown field 'extra'"),
    ('{"rules": ', "malformed JSON"),
])
def test_malformed_rules_files_name_the_field(tmp_path, text, msg):
    path = tmp_path / "r.json"
    path.write_text(text)
    with pytest.raises(RulesError, match=msg):
        load_rules(path)


def test_rules_file_kinds(tmp_path):
    (tmp_path / "r.yaml").write_text("rules: {}")
    with pytest.raises(RulesError, match="must end in .toml or .json"):
        load_rules(tmp_path / "r.yaml")
    (tmp_path / "r.toml").write_text("[[rules]\n")
    with pytest.raises(RulesError, match="malformed TOML"):
        load_rules(tmp_path / "r.toml")
    (tmp_path / "big.json").write_bytes(b" " * (1024 * 1024 + 1))
    with pytest.raises(RulesError, match="exceeds the rules file limit"):
        load_rules(tmp_path / "big.json")


def test_default_rules_are_what_the_dump_says():
    d = json.loads(dump_rules(DEFAULT_RULES, "json"))
    assert [r["pattern"] for r in d["rules"]] == list(DEFAULT_RULES.rules)
    assert all(r["why"] for r in d["rules"])          # every bound gives its reason
