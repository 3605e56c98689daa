"""The families' defaults as data (variants/defaults.py): what a condition tests, how a table of
rules applies, that every bounded rule decides exactly at its threshold, and that each family's
docs page shows its table as the code has it."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from tuner.problem import Problem
from variants import load_family
from variants.defaults import Rule, When, apply_rules, markdown_table
from variants.mma_sync import defaults as mma_sync_defaults
from variants.wgmma import defaults as wgmma_defaults

REPO = Path(__file__).resolve().parents[1]
TABLES = {"wgmma": wgmma_defaults.RULES, "mma_sync": mma_sync_defaults.RULES}
ARCH = {"wgmma": "sm_90a", "mma_sync": "sm_120a"}


def _problem(head_dim=128, causal=False, keys=4096, queries=None):
    return Problem(1, 8, keys if queries is None else queries, head_dim, causal, seq_len_kv=keys)


def test_a_condition_tests_only_what_it_names_with_inclusive_key_bounds():
    assert When().holds(_problem()) and When().holds(None)
    assert When(head_dim=64).holds(_problem(head_dim=64))
    assert not When(head_dim=64).holds(_problem(head_dim=128))
    assert When(causal=True).holds(_problem(causal=True))
    assert not When(causal=True).holds(_problem(causal=False))
    assert When(max_keys=1024).holds(_problem(keys=1024))
    assert not When(max_keys=1024).holds(_problem(keys=1025))
    assert When(min_keys=1025).holds(_problem(keys=1025))
    assert not When(min_keys=1025).holds(_problem(keys=1024))
    # The key bounds are on the key length, not the query length, and the query floor the other
    # way round.
    assert When(max_keys=1024).holds(Problem(1, 8, 8192, seq_len_kv=1000))
    assert When(min_queries=8192).holds(_problem(keys=512, queries=8192))
    assert not When(min_queries=8192).holds(_problem(keys=30272, queries=8191))


def test_without_a_problem_a_condition_sees_head_dim_128_no_mask_and_no_length():
    assert When(head_dim=128, causal=False).holds(None)
    assert not When(head_dim=64).holds(None)
    assert not When(causal=True).holds(None)
    assert not When(max_keys=2**30).holds(None)
    assert not When(min_keys=1).holds(None)
    assert not When(min_queries=1).holds(None)


def test_every_rule_that_holds_applies_in_order_later_knobs_winning():
    rules = (Rule(When(), {"a": 1, "b": 1}), Rule(When(causal=True), {"b": 2, "c": 2}),
             Rule(When(max_keys=100), {"c": 3}))
    assert apply_rules(rules, _problem(causal=False, keys=4096)) == {"a": 1, "b": 1}
    assert apply_rules(rules, _problem(causal=True, keys=4096)) == {"a": 1, "b": 2, "c": 2}
    assert apply_rules(rules, _problem(causal=True, keys=100)) == {"a": 1, "b": 2, "c": 3}


@pytest.mark.parametrize("family", sorted(TABLES))
def test_the_first_rule_holds_always_and_builds_a_feasible_config(family):
    rules = TABLES[family]
    fam = load_family(family)
    assert rules[0].when == When()
    first = fam.Config(**rules[0].knobs)
    assert set(rules[0].knobs) <= {f.name for f in dataclasses.fields(first)}
    assert fam.default(ARCH[family]) == fam.Config(**apply_rules(rules, None))


@pytest.mark.parametrize("family", sorted(TABLES))
def test_every_rule_names_knobs_says_why_and_links_its_docs_section(family):
    fam = load_family(family)
    knobs = {f.name for f in dataclasses.fields(fam.Config)}
    for rule in TABLES[family]:
        assert rule.knobs and set(rule.knobs) <= knobs, rule
        assert rule.why and "\n" not in rule.why, rule
        page, _, anchor = rule.docs.partition("#")
        text = (REPO / page).read_text()
        assert anchor and re.search(rf"^#+ {anchor}\b", text, re.I | re.M), rule.docs


def _bounded(rules):
    """(index, rule, problem at its key bound, problem one key past it) of each bounded rule,
    the problem matching the rule's other conditions."""
    for i, rule in enumerate(rules):
        w = rule.when
        kw = dict(head_dim=w.head_dim or 128, causal=bool(w.causal))
        # At a key bound the queries match it (so a query floor holds), and the other way round.
        for at, past in ((w.max_keys, None if w.max_keys is None else w.max_keys + 1),
                         (w.min_keys, None if w.min_keys is None else w.min_keys - 1)):
            if at is not None:
                queries = max(at, w.min_queries or 0)
                yield i, rule, _problem(keys=at, queries=queries, **kw), \
                    _problem(keys=past, queries=queries, **kw)
        if w.min_queries is not None:
            keys = max(w.min_queries, w.min_keys or 0)
            yield i, rule, _problem(keys=keys, queries=w.min_queries, **kw), \
                _problem(keys=keys, queries=w.min_queries - 1, **kw)


