"""Rule-set test cases as data: one runner for ``tests/check/cases/*.yaml``.

Each case is rule files, the findings ``dsv4sel check`` must report (by code
and location), and optionally queries with their expected outcome. The
format is in ``tests/check/cases/README.md``. Cases hold YAML as YAML, where
Python strings would hide it, and assert on codes, not on message text.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

import dsv4sel
from dsv4sel.api import verify

CASES = Path(__file__).with_name("cases")
FILES = sorted(p for p in CASES.glob("*.yaml"))
FINDING_FIELDS = {"code", "file", "line", "column", "severity", "rules", "count", "cubes", "message_contains"}


def _load(path: Path) -> dict:
    case = yaml.safe_load(path.read_text())
    unknown = set(case) - {"note", "base", "files", "want_findings", "want_queries"}
    assert not unknown, f"{path.name}: unknown keys {sorted(unknown)}"
    assert "note" in case and "want_findings" in case, f"{path.name}: a case needs note and want_findings"
    return case


def _materialize(case: dict, into: Path) -> Path:
    if case.get("base"):
        shutil.copytree(CASES / case["base"], into, dirs_exist_ok=True)
    for name, text in (case.get("files") or {}).items():
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return into / "rules"


def _matches(finding, want: dict) -> bool:
    got = {"code": finding.code, "file": finding.file, "line": finding.line, "column": finding.column,
           "severity": finding.severity, "rules": [r.id for r in finding.rules], "count": finding.count,
           "cubes": [c.text for c in finding.cubes]}
    for key, value in want.items():
        if key == "message_contains":
            if not all(part in finding.message for part in value):
                return False
        elif got[key] != value:
            return False
    return True


def case_report(name: str, directory: Path):
    """Materialize case ``name`` into ``directory`` (the working directory) and verify it."""
    rules = _materialize(_load(CASES / f"{name}.yaml"), directory)
    return verify([str(rules)])


@pytest.mark.parametrize("path", FILES, ids=[p.stem for p in FILES])
def test_case(path, tmp_path, monkeypatch):
    case = _load(path)
    monkeypatch.chdir(tmp_path)
    rules = _materialize(case, tmp_path)
    report = verify([str(rules)])
    wants = case["want_findings"] or []
    for want in wants:
        assert set(want) <= FINDING_FIELDS and {"code", "file"} <= set(want), f"{path.name}: bad want {want}"
    unmatched = list(report.findings)
    for want in wants:
        hit = next((f for f in unmatched if _matches(f, want)), None)
        assert hit is not None, f"{path.name}: no finding {want} among:\n" + "\n".join(map(str, unmatched))
        unmatched.remove(hit)
    assert not unmatched, f"{path.name}: findings the case does not expect:\n" + "\n".join(map(str, unmatched))
    for item in case.get("want_queries") or ():
        _check_query(path, rules, item)


def _check_query(path: Path, rules: Path, item: dict) -> None:
    loaded = dsv4sel.load_rules(paths=[str(rules)], use_cache=False)
    want = dict(item["want"])
    rule = want.pop("rule", None)
    if want.pop("reject", False):
        with pytest.raises(dsv4sel.SelectionError) as info:
            dsv4sel.select(rules=loaded, **item["query"])
        assert rule is None or info.value.rule.id == rule, f"{path.name}: {item}"
        return
    selection = dsv4sel.select(rules=loaded, **item["query"])
    got = {name: getattr(selection, name) for name in want}
    if "rewrites" in got:
        got["rewrites"] = dict(got["rewrites"])
    assert got == want, f"{path.name}: {item}"
    assert rule is None or selection.rule.id == rule, f"{path.name}: {item}"


def test_every_case_file_is_collected():
    # a case in a subfolder, or with another suffix, would silently not run
    strays = [p for p in CASES.rglob("*") if p.is_file() and p.suffix in (".yml", ".yaml")
              and not p.parent.name.startswith("_") and p.parent != CASES
              and not any(part.startswith("_") for part in p.relative_to(CASES).parts)]
    assert strays == []
    assert FILES, "no case files"
