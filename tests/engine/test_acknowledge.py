"""A rule's ``acknowledge:``: a finding of its own selection (a compat set reproducing a host's
bug) is reported as a warning that names the reason, never dropped; only that rule's, only the
codes named, and only codes of a rule's own selection."""

from __future__ import annotations


import pytest

from pathlib import Path

from test_requested_by_name import RULES as PACK

import dsv4sel
from dsv4sel.api import verify
from dsv4sel.errors import RuleError

REASON = "the host sizes this cache at 512 B: reproduced, not endorsed"
#: tables C and G, whose rules c-auto and g-any select fp8_ds_mla pages (584 B) at 512 B; one
#: folder per way of acknowledging that: both/ (each its own), c_only/, none/, and c.yaml
#: acknowledging what it cannot, DSV401/ (a verifier code, not a selection's) and gap/ (not a code)
RULES = Path(__file__).with_name("rules") / "acknowledge"


def _findings(write_rules, variant: str):
    pack = write_rules(PACK / "pack", RULES / variant)  # its vocabulary and default decision
    return [(f.severity, f.code, f.rules[0].id, f.message) for f in verify([pack]).findings]


def test_an_acknowledged_finding_is_a_warning_naming_the_reason(write_rules):
    found = _findings(write_rules, "both")
    assert [(s, c, r) for s, c, r, _ in found] == [("warning", "DSV408", "c-auto"), ("warning", "DSV408", "g-any")]
    assert all(m.endswith(f"(acknowledged: {REASON})") for *_, m in found)  # the reason, as the rule states it


def test_the_acknowledgement_covers_only_its_own_rule(write_rules):
    found = _findings(write_rules, "c_only")
    assert [(s, c, r) for s, c, r, _ in found] == [("warning", "DSV408", "c-auto"), ("error", "DSV408", "g-any")]


def test_without_it_the_finding_is_an_error(write_rules):
    found = _findings(write_rules, "none")
    assert [(s, c, r) for s, c, r, _ in found] == [("error", "DSV408", "c-auto"), ("error", "DSV408", "g-any")]
    assert not any(m.endswith(f"(acknowledged: {REASON})") for *_, m in found)


@pytest.mark.parametrize("variant,code,line", [("DSV401", "DSV309", 15), ("gap", "DSV201", 15)])
def test_only_a_selection_finding_can_be_acknowledged(write_rules, variant, code, line):
    pack = write_rules(PACK / "pack", RULES / variant)
    with pytest.raises(RuleError) as caught:
        dsv4sel.load_rules([pack])
    assert [(p.code, p.file, p.line) for p in caught.value.problems] == [(code, "rules/c.yaml", line)], caught.value
