"""A rule's ``acknowledge:``: a finding of its own selection (a compat set reproducing a host's
bug) is reported as a warning that names the reason, never dropped; only that rule's, only the
codes named, and only codes of a rule's own selection."""

from __future__ import annotations


import pytest

from _rule_text import BACKEND_HEAD
from test_requested_by_name import DEFAULT, VOCAB

import dsv4sel
from dsv4sel.api import verify
from dsv4sel.errors import RuleError

REASON = "the host sizes this cache at 512 B: reproduced, not endorsed"


def _c(acknowledge: str = "") -> str:
    """Table C: its cpu rule selects fp8_ds_mla pages (584 B) at 512 B, with ``acknowledge``."""
    return BACKEND_HEAD.format(name="C") + f"""\
  - id: c-auto
    when: {{platform: cpu, kv_cache_dtype: auto}}
    select: {{bytes_per_token: 512}}
{acknowledge}  - id: c-other
    reject: {{reason: "C stores only fp8_ds_mla"}}
"""


def _g(acknowledge: str = "") -> str:
    return BACKEND_HEAD.format(name="G") + f"""\
  - id: g-any
    when: {{platform: cuda, kv_cache_dtype: auto}}
    select: {{bytes_per_token: 512}}
{acknowledge}  - id: g-other
    reject: {{reason: "G serves cuda auto only"}}
"""


ACK = f"    acknowledge: {{DSV408: \"{REASON}\"}}\n"


def _findings(write_rules, c: str, g: str):
    pack = write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULT, "c.yaml": c, "g.yaml": g})
    return [(f.severity, f.code, f.message) for f in verify([pack]).findings]


def test_an_acknowledged_finding_is_a_warning_naming_the_reason(write_rules):
    found = _findings(write_rules, _c(ACK), _g(ACK))
    assert [(s, c) for s, c, _ in found] == [("warning", "DSV408"), ("warning", "DSV408")]
    assert all(m.endswith(f"(acknowledged: {REASON})") and "bytes_per_token 512 disagrees" in m
               for _, _, m in found)


def test_the_acknowledgement_covers_only_its_own_rule(write_rules):
    found = _findings(write_rules, _c(ACK), _g())
    assert sorted((s, c, "g-any" in m) for s, c, m in found) == [
        ("error", "DSV408", True), ("warning", "DSV408", False)]


def test_without_it_the_finding_is_an_error(write_rules):
    found = _findings(write_rules, _c(), _g())
    assert [(s, c) for s, c, _ in found] == [("error", "DSV408"), ("error", "DSV408")]
    assert not any("acknowledged" in m for _, _, m in found)


@pytest.mark.parametrize("code,stage", [("DSV401", "DSV309"), ("gap", "DSV2")])
def test_only_a_selection_finding_can_be_acknowledged(write_rules, code, stage):
    pack = write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULT,
                        "c.yaml": _c(f"    acknowledge: {{{code}: \"{REASON}\"}}\n"), "g.yaml": _g()})
    with pytest.raises(RuleError) as caught:
        dsv4sel.load_rules([pack])
    problems = [p for p in caught.value.problems if p.file == "rules/c.yaml"]
    assert problems and all(p.code.startswith(stage) for p in problems), caught.value
    if stage == "DSV309":
        assert "DSV408" in problems[0].message  # it names what can be acknowledged
