"""A backend file's ``requested_by_name:``: a query naming the backend is rejected with the stated
reason, before its table; the default decision's ``use:`` still reaches the table.

This is how a rule set states a host that builds a class as a platform's default but refuses its
name (vLLM 0.33's ``CPU_V4_MLA_SPARSE``): ``rules/compat/vllm-0.33/cpu.yaml`` uses it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from test_compiled_form import assert_table_equals_resolution

import dsv4sel
from dsv4sel import SelectionError
from dsv4sel.api import verify
from dsv4sel.dsv4.profile import PROFILE
from dsv4sel.engine.build import build_program
from dsv4sel.engine.sources import expand
from dsv4sel.errors import RuleError
from dsv4sel.tools.explain import explain

#: ``pack/``: a vocabulary, a default decision (cpu to C, the rest to G), C's table behind a
#: ``requested_by_name:`` gate and G's; ``gate_with_*/``: C's file with a gate that does more
RULES = Path(__file__).with_name("rules") / "requested_by_name"
C = (RULES / "pack" / "c.yaml").read_text()


def _line(text: str, needle: str) -> int:
    return next(i for i, t in enumerate(text.splitlines(), 1) if needle in t)


@pytest.fixture
def pack(write_rules):
    return write_rules(RULES / "pack")


def test_the_default_decision_reaches_the_table_but_the_name_is_rejected(pack):
    rules = dsv4sel.load_rules([pack])
    chosen = dsv4sel.select(platform="cpu", model="m", rules=rules)
    assert (chosen.backend, chosen.rule.id) == ("C", "c-auto")
    with pytest.raises(SelectionError) as caught:
        dsv4sel.select(platform="cpu", backend="C", model="m", rules=rules)
    assert caught.value.rule.id == "c-named"
    assert "C is the cpu default, never named; pass no --attention-backend" in str(caught.value)  # filled in


def test_explain_shows_the_reason_where_it_is_written_and_suggests_no_backend(pack):
    rules = dsv4sel.load_rules([pack])
    ex = explain(rules, platform="cpu", backend="C", model="m")
    assert not ex.ok and ex.rejection.reason == "C is the cpu default, never named; pass no --attention-backend"
    assert [s.rule.id for s in ex.path] == ["c-named"]
    assert ex.rejection.rule.location == f"rules/c.yaml:{_line(C, 'id: c-named')}"
    assert ex.alternatives and ex.alternatives[0].backend is None
    assert ex.alternatives[0].selection.backend == "C"
    # named, C serves nothing anywhere: the backend is what to change, and no alternative names it
    assert ex.rejection.blocked_by == "backend"
    assert rules.selectable_backends == ("G",)
    assert all(a.backend != "C" for a in ex.alternatives)


def test_check_proves_every_input_decided_and_the_array_equals_resolution(pack):
    report = verify([pack])
    assert [f for f in report.findings if f.severity == "error"] == []
    assert report.coverage.totals.undecided == 0
    named = next(r for r in report.coverage.rules if r.rule.id == "c-named")
    assert named.inputs == 3 * 2  # every (platform, capability) x kv dtype, named C
    program = build_program(expand(pack), dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES, PROFILE)
    assert assert_table_equals_resolution(program) == 3 * 2 * 3


@pytest.mark.parametrize("where", ["when", "select"])
def test_the_gate_only_rejects_and_tests_nothing(write_rules, where):
    with pytest.raises(RuleError) as caught:
        dsv4sel.load_rules([write_rules(RULES / "pack", RULES / f"gate_with_{where}")])
    # the schema refuses the gate's extra key, at that key (line 4, under requested_by_name:)
    assert [(p.code, str(p.loc)) for p in caught.value.problems] == [("DSV203", "rules/c.yaml:4:3")], caught.value
