"""``dsv4sel test``: expected decisions as data, run as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import re
from pathlib import Path


from _cli import REPO, rule_line, run  # noqa: E402

EXAMPLE = REPO / "examples" / "b12x-pack"
PACK = ["--rules", "examples/b12x-pack/dsv4sel_b12x/rules", "--allow-impl-module", "dsv4sel_b12x"]


#: the test files of these tests, as YAML, named relative to the repository (where `run` runs,
#: so messages name them so too); their rule files are in rules/test_cli/
CASES = Path("tests/cli/cases")
RULES = Path("tests/cli/rules/test_cli")


def problems(err: str) -> list[tuple[str, str]]:
    """``(file:line:column, code)`` of each problem ``dsv4sel test`` reports on stderr (the wording
    of each code is pinned once, in tests/engine/wording.yaml)."""
    return re.findall(r"(\S+:\d+:\d+): .* \[(DSV\d{3})\]$", err, re.M)


def line_of(path: Path, needle: str) -> tuple[int, int]:
    """1-based line and column of the first occurrence of ``needle``."""
    for number, text in enumerate((REPO / path).read_text().splitlines(), 1):
        if needle in text:
            return number, text.index(needle) + 1
    raise AssertionError(f"{needle!r} not in {path}")


def test_the_shipped_rule_tests_pass_and_reach_every_rule():
    r = run("test", "tests/decisions")
    assert r.rc == 0, r
    summary = re.search(r"^(\d+) cases in 1 file: (\d+) passed, 0 failed$", r.out, re.M)
    assert summary and summary[1] == summary[2] and int(summary[1]) >= 70, r.out
    cov = re.search(r"^rule coverage: (\d+) of (\d+) rules reached \(100%\) \(all rules\)$", r.out, re.M)
    assert cov and cov[1] == cov[2], r.out
    assert "not reached" not in r.out


def test_the_example_pack_tests_pass_with_coverage_of_the_pack_alone():
    r = run("test", "examples/b12x-pack/tests", *PACK)
    assert r.rc == 0, r
    assert re.search(r"^\d+ cases in 1 file: (\d+) passed, 0 failed$", r.out, re.M), r.out
    assert "rule coverage: 7 of 7 rules reached (100%) (the rules of dsv4sel_b12x)" in r.out


def test_failures_are_located_and_say_expected_and_got():
    f = CASES / "failing.yaml"  # one case passes, seven fail
    r = run("test", str(f))
    assert r.rc == 1, r
    name = str(f)
    line, col = line_of(f, "backend: FLASHINFER_MLA_SPARSE_DSV4")
    col = line_of(f, "{backend: FLASHINFER")[1] + 1
    assert (f"{name}:{line}:{col}: case wrong-backend: expected backend FLASHINFER_MLA_SPARSE_DSV4, "
            "got FLASHMLA_SPARSE_DSV4") in r.out
    line, col = line_of(f, "bytes_per_token: 512")
    assert re.search(rf"^{re.escape(name)}:{line}:{col}: case wrong-size: expected bytes_per_token 512, got 584 "
                     r"from FLASHMLA_SPARSE_DSV4", r.out, re.M), r.out
    assert re.search(r": case expected-rejection: expected a rejection, got a selection: FLASHMLA_SPARSE_DSV4 "
                     rf"with fp8_ds_mla, 584 B/token \(rule flashmla-fp8, rules/flashmla.yaml:{rule_line('flashmla.yaml', 'flashmla-fp8')}\)",
                     r.out), r.out
    assert re.search(r": case expected-selection: expected a selection \(layout fp8_ds_mla\), got a rejection by "
                     r"rule flashmla-unsupported-dtype \(rules/flashmla.yaml:\d+\): .*bfloat16", r.out), r.out
    assert "case wrong-reason: expected the reason to contain 'no such words', got a rejection" in r.out
    assert "case wrong-rewrites: expected rewrites {cache_dtype: fp8_ds_mla}, got {} (none)" in r.out
    # an unnamed case is named by its position
    assert "case #8: expected rule flashinfer-sm9x, got a rejection by rule flashmla-unsupported-dtype" in r.out
    assert "case hopper-passes" not in r.out  # passing cases are quiet
    assert re.search(r"^8 cases in 1 file: 1 passed, 7 failed$", r.out, re.M), r.out
    # wrong-backend fails once per unmet expectation: the size matches, so one line
    assert r.out.count("case wrong-backend:") == 1


def test_coverage_lists_the_rules_no_case_reached_with_file_and_line():
    f = CASES / "cpu_only.yaml"
    r = run("test", str(f))
    assert r.rc == 0, r
    cov = re.search(r"^rule coverage: (\d+) of (\d+) rules reached", r.out, re.M)
    assert cov[1] == "2", r.out  # default-cpu and cpu-fp8
    unreached = r.out.split("not reached by any case:\n")[1]
    assert re.search(rf"^  flashmla-fp8\s+rules/flashmla.yaml:{rule_line('flashmla.yaml', 'flashmla-fp8')}$",
                     unreached, re.M)
    assert "cpu-fp8 " not in unreached and "default-cpu " not in unreached
    assert len(unreached.strip().splitlines()) == int(cov[2]) - 2


def test_json_report():
    f = CASES / "failing.yaml"
    r = run("test", str(f), "--json")
    assert r.rc == 1, r
    data = json.loads(r.out)
    assert data["version"] == 1 and data["ok"] is False
    assert data["summary"] == {"cases": 8, "passed": 1, "failed": 7}
    first, second = data["cases"][0], data["cases"][1]
    assert first["status"] == "pass" and first["outcome"]["backend"] == "FLASHMLA_SPARSE_DSV4"
    assert second["failures"][0]["field"] == "backend"
    assert second["failures"][0]["expected"] == "FLASHINFER_MLA_SPARSE_DSV4"
    assert second["failures"][0]["got"] == "FLASHMLA_SPARSE_DSV4"
    cov = data["coverage"]
    assert cov["reached"] == sum(1 for rule in cov["by_rule"] if rule["cases"])
    assert {"id", "file", "line", "location", "pack"} <= set(cov["unreached"][0])


def test_github_format_annotates_each_failure():
    f = CASES / "failing.yaml"
    r = run("test", str(f), "--format", "github")
    assert r.rc == 1, r
    lines = r.out.splitlines()
    assert len(lines) == 7 and all(line.startswith(f"::error file={f},line=") for line in lines), r.out
    assert "::DSV510: case wrong-size: expected bytes_per_token 512" in r.out


def test_directories_are_searched_for_test_files_only():
    r = run("test", str(CASES / "suite"))  # nested/a.yaml, a test file, beside rules.yaml, a rule file
    assert r.rc == 0, r
    assert "1 case in 1 file: 1 passed, 0 failed" in r.out


def test_unquoted_capability_says_to_quote_it():
    f = CASES / "unquoted_capability.yaml"
    r = run("test", str(f))
    assert r.rc == 2, r
    assert r.out == ""
    line, col = line_of(f, "9.0")
    assert problems(r.err) == [(f"{f}:{line}:{col}", "DSV202")]  # quote it: DSV202's wording
    assert len(r.err.strip().splitlines()) == 1


def test_bad_test_files_exit_2_with_codes(tmp_path):
    r = run("test", str(RULES / "a_default" / "r.yaml"))  # a rule file
    assert r.rc == 2 and problems(r.err) == [(f"{RULES}/a_default/r.yaml:1:7", "DSV501")], r
    r = run("test", str(tmp_path / "missing.yaml"))
    assert r.rc == 2 and problems(r.err) == [(f"{tmp_path}/missing.yaml:1:1", "DSV101")], r
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("test", str(empty))
    assert r.rc == 2 and problems(r.err) == [(f"{empty}:1:1", "DSV502")], r
    both = CASES / "reject_and_select.yaml"
    r = run("test", str(both))
    assert r.rc == 2 and problems(r.err) == [(f"{both}:4:13", "DSV201")], r  # at `expect`, once
    assert len(r.err.strip().splitlines()) == 1, r
    typo = CASES / "field_typo.yaml"
    r = run("test", str(typo))
    line, col = line_of(typo, "layuot")
    assert r.rc == 2 and problems(r.err) == [(f"{typo}:{line}:{col}", "DSV203")], r
    assert "did you mean 'layout'?" in r.err  # the nearest field of a test file's expect


def test_an_invalid_query_value_fails_the_case_naming_the_nearest_value():
    f = CASES / "invalid_query.yaml"
    r = run("test", str(f))
    assert r.rc == 1, r
    assert "case typo: expected a selection (backend FLASHMLA_SPARSE_DSV4), got a rejection (an invalid query): " \
           "unknown kv-cache dtype 'fp8_e4m4'; did you mean 'fp8_e4m3'?" in r.out


def test_broken_rules_exit_2():
    r = run("test", "tests/decisions", "--rules", str(RULES / "broken"))  # x.yaml: no rules
    assert r.rc == 2 and "x.yaml" in r.err, r


def test_the_pack_tests_catch_a_missing_override(tmp_path):
    import shutil

    pack = tmp_path / "rules"
    shutil.copytree(EXAMPLE / "dsv4sel_b12x" / "rules", pack)
    text = (pack / "defaults.yaml").read_text()
    (pack / "defaults.yaml").write_text(text.replace("    override: true\n", ""))
    r = run("test", "examples/b12x-pack/tests", "--rules", str(pack), "--allow-impl-module", "dsv4sel_b12x")
    assert r.rc == 1, r
    tests = EXAMPLE / "tests" / "b12x.yaml"
    line, col = line_of(tests, "backend: B12X_MLA_SPARSE")
    assert (f"examples/b12x-pack/tests/b12x.yaml:{line}:{col}: case spark-default-is-b12x: expected backend "
            "B12X_MLA_SPARSE, got FLASHINFER_MLA_SPARSE_DSV4") in r.out
    # the pack's default rule no case reached any more
    assert re.search(r"^  b12x-default-sm121\s+\S+/rules/defaults.yaml:\d+$", r.out, re.M), r.out
