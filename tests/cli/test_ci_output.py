"""CI logs and annotations (issue 17 point 7): rule text holding newlines cannot start a line
with ``::`` (a GitHub workflow command: a forged ``::error``, or ``::stop-commands::``
silencing the rest of the step) in any command's text; a test file name holding a newline is
escaped under ``--format github``; SARIF relative URIs are percent-encoded."""

from __future__ import annotations

import json

from _cli import REPO, run

CLEAN = (REPO / "examples" / "mistakes" / "clean" / "my.yaml").read_text()
FORGED = "first line\\n::error file=rules/flashmla.yaml,line=1::forged\\n  ::stop-commands::token"
QUERY = ("--platform", "cuda", "--capability", "12.0", "--backend", "MY_MLA_SPARSE", "--kv-cache-dtype", "bfloat16")


def _pack(tmp_path):
    pack = tmp_path / "pack"
    pack.mkdir()
    old = "      reason: MY_MLA_SPARSE serves fp8 on CUDA SM12x only, not {kv_cache_dtype} on {platform} {capability}."
    assert old in CLEAN
    (pack / "my.yaml").write_text(CLEAN.replace(old, f'      reason: "{FORGED}"'))
    return pack


def _no_workflow_command(text: str) -> None:
    assert text, "no output"
    for line in text.splitlines():
        assert not line.lstrip().startswith("::"), line


def test_rule_text_with_newlines_forges_no_workflow_command(tmp_path):
    pack = _pack(tmp_path)
    explained = run("explain", *QUERY, "--rules", str(pack))
    assert explained.rc == 1 and "forged" in explained.out, explained  # the reason is shown...
    _no_workflow_command(explained.out)                              # ...its colon escaped
    assert "\\x3a:error file=rules/flashmla.yaml,line=1::forged" in explained.out
    tested = run("test", "tests/cli/cases/forged_bf16.yaml", "--rules", str(pack))
    assert tested.rc == 1 and "forged" in tested.out, tested
    _no_workflow_command(tested.out)


def test_a_test_file_name_with_a_newline_is_escaped_in_github_annotations(tmp_path):
    directory = tmp_path / "cases"
    directory.mkdir()
    name = "a\n::error file=x,line=1::forged.yaml"
    (directory / name).write_text((REPO / "tests" / "cli" / "cases" / "wrong_cpu.yaml").read_text())  # a hostile name
    result = run("test", str(directory), "--format", "github")
    assert result.rc == 1, result
    (line,) = result.out.splitlines()  # one annotation, on one line
    assert line.startswith("::error file=") and "/cases/a\\x0a%3A%3Aerror file=x%2Cline=1%3A%3Aforged.yaml," in line


def test_sarif_relative_uris_are_percent_encoded(tmp_path):
    pack = tmp_path / "my pack#1"
    pack.mkdir()
    (pack / "my.yaml").write_text(CLEAN.replace("fp8_e4m3]", "fp8_e4m4]"))  # one finding, DSV301
    result = run("check", "--rules", "my pack#1", "--format", "sarif", cwd=tmp_path)
    assert result.rc == 2, result  # a value outside the vocabulary: the file does not load
    (finding,) = json.loads(result.out)["runs"][0]["results"]
    uri = finding["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
    assert uri == "my%20pack%231/my.yaml"
