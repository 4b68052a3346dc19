"""A backend file's ``requested_by_name:``: a query naming the backend is rejected with the stated
reason, before its table; the default decision's ``use:`` still reaches the table.

This is how a rule set states a host that builds a class as a platform's default but refuses its
name (vLLM 0.33's ``CPU_V4_MLA_SPARSE``): ``rules/compat/vllm-0.33/cpu.yaml`` uses it.
"""

from __future__ import annotations

import textwrap

import pytest

from _rule_text import BACKEND_HEAD
from test_compiled_form import assert_table_equals_resolution

import dsv4sel
from dsv4sel import SelectionError
from dsv4sel.api import verify
from dsv4sel.dsv4.profile import PROFILE
from dsv4sel.engine.build import build_program
from dsv4sel.engine.sources import expand
from dsv4sel.errors import RuleError
from dsv4sel.tools.explain import explain

VOCAB = textwrap.dedent("""\
    kind: vocabulary
    inputs:
      model: {default: m, values: [m]}
      platform: {values: [cuda, cpu]}
      capability:
        by: platform
        default: unknown
        values: {cuda: ["9.0", unknown], cpu: [unknown]}
      kv_cache_dtype: {default: auto, values: [auto, bfloat16]}
    """)
DEFAULT = textwrap.dedent("""\
    kind: default
    hit_policy: first
    rules:
      - id: d-cpu
        when: {platform: cpu}
        use: C
      - id: d-cuda
        use: G
    """)
GATE = """\
requested_by_name:
  id: c-named
  description: the host builds C as the CPU default only
  reject:
    reason: "{backend} is the {platform} default, never named; pass no --attention-backend"
"""
C = GATE + BACKEND_HEAD.format(name="C") + """\
  - id: c-auto
    when: {platform: cpu, kv_cache_dtype: auto}
    select: {}
  - id: c-other
    reject: {reason: "C stores only fp8_ds_mla"}
"""
G = BACKEND_HEAD.format(name="G") + """\
  - id: g-any
    when: {platform: cuda, kv_cache_dtype: auto}
    select: {}
  - id: g-other
    reject: {reason: "G serves cuda auto only"}
"""


def _line(text: str, needle: str) -> int:
    return next(i for i, t in enumerate(text.splitlines(), 1) if needle in t)


@pytest.fixture
def pack(write_rules):
    return write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULT, "c.yaml": C, "g.yaml": G})


def test_the_default_decision_reaches_the_table_but_the_name_is_rejected(pack):
    rules = dsv4sel.load_rules([pack])
    chosen = dsv4sel.select(platform="cpu", model="m", rules=rules)
    assert (chosen.backend, chosen.rule.id) == ("C", "c-auto")
    with pytest.raises(SelectionError) as caught:
        dsv4sel.select(platform="cpu", backend="C", model="m", rules=rules)
    assert "C is the cpu default, never named; pass no --attention-backend" in str(caught.value)


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


@pytest.mark.parametrize("extra,where", [
    ("  when: {platform: cpu}\n", "when"), ("  select: {}\n", "select")])
def test_the_gate_only_rejects_and_tests_nothing(write_rules, extra, where):
    gate = GATE.replace("  reject:", extra + "  reject:")
    with pytest.raises(RuleError) as caught:
        dsv4sel.load_rules([write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULT,
                                         "c.yaml": gate + C[len(GATE):], "g.yaml": G})])
    assert any(p.file == "rules/c.yaml" and p.code.startswith("DSV2") for p in caught.value.problems), \
        caught.value
    assert where in str(caught.value)
