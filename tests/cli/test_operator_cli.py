"""Issue 18.3, the operator's CLI: a mistyped flag, JSON errors, `version` in every --json
document, openable paths, completion of values, wrapping, and exit 2 for rule files that do
not load, from every command."""

from __future__ import annotations

import json
import os

import pytest


from _cli import REPO, environ, run  # noqa: E402

TYPO = "examples/mistakes/value-typo"


@pytest.mark.parametrize("args, usage, message", [
    (("explain", "--platfrom", "cuda"), "usage: dsv4sel explain", "--platfrom cuda; did you mean --platform?"),
    (("check", "--formt", "json"), "usage: dsv4sel check", "--formt; did you mean --format?"),  # json: a PATH
])
def test_a_mistyped_flag_gets_the_subcommands_usage_and_the_nearest_flag(args, usage, message):
    r = run(*args)
    assert r.rc == 2
    assert r.err.startswith(usage) and f"{usage[7:]}: error: unrecognized arguments: {message}" in r.err


@pytest.mark.parametrize("command", [
    ("explain", "--platform", "cuda"), ("test", "tests/decisions"), ("table",), ("doctor", "--platform", "cpu"),
    ("check",)])
def test_rule_files_that_do_not_load_exit_2_from_every_command(command):
    r = run(*command, "--rules", TYPO)
    assert r.rc == 2, r
    assert "my.yaml:23:74" in r.out + r.err and "DSV301" in r.out + r.err


def test_json_gets_a_json_error_document_on_exit_2():
    r = run("explain", "--platform", "cuda", "--rules", TYPO, "--json")
    assert r.rc == 2
    doc = json.loads(r.out)
    assert doc["version"] == 1 and doc["ok"] is False and doc["error"]["kind"] == "rules"
    (p,) = doc["error"]["problems"]
    assert (p["code"], p["line"], p["column"]) == ("DSV301", 23, 74)
    assert os.path.isabs(p["path"]) and os.path.isfile(p["path"])
    usage = run("explain", "--platfrom", "cuda", "--json")
    assert usage.rc == 2 and json.loads(usage.out)["error"]["kind"] == "usage"


@pytest.mark.parametrize("args", [
    ("check", "--json"), ("explain", "--platform", "cuda", "--json"), ("test", "tests/decisions", "--json"),
    ("table", "--format", "json"), ("doctor", "--platform", "cpu", "--json"),
    ("diff", "rules", "rules", "--json"),
    ("upgrade", "vllm", "0.33", "0.34", "--rules-dir", "tests/tools/rules/upgrade", "--json")])
def test_every_json_document_has_version(args):
    assert json.loads(run(*args).out)["version"] == 1


def test_json_locations_are_openable_from_any_directory(tmp_path):
    doc = json.loads(run("explain", "--platform", "cuda", "--capability", "9.0", "--json", cwd=tmp_path).out)
    assert doc["rule"]["file"] == "rules/flashmla.yaml"  # the short form stays
    assert doc["rule"]["path"] == str(REPO / "rules" / "flashmla.yaml")
    assert all(os.path.isfile(step["path"]) for step in doc["path"])


def test_check_text_names_a_path_that_opens_from_here(tmp_path):
    r = run("check", "--rules", str(REPO / TYPO), cwd=tmp_path)
    assert f"{REPO / TYPO}/my.yaml:23:74: error DSV301" in r.out


#: a location, in a column, at the start of a line or inside a message
LOCATION = __import__("re").compile(r"(?:^|(?<=[ (]))(?P<file>[^\s()`,]+\.yaml):(?P<line>\d+)", __import__("re").M)
#: every command that prints a location, with an argument list that makes it print some
LOCATING = {
    "explain": ("explain", "--platform", "cuda", "--capability", "9.0"),
    "explain rejected": ("explain", "--platform", "cuda", "--capability", "9.0", "--kv-cache-dtype", "bfloat16"),
    "test": ("test", str(REPO / "examples" / "mistakes" / "tests")),
    "table": ("table", "--format", "md"),
    "doctor": ("doctor", "--platform", "cuda", "--capability", "9.0"),
    "check": ("check", "--rules", str(REPO / "examples/mistakes/hijacking-override")),
    "rules that do not load": ("explain", "--platform", "cuda", "--rules", str(REPO / TYPO)),
}


