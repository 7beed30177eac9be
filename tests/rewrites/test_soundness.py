"""Every rule is sound: for each of its cases, the e-graph's alternatives for the left side agree
with it on inputs holding inf, NaN, +-0, subnormals and large magnitudes, by the rule's class."""
import pytest

from lumc.rewrites.schedule import all_rules

from soundness import check_rule_case

RULES = all_rules()


@pytest.mark.parametrize("rule", RULES, ids=[r.name for r in RULES])
def test_rule_is_sound(rule):
    assert rule.cases, f"{rule.name} has no soundness case"
    fired = 0
    for k, case in enumerate(rule.cases):
        res = check_rule_case(rule, case, seed=k)
        fired += res["matches"]
        assert res["checked"] >= 1
    assert fired > 0, f"{rule.name} never fired on its own cases (its pattern is wrong)"


def test_every_rule_is_named_and_classed():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)), "duplicate rule names"
    for r in RULES:
        assert r.ruleset in ("algebra", "views", "kernels", "layout")
        assert r.numerics in ("exact", "reassociating", "domain")
        assert ": " in r.name and r.name.startswith(r.ruleset + "/")
    assert any(r.numerics == "domain" for r in RULES)
