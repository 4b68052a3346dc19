"""One location type: problems, findings and rule references each give a
:class:`dsv4sel.Loc`, and its text is the one spelling of a place,
``file:line[:column]``, that every message and every output starts with."""

from __future__ import annotations

import pytest

import dsv4sel
from dsv4sel import Loc, RuleError

from test_cases import case_report


def test_a_loc_spells_file_line_and_column_or_just_the_line():
    assert str(Loc("rules/a.yaml", 13, 28)) == "rules/a.yaml:13:28"
    assert str(Loc("rules/a.yaml", 13)) == "rules/a.yaml:13"
    assert Loc("rules/a.yaml", 13) == Loc("rules/a.yaml", 13, None) != Loc("rules/a.yaml", 13, 1)


def test_a_rule_error_s_problems_are_located_by_their_loc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = case_report("file_problems", tmp_path)
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules([str(tmp_path / "rules")], use_cache=False)
    typo = next(p for p in info.value.problems if p.code == "DSV301")
    assert typo.loc == Loc("rules/a.yaml", 13, 28)
    assert str(typo).startswith("rules/a.yaml:13:28: ")
    # the verifier reports the same problem at the same place, as a finding
    finding = next(f for f in report.findings if f.code == "DSV301")
    assert finding.loc == typo.loc and finding.location == str(typo.loc)
    assert str(finding).startswith(f"{typo.loc}: error DSV301")


def test_a_rule_is_located_by_its_line():
    sel = dsv4sel.select(platform="cuda", capability="9.0")
    assert sel.rule.loc == Loc(sel.rule.file, sel.rule.line)
    assert sel.rule.location == str(sel.rule.loc) == f"{sel.rule.file}:{sel.rule.line}"
    assert str(sel.rule) == f"{sel.rule.id} ({sel.rule.loc})"
