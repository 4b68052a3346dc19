"""Host translations (dsv4sel.translation) and their `dsv4sel check` stage (dsv4sel.check.host_spaces):
the shipped SGLang translation decides every input of its space once, and a broken translation
is a coded problem or finding at its file:line. Needs no SGLang."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest


import dsv4sel
from dsv4sel.check.host_spaces import check_translation
from dsv4sel.errors import RuleError
from dsv4sel.sglang_plugin.translation import FILE
from dsv4sel.translation import load

SHIPPED = Path(FILE).read_text()


def _variant(tmp_path: Path, old: str, new: str) -> str:
    assert old in SHIPPED
    path = tmp_path / "t.yaml"
    path.write_text(SHIPPED.replace(old, new, 1))
    return str(path)


def _line_of(text: str, needle: str) -> int:
    return text.splitlines().index(next(line for line in text.splitlines() if needle in line)) + 1


def test_dsv4sel_check_proves_the_sglang_space_decided():
    from _cli import run

    result = run("check", "--format", "json")
    report = json.loads(result.out)
    assert result.rc == 0 and report["ok"], report["findings"][:3]
    (host,) = report["hosts"]
    assert host["host"] == "sglang" and host["file"] == "dsv4sel/sglang_plugin/sglang-0.5.23.yaml"
    # the host space of tests/sglang523 (what the real SGLang is asked about), all decided
    assert host["inputs"] == 20_480 + 23_040 == host["selected"] + host["refused"]
    assert host["selected"] > 0


def test_a_name_outside_the_space_is_located(tmp_path):
    path = _variant(tmp_path, "when: {deployment: prefill_backend_other}", "when: {deployment: prefil_backend_other}")
    with pytest.raises(RuleError) as info:
        load(path)
    (p,) = info.value.problems
    text = Path(path).read_text()
    line = _line_of(text, "prefil_backend_other")
    column = text.splitlines()[line - 1].index("prefil_backend_other") + 1
    assert (p.code, p.line, p.column) == ("DSV601", line, column)  # at the misspelt name
    # DSV601's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`); the values
    # listed are the shipped space's, data
    assert re.fullmatch(r"deployment value 'prefil_backend_other' is not in the translation's space \([a-z_, ]+\)",
                        p.message), p.message


def test_a_schema_violation_is_located(tmp_path):
    path = _variant(tmp_path, "  - fix: S1\n", "  - fix: S1\n    because: typo\n")
    with pytest.raises(RuleError) as info:
        load(path)
    (p,) = info.value.problems
    assert p.code.startswith("DSV2") and p.line == _line_of(Path(path).read_text(), "because: typo")


def test_an_unmapped_kv_dtype_is_a_host_gap(tmp_path):
    path = _variant(tmp_path, "    map: {auto: auto, fp8_e4m3: fp8, bfloat16: bfloat16, fp8_e5m2: fp8_e5m2}",
                    "    map: {auto: auto, bfloat16: bfloat16, fp8_e5m2: fp8_e5m2}")
    _, findings = check_translation(load(path), dsv4sel.default_rules())
    gaps = [f for f in findings if f.code == "DSV602"]
    assert len(gaps) == 1 and gaps[0].count > 0 and "kv_cache_dtype=fp8_e4m3" in gaps[0].message  # the input it misses (data)
    assert gaps[0].severity == "error"
    # DSV602's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`)
    assert re.fullmatch(r"\d+ SGLang inputs of the host space are not decided: no translation row maps it "
                        r"\(KeyError 'fp8_e4m3'\); e\.g\. model=\S+ .*", gaps[0].message), gaps[0].message


def test_a_row_that_decides_nothing_is_a_warning_at_its_line(tmp_path):
    # a copy of the first refusal ahead of it: the copy takes every input the shipped row matches
    row = "  - fix: S1\n    when: {deployment: attention_backend_other}\n    reason: first\n"
    path = _variant(tmp_path, "refuse:\n", "refuse:\n" + row)
    _, findings = check_translation(load(path), dsv4sel.default_rules())
    (dead,) = [f for f in findings if f.code == "DSV603"]
    lines = Path(path).read_text().splitlines()
    shipped_row = [i for i, line in enumerate(lines, 1) if "when: {deployment: attention_backend_other}" in line][1] - 1
    assert dead.severity == "warning" and dead.line == shipped_row
    # DSV603's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`)
    assert dead.message == ("this SGLang translation row decides no input of the host space (earlier rows take "
                            "all it matches, or it matches none); remove it or fix its `when`")