@pytest.mark.parametrize("name", LOCATING)
def test_every_location_a_command_prints_opens_from_the_working_directory(tmp_path, name):
    # as in a wheel install: the shipped rules are not under the working directory
    r = run(*LOCATING[name], cwd=tmp_path)
    found = [(m["file"], int(m["line"])) for m in LOCATION.finditer(r.out + r.err)]
    assert found, r
    for file, line in found:
        path = tmp_path / file  # an absolute file ignores tmp_path
        assert path.is_file() and line <= len(path.read_text().splitlines()), (file, line, r)
    assert any(os.path.isabs(file) for file, _ in found)


@pytest.mark.parametrize("name", ["explain", "table", "doctor", "check"])
def test_in_a_checkout_the_shipped_rules_keep_their_short_names(name):
    out = run(*LOCATING[name]).out
    files = {m["file"] for m in LOCATION.finditer(out)}
    assert any(f.startswith("rules/") for f in files), files
    assert not any(f.startswith(str(REPO / "rules")) for f in files), files


def test_completion_completes_values():
    pytest.importorskip("shtab")
    script = run("completion", "bash").out
    assert "_shtab_dsv4sel_explain___platform_choices=(cuda rocm xpu cpu)" in script
    assert "FLASHMLA_SPARSE_DSV4" in script.split("_shtab_dsv4sel_explain___backend_choices=(")[1].split(")")[0]
    assert " fp8_e4m3 " in script.split("_shtab_dsv4sel_explain___kv_cache_dtype_choices=(")[1].split(")")[0]
    # parsing is unchanged: a query spelling is still accepted
    assert run("explain", "--platform", "cuda", "--capability", "sm90").rc == 0


def test_wrapping_never_splits_a_word():
    from dsv4sel.cli.render.text import wrap_line

    word = "examples/mistakes/value-typo/my.yaml:23:74:"
    lines = wrap_line(f"  x  {word} error DSV301 [vocabulary] 'fp8_e4m4' is not declared", 30)
    assert any(word in line for line in lines)


def test_a_gap_under_test_is_not_called_an_invalid_query(tmp_path):
    rules = tmp_path / "gap"
    rules.mkdir()
    (rules / "my.yaml").write_text((REPO / "examples/mistakes/gap/my.yaml").read_text())
    r = run("test", "tests/cli/cases/gap_under_test.yaml", "--rules", str(rules))
    assert r.rc == 1
    assert "an invalid query" not in r.out and "no rule" in r.out


def test_a_problem_that_is_no_file_keeps_its_name_in_text_and_json(tmp_path):
    from _cli import environ

    env = environ(DSV4SEL_ALLOW_IMPL_MODULES="-")
    r = run("explain", "--platform", "cuda", "--json", env=env, cwd=tmp_path)
    (problem,) = json.loads(r.out)["error"]["problems"]
    assert problem["file"] == problem["path"] == "$DSV4SEL_ALLOW_IMPL_MODULES"
    assert "  $DSV4SEL_ALLOW_IMPL_MODULES:1:1: DSV4SEL_ALLOW_IMPL_MODULES: '-' is not a dotted module name" in run("check", env=env, cwd=tmp_path).err


@pytest.mark.parametrize("command", ["check", "test"])
@pytest.mark.parametrize("columns", ["42", "60", "80", "100", "132"])
def test_help_shows_the_github_annotation_as_typed_at_any_width(command, columns):
    # the CLI writes a line that starts with a colon as \x3a (no text may forge a workflow
    # command); the help's own "::error" is quoted, so wherever argparse wraps it stays as typed
    r = run(command, "--help", env=environ(COLUMNS=columns))
    assert r.rc == 0 and "'::error" in r.out and "\\x3a" not in r.out, r.out
