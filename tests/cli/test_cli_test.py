"""``dsv4sel test``: expected decisions as data, run as a user runs them (subprocesses)."""

from __future__ import annotations

import json
import re
from pathlib import Path


from _cli import REPO, rule_line, run  # noqa: E402

EXAMPLE = REPO / "examples" / "b12x-pack"
PACK = ["--rules", "examples/b12x-pack/dsv4sel_b12x/rules", "--allow-impl-module", "dsv4sel_b12x"]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def line_of(path: Path, needle: str) -> tuple[int, int]:
    """1-based line and column of the first occurrence of ``needle``."""
    for number, text in enumerate(path.read_text().splitlines(), 1):
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
    assert "rule coverage: 6 of 6 rules reached (100%) (the rules of dsv4sel_b12x)" in r.out


FAILING = """\
kind: tests
cases:
  - name: hopper-passes
    query: {platform: cuda, capability: "9.0"}
    expect: {backend: FLASHMLA_SPARSE_DSV4, rule: flashmla-fp8}
  - name: wrong-backend
    query: {platform: cuda, capability: "9.0"}
    expect: {backend: FLASHINFER_MLA_SPARSE_DSV4, bytes_per_token: 584}
  - name: wrong-size
    query: {platform: cuda, capability: "9.0"}
    expect: {bytes_per_token: 512}
  - name: expected-rejection
    query: {platform: cuda, capability: "9.0", kv_cache_dtype: fp8}
    expect: {reject: true}
  - name: expected-selection
    query: {platform: cuda, capability: "9.0", kv_cache_dtype: bfloat16}
    expect: {layout: fp8_ds_mla}
  - name: wrong-reason
    query: {platform: cuda, capability: "9.0", kv_cache_dtype: bfloat16}
    expect: {reject: true, reason_contains: no such words}
  - name: wrong-rewrites
    query: {platform: cuda, capability: "9.0", kv_cache_dtype: fp8_ds_mla}
    expect: {rewrites: {cache_dtype: fp8_ds_mla}}
  - query: {platform: cuda, capability: "9.0", kv_cache_dtype: bfloat16}
    expect: {reject: true, rule: flashinfer-sm9x}
"""


def test_failures_are_located_and_say_expected_and_got(tmp_path):
    f = write(tmp_path / "t" / "cases.yaml", FAILING)
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


def test_coverage_lists_the_rules_no_case_reached_with_file_and_line(tmp_path):
    f = write(tmp_path / "one.yaml", "kind: tests\ncases:\n  - query: {platform: cpu}\n    expect: {backend: CPU_V4_MLA_SPARSE}\n")
    r = run("test", str(f))
    assert r.rc == 0, r
    cov = re.search(r"^rule coverage: (\d+) of (\d+) rules reached", r.out, re.M)
    assert cov[1] == "2", r.out  # default-cpu and cpu-fp8
    unreached = r.out.split("not reached by any case:\n")[1]
    assert re.search(rf"^  flashmla-fp8\s+rules/flashmla.yaml:{rule_line('flashmla.yaml', 'flashmla-fp8')}$",
                     unreached, re.M)
    assert "cpu-fp8 " not in unreached and "default-cpu " not in unreached
    assert len(unreached.strip().splitlines()) == int(cov[2]) - 2


def test_json_report(tmp_path):
    f = write(tmp_path / "cases.yaml", FAILING)
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


def test_github_format_annotates_each_failure(tmp_path):
    f = write(tmp_path / "cases.yaml", FAILING)
    r = run("test", str(f), "--format", "github")
    assert r.rc == 1, r
    lines = r.out.splitlines()
    assert len(lines) == 7 and all(line.startswith(f"::error file={f},line=") for line in lines), r.out
    assert "::DSV510: case wrong-size: expected bytes_per_token 512" in r.out


def test_directories_are_searched_for_test_files_only(tmp_path):
    write(tmp_path / "suite" / "nested" / "a.yaml", "kind: tests\ncases:\n  - query: {platform: xpu}\n"
                                                     "    expect: {backend: XPU_V4_MLA_SPARSE}\n")
    write(tmp_path / "suite" / "rules.yaml", "kind: default\nhit_policy: first\nrules: []\n")
    r = run("test", str(tmp_path / "suite"))
    assert r.rc == 0, r
    assert "1 case in 1 file: 1 passed, 0 failed" in r.out


def test_unquoted_capability_says_to_quote_it(tmp_path):
    f = write(tmp_path / "bad.yaml", "kind: tests\ncases:\n  - query: {platform: cuda, capability: 9.0}\n"
                                     "    expect: {backend: FLASHMLA_SPARSE_DSV4}\n")
    r = run("test", str(f))
    assert r.rc == 2, r
    assert r.out == ""
    line, col = line_of(f, "9.0")
    assert f"{f}:{line}:{col}: $.cases[0].query.capability: 9.0 is not of type" in r.err
    assert 'YAML reads the unquoted 9.0 as a number: quote it, "9.0" [DSV202]' in r.err
    assert len(r.err.strip().splitlines()) == 1


def test_bad_test_files_exit_2_with_codes(tmp_path):
    rules_file = write(tmp_path / "r.yaml", "kind: default\nhit_policy: first\nrules: []\n")
    r = run("test", str(rules_file))
    assert r.rc == 2 and "not a test file: kind is 'default'" in r.err and "[DSV501]" in r.err, r
    r = run("test", str(tmp_path / "missing.yaml"))
    assert r.rc == 2 and "no such file or directory [DSV101]" in r.err, r
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run("test", str(empty))
    assert r.rc == 2 and "no test files" in r.err and "[DSV502]" in r.err, r
    both = write(tmp_path / "both.yaml", "kind: tests\ncases:\n  - query: {platform: cpu}\n"
                                         "    expect: {reject: true, backend: CPU_V4_MLA_SPARSE}\n")
    r = run("test", str(both))
    assert r.rc == 2 and f"{both}:4:13: $.cases[0].expect: `reject: true` cannot be combined with selection fields (backend)" in r.err, r
    assert len(r.err.strip().splitlines()) == 1, r
    typo = write(tmp_path / "typo.yaml", "kind: tests\ncases:\n  - query: {platform: cpu}\n"
                                         "    expect: {backend: CPU_V4_MLA_SPARSE, layuot: fp8_ds_mla}\n")
    r = run("test", str(typo))
    line, col = line_of(typo, "layuot")
    assert r.rc == 2 and f"typo.yaml:{line}:{col}: $.cases[0].expect: unknown field 'layuot'; did you mean 'layout'?" in r.err, r


def test_an_invalid_query_value_fails_the_case_naming_the_nearest_value(tmp_path):
    f = write(tmp_path / "t.yaml", "kind: tests\ncases:\n  - name: typo\n    query: {platform: cuda, kv_cache_dtype: fp8_e4m4}\n"
                                   "    expect: {backend: FLASHMLA_SPARSE_DSV4}\n")
    r = run("test", str(f))
    assert r.rc == 1, r
    assert "case typo: expected a selection (backend FLASHMLA_SPARSE_DSV4), got a rejection (an invalid query): " \
           "unknown kv-cache dtype 'fp8_e4m4'; did you mean 'fp8_e4m3'?" in r.out


def test_broken_rules_exit_2(tmp_path):
    write(tmp_path / "pack" / "x.yaml", "kind: backend\nbackends: [X]\n")
    r = run("test", "tests/decisions", "--rules", str(tmp_path / "pack"))
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