@pytest.mark.parametrize("family", sorted(TABLES))
def test_each_bounded_rule_decides_the_default_exactly_at_its_threshold(family):
    """At its bound the rule changes the default (it is not shadowed by the rules after it),
    one key past it the default is the one the table gives without the rule."""
    rules = TABLES[family]
    fam = load_family(family)
    seen = 0
    for i, rule, at, past in _bounded(rules):
        without = rules[:i] + rules[i + 1:]
        default_at = fam.default(ARCH[family], at)
        assert default_at == fam.Config(**apply_rules(rules, at))
        assert default_at != fam.Config(**apply_rules(without, at)), rule.when
        assert fam.default(ARCH[family], past) == fam.Config(**apply_rules(without, past)), \
            rule.when
        seen += 1
    assert seen == sum((r.when.min_keys is not None) + (r.when.max_keys is not None)
                       + (r.when.min_queries is not None) for r in rules)


@pytest.mark.parametrize("family", sorted(TABLES))
def test_the_docs_page_shows_the_table_the_code_applies(family):
    text = (REPO / "docs" / f"family-{family}.md").read_text()
    found = re.search(r"<!-- defaults-table[^>]*-->\n(.*?)\n<!-- end defaults-table -->", text,
                      re.S)
    assert found, "the defaults table markers are missing"
    assert found.group(1) == markdown_table(TABLES[family]), (
        "docs table out of date: paste variants.defaults.markdown_table(RULES)")


@pytest.mark.parametrize("family", sorted(TABLES))
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("keys", [1, 1024, 1025, 4608, 4609, 8192, 8193, 16383, 16384, 30272])
def test_every_default_is_feasible(family, head_dim, causal, keys):
    from tuner.gpus import PROFILES

    gpu = PROFILES["h200" if family == "wgmma" else "5080"]
    problem = _problem(head_dim, causal, keys)
    fam = load_family(family)
    assert fam.can_implement(fam.default(gpu.arch, problem), problem, gpu) == (True, None)


@pytest.mark.parametrize("family", ["wgmma", "mma_sync"])
@pytest.mark.parametrize("head_dim, causal, keys", [(128, False, 4096), (64, True, 1024),
                                                    (128, True, 30272)])
def test_the_defaults_accurate_twin_turns_both_transforms_on_and_can_run(family, head_dim,
                                                                          causal, keys):
    """The search's baseline where the default is over the accuracy budget
    (tuner/search/proposal.py): the same kernel with prepare's transforms on, feasible."""
    from tuner import gpus

    module = load_family(family)
    problem = _problem(head_dim, causal, keys)
    gpu = gpus.PROFILES["h100" if family == "wgmma" else "5090"]
    plain = module.default(ARCH[family], problem)
    twin = plain.with_transforms()
    assert twin == dataclasses.replace(plain, k_smoothing="mean", qk_rotation="hadamard", **(
        {"q_quant": "prepare"} if family == "wgmma" else {}))
    assert module.can_implement(twin, problem, gpu) == (True, None)
