"""Rule-set test cases as data: one runner for ``tests/check/cases/<case>/``.

A case is a folder: its rule files (``rules/``) and ``case.yaml``, a ``kind: tests``
file (the format ``dsv4sel test`` reads, docs/cli.md) with two more keys, ``base``
and ``findings``: the findings ``dsv4sel check`` must report, by code and location.
``case.yaml`` is read by the product's own loader (``load_cases``) under the product's
schema plus ``cases/case.schema.json``, and its ``cases`` run through the product's
runner (``run_tests``), exactly as ``dsv4sel test`` runs them. The format is in
``tests/README.md``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import dsv4sel
from dsv4sel.api import verify
from dsv4sel.engine.load import load_file
from dsv4sel.tools import testcases

CASES = Path(__file__).with_name("cases")
TESTS = Path(__file__).resolve().parent.parent
NAMES = sorted(p.name for p in CASES.iterdir() if (p / "case.yaml").is_file())


@pytest.fixture(scope="session")
def case_schema(tmp_path_factory) -> str:
    """The product's test-file schema with what a check case adds (``cases/case.schema.json``)."""
    schema = json.loads(Path(testcases.SCHEMA_PATH).read_text())
    extra = json.loads((CASES / "case.schema.json").read_text())
    schema["properties"].update(extra["properties"])
    schema["$defs"].update(extra["$defs"])
    schema["required"] = [*schema["required"], *extra["required"]]
    schema["properties"]["cases"] = {**schema["properties"]["cases"], "minItems": 0}
    path = tmp_path_factory.mktemp("schema") / "case.schema.json"
    path.write_text(json.dumps(schema))
    return str(path)


def load_case(name: str, schema: str, monkeypatch) -> tuple[dict, list]:
    """``case.yaml`` of case ``name`` as data, and its cases as the product's loader reads them."""
    path = CASES / name / "case.yaml"
    with monkeypatch.context() as patch:
        patch.setattr(testcases, "SCHEMA_PATH", schema)
        cases, _ = testcases.load_cases([str(path)])  # raises TestFileError, located, on a bad case file
    loaded, problems = load_file(str(path), str(path))
    assert loaded is not None and not problems
    return loaded.data, cases


def materialize(name: str, data: dict, into: Path) -> Path:
    """The case's rule files in ``into``/rules: ``base`` first, then its own."""
    if data.get("base"):
        shutil.copytree(TESTS / data["base"], into / "rules", dirs_exist_ok=True)
    shutil.copytree(CASES / name / "rules", into / "rules", dirs_exist_ok=True)
    return into / "rules"


def _matches(finding, want: dict) -> bool:
    got = {"code": finding.code, "file": finding.file, "line": finding.line, "column": finding.column,
           "severity": finding.severity, "rules": [r.id for r in finding.rules], "count": finding.count,
           "cubes": [c.text for c in finding.cubes]}
    return all(got[key] == value for key, value in want.items())


def case_packs(name: str, data: dict, into: Path) -> list[str]:
    """The case's rule packs in ``into``: rules/ (``base`` and its own), then its ``pack`` folder."""
    packs = [str(materialize(name, data, into))]
    if data.get("pack"):
        shutil.copytree(CASES / name / data["pack"], into / data["pack"])
        packs.append(data["pack"])
    return packs


def case_report(name: str, directory: Path):
    """Materialize case ``name`` into ``directory`` (the working directory) and verify it."""
    data = yaml.safe_load((CASES / name / "case.yaml").read_text())
    return verify(case_packs(name, data, directory))


@pytest.mark.parametrize("name", NAMES)
def test_case(name, tmp_path, monkeypatch, case_schema):
    data, cases = load_case(name, case_schema, monkeypatch)
    monkeypatch.chdir(tmp_path)
    packs = case_packs(name, data, tmp_path)
    report = verify(packs)
    unmatched = list(report.findings)
    for want in data["findings"]:
        hit = next((f for f in unmatched if _matches(f, want)), None)
        assert hit is not None, f"{name}: no finding {want} among:\n" + "\n".join(map(str, unmatched))
        unmatched.remove(hit)
    assert not unmatched, f"{name}: findings the case does not expect:\n" + "\n".join(map(str, unmatched))
    if cases:
        result = testcases.run_tests(dsv4sel.load_rules(paths=packs, use_cache=False), cases)
        assert result.ok, [f.message for r in result.failed for f in r.failures]


def test_a_bad_case_file_is_refused_at_its_line(tmp_path, monkeypatch, case_schema):
    # the superset is checked as strictly as the product's format: a finding without a line is refused
    case = tmp_path / "case.yaml"
    case.write_text((CASES / "gap_in_first_table" / "case.yaml").read_text().replace("    line: 2\n", ""))
    monkeypatch.setattr(testcases, "SCHEMA_PATH", case_schema)
    with pytest.raises(testcases.TestFileError) as info:
        testcases.load_cases([str(case)])
    assert [(p.code, p.line) for p in info.value.problems] == [("DSV204", 5)], info.value


def test_every_case_folder_is_collected():
    # a case folder without case.yaml, or a case file with another name, would silently not run
    strays = [p for p in CASES.rglob("*.y*ml") if p.name != "case.yaml" and p.parent.name not in ("rules", "pack")]
    folders = [p.name for p in CASES.iterdir() if p.is_dir()]
    assert strays == [] and sorted(folders) == NAMES
    assert NAMES, "no case folders"
