"""CI and editor plumbing: check's formats and file arguments, pre-commit hooks,
the schema command, shell completion, --help examples; and the Python API's
fixes (pickling, as_dict, additive allow-list, the pack-alone hint)."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import sys
from pathlib import Path

import pytest
import yaml


from _cli import ANSI, REPO, run, run_tty  # noqa: E402

import dsv4sel  # noqa: E402
from dsv4sel import RuleError  # noqa: E402

#: rule packs as files: unquoted/ (capabilities 8.0, 8.6, 8.9 unquoted), long/ (four misspelt values)
RULES = Path(__file__).with_name("rules") / "toolchain"


@pytest.fixture
def bad_pack(tmp_path):
    pack = tmp_path / "pack" / "rules"
    pack.mkdir(parents=True)
    shutil.copy(RULES / "unquoted" / "xx.yaml", pack / "xx.yaml")
    return pack


def test_unquoted_capabilities_say_to_quote_them(bad_pack):
    r = run("check", str(bad_pack))
    assert r.rc == 2, r
    (line,) = [text for text in r.out.splitlines() if ": error " in text]
    assert line.startswith(f"{bad_pack}/xx.yaml:16:40: error DSV202 [schema] ")  # wording: wording.yaml, DSV202 several


def test_check_github_annotations(bad_pack):
    r = run("check", "--format", "github", str(bad_pack / "xx.yaml"))
    assert r.rc == 2, r
    (line,) = r.out.splitlines()
    assert re.fullmatch(rf"::error file={re.escape(str(bad_pack))}/xx.yaml,line=16,col=40,title=DSV202 unquoted YAML "
                        r"number or boolean where a string belongs::DSV202: \$\.rules\[1\]\.when\.capability: .*", line)


def test_check_sarif(bad_pack):
    r = run("check", "--format", "sarif", str(bad_pack))
    assert r.rc == 2, r
    log = json.loads(r.out)
    assert log["version"] == "2.1.0" and log["$schema"].endswith("sarif-2.1.0.json")
    (run_,) = log["runs"]
    assert run_["tool"]["driver"]["name"] == "dsv4sel"
    assert [rule["id"] for rule in run_["tool"]["driver"]["rules"]] == ["DSV202"]
    (result,) = run_["results"]
    assert result["ruleId"] == "DSV202" and result["level"] == "error"
    loc = result["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == (bad_pack / "xx.yaml").as_uri()
    assert loc["region"] == {"startLine": 16, "startColumn": 40}


def test_check_json_carries_codes(bad_pack):
    r = run("check", "--json", str(bad_pack))
    assert r.rc == 2
    (finding,) = json.loads(r.out)["findings"]
    assert finding["code"] == "DSV202" and finding["line"] == 16


def test_a_clean_check_in_machine_formats():
    r = run("check", "--format", "github")
    assert r.rc == 0 and r.out == "", r
    r = run("check", "--format", "sarif", "rules/flashmla.yaml", "rules/defaults.yaml")
    assert r.rc == 0 and json.loads(r.out)["runs"][0]["results"] == [], r


def test_check_takes_shipped_files_and_pack_files_as_arguments():
    shipped = len(list((REPO / "rules").glob("*.yaml")))
    # a shipped file stands for the shipped rules: checked once, not twice
    r = run("check", "rules/flashmla.yaml")
    assert r.rc == 0 and r.out.splitlines()[0].startswith(f"dsv4sel check: {shipped} files"), r
    # a pack's file stands for its directory's pack, on top of the default rules
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "examples" / "b12x-pack"),
                                                       os.environ.get("PYTHONPATH", "")]))
    from _cli import environ
    r = run("check", "examples/b12x-pack/dsv4sel_b12x/rules/b12x.yaml", "--allow-impl-module", "dsv4sel_b12x",
            env=environ(PYTHONPATH=env["PYTHONPATH"]))
    assert r.rc == 0 and r.out.splitlines()[0].startswith(f"dsv4sel check: {shipped + 2} files"), r
    # a test file among the arguments is not a rule file
    r = run("check", "tests/decisions/shipped.yaml")
    assert r.rc == 0 and f"{shipped} files" in r.out, r
    r = run("check", "no/such/dir")
    assert r.rc == 2 and "rule path 'no/such/dir' does not exist" in r.err, r


def test_an_impl_outside_the_allow_list_names_both_fixes():
    pack = RULES / "outside_allow_list"  # defaults: impl my_pack.impl:Impl
    r = run("check", "--json", str(pack))
    assert r.rc == 2
    # the defaults' impl once, not once per select rule (both fixes: the wording, tests/engine/wording.yaml)
    assert [(f["code"], f["line"], f["column"]) for f in json.loads(r.out)["findings"]] == [("DSV310", 5, 9)], r.out
    assert "--allow-impl-module my_pack (Python: allowed_impl_modules=('my_pack',))" in json.loads(r.out)["findings"][0]["message"]


def test_pre_commit_hooks():
    hooks = {h["id"]: h for h in yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"dsv4sel-check", "dsv4sel-test"}
    check, test = hooks["dsv4sel-check"], hooks["dsv4sel-test"]
    assert check["entry"] == "dsv4sel check" and check["language"] == "python"
    assert re.search(check["files"], "rules/flashmla.yaml") and re.search(check["files"], "pack/rules/x.yml")
    assert not re.search(check["files"], "tests/decisions/shipped.yaml")
    assert test["entry"] == "dsv4sel test" and test["pass_filenames"] is False
    # what the hooks run works on this repository
    assert run(*check["entry"].split()[1:], "rules/flashmla.yaml").rc == 0
    assert run(*test["entry"].split()[1:], *test["args"]).rc == 0


def test_schema_command():
    r = run("schema")
    assert r.rc == 0 and Path(r.out.strip()).name == "rules.schema.json" and Path(r.out.strip()).is_file()
    r = run("schema", "tests", "--json")
    assert r.rc == 0 and json.loads(r.out)["title"] == "dsv4sel rule tests"


def test_every_shipped_yaml_file_carries_the_modeline():
    # the generated compat rule sets included: their generators write it
    files = [*sorted((REPO / "rules").rglob("*.yaml")), *sorted((REPO / "tests" / "decisions").glob("*.yaml")),
             *sorted((REPO / "examples" / "b12x-pack").rglob("*.yaml"))]
    assert len(files) >= 40 and any("compat" in f.parts for f in files)
    for f in files:
        first = f.read_text().splitlines()[0]
        m = re.fullmatch(r"# yaml-language-server: \$schema=(\S+)", first)
        assert m, f"{f}: first line {first!r}"
        target = (f.parent / m[1]).resolve()
        kind = "tests.schema.json" if "kind: tests" in f.read_text() else "rules.schema.json"
        assert target == (REPO / "dsv4sel" / "schema" / kind).resolve(), f


def test_the_prettier_width_stays_above_the_longest_hand_written_yaml_line():
    """docs/cli.md: Prettier leaves the hand-written YAML files as they are under the
    repository's .prettierrc.yaml, which holds only while no line is wider than its printWidth
    (checked with Prettier itself when the figure was set)."""
    import yaml

    config = yaml.safe_load((REPO / ".prettierrc.yaml").read_text())
    width = next(o["options"]["printWidth"] for o in config["overrides"] if "*.yaml" in o["files"])
    files = [*(REPO / "rules").glob("*.yaml"), *(REPO / "tests" / "decisions").glob("*.yaml"),
             *(REPO / "examples" / "b12x-pack").rglob("*.yaml"), REPO / ".pre-commit-hooks.yaml"]
    longest = max(len(line) for f in files for line in f.read_text().splitlines())
    assert longest <= width, (longest, width)
    assert re.search(rf"longest line\D+{longest} characters", (REPO / "docs" / "cli.md").read_text()), longest


def test_completion_scripts():
    pytest.importorskip("shtab")
    r = run("completion", "bash")
    assert r.rc == 0 and "complete" in r.out
    for word in ("explain", "check", "test", "--kv-cache-dtype", "--allow-impl-module", "sarif"):
        assert word in r.out, word
    assert run("completion", "zsh").rc == 0


def test_completion_without_shtab_names_the_extra(monkeypatch, capsys):
    from dsv4sel.cli import main

    monkeypatch.setitem(sys.modules, "shtab", None)
    assert main(["completion", "bash"]) == 2
    assert "pip install 'dsv4sel[completion]'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["explain", "check", "test", "table", "doctor", "diff", "upgrade", "schema",
                                     "completion"])
def test_help_ends_with_examples(command):
    r = run(command, "--help")
    assert r.rc == 0
    examples = r.out.split("\nexamples:\n")[1]
    assert re.search(rf"^  dsv4sel {command}\b", examples, re.M), r.out


# ------------------------------------------------------------------ Python API

def test_selection_pickles_and_has_as_dict():
    sel = dsv4sel.select(platform="cuda", capability="9.0")
    again = pickle.loads(pickle.dumps(sel))
    assert again == sel and dict(again.rewrites) == {"cache_dtype": "fp8_ds_mla"}
    with pytest.raises(TypeError):
        again.rewrites["x"] = 1  # still read-only
    assert [m.level for m in again.messages] == [m.level for m in sel.messages]
    d = sel.as_dict()
    json.dumps(d)
    assert d["backend"] == "FLASHMLA_SPARSE_DSV4" and d["torch_dtype"] == "uint8"
    assert d["rule"]["id"] == "flashmla-fp8" and d["path"][0]["id"] == "default-cuda-sm9x-sm10x"
    assert d["query"]["capability"] == "9.0" and d["rewrites"] == {"cache_dtype": "fp8_ds_mla"}


def test_select_type_hints_say_what_it_accepts():
    import inspect

    sig = inspect.signature(dsv4sel.select)
    assert sig.parameters["platform"].annotation == "str"
    assert sig.parameters["capability"].annotation == "str | tuple[int, int] | None"
    assert "Any" not in str(sig)


def test_a_pack_alone_gets_one_problem_saying_how_to_add_it(write_rules):
    # how to add it (load_rules([*default_packs(), DIR])) is DSV306's wording: tests/engine/wording.yaml
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules([write_rules(RULES / "quoted")])
    assert [(p.code, str(p.loc)) for p in info.value.problems] == [("DSV306", "rules/xx.yaml:1:1")]


def test_allowed_impl_modules_add_to_the_defaults(tmp_path):
    example = REPO / "examples" / "b12x-pack" / "dsv4sel_b12x" / "rules"
    rules = dsv4sel.load_rules([*dsv4sel.engine.sources.default_packs(), str(example)],
                               allowed_impl_modules=("dsv4sel_b12x",))
    assert rules.allowed_impl_modules[:2] == ("dsv4sel.kernels", "dsv4sel_b12x")
    assert dsv4sel.select(platform="cuda", capability="9.0", rules=rules).backend == "FLASHMLA_SPARSE_DSV4"
    # and verify() agrees
    sys.path.insert(0, str(REPO / "examples" / "b12x-pack"))
    try:
        assert dsv4sel.verify([*dsv4sel.engine.sources.default_packs(), str(example)],
                              allowed_impl_modules="dsv4sel_b12x").ok
    finally:
        sys.path.remove(str(REPO / "examples" / "b12x-pack"))


# ------------------------------------------------------------------ explanations that say why

def test_explain_prints_the_deciding_rule_and_each_steps_description():
    r = run("explain", "--platform", "cuda", "--capability", "12.1")
    assert r.rc == 0, r
    data = json.loads(run("explain", "--platform", "cuda", "--capability", "12.1", "--json").out)
    why = data["rule"]["description"]
    assert why.startswith("On SM120/SM121 auto, fp8 and fp8_e4m3 mean FlashInfer's fp8_ds_mla pages")
    words = lambda text: " ".join(text.split())  # noqa: E731 - a text with its wrapping undone
    section = r.out[r.out.index("\nselected"):r.out.index("\n\nkv contract")]
    assert re.search(r"^  why\s+On SM120/SM121", section, re.M) and words(section).endswith(words(why))
    path = r.out.split("\npath\n")[1].split("\n\n")[0]
    steps = re.split(r"\n(?=  \d  )", "\n" + path)[1:]  # each step with its wrapped lines
    assert steps[0].split()[:2] == ["1", "default-cuda-sm12x"]
    assert "On Blackwell consumer/workstation GPUs (SM120, SM121" in words(steps[0])
    assert steps[1].split()[:2] == ["2", "flashinfer-sm12x-fp8"] and words(steps[1]).endswith(words(why))
    assert [s["description"][:12] for s in data["path"]] == ["On Blackwell", "On SM120/SM1"]


def test_every_shipped_rule_has_a_description():
    rules = dsv4sel.default_rules()
    missing = [rules.rule(i).id for i in range(len(rules.rules)) if not rules.description(i)]
    assert missing == []


@pytest.mark.parametrize("args", [
    ("explain", "--platform", "cuda", "--capability", "10.0", "--kv-cache-dtype", "bfloat16", "--backend", "FLASHMLA_SPARSE"),
    ("explain", "--platform", "rocm", "--capability", "gfx90a"),
    ("explain", "--platform", "cuda", "--backend", "FLASHMLA_SPARS"),
    ("check", "--rules", "no-such-dir"),
    ("test", "tests/decisions", "--only-rules", "--rules", "rules"),
])
def test_text_output_fits_the_terminal(args):
    from _cli import environ

    r = run_tty(*args, env=environ(COLUMNS="64"), both=True)
    lines = ANSI.sub("", r.out).splitlines()  # colour takes no columns
    assert lines and max(len(line) for line in lines) <= 64, "\n".join(line for line in lines if len(line) > 64)


def test_check_text_fits_the_terminal(bad_pack):
    from _cli import environ

    r = run_tty("check", str(bad_pack), env=environ(COLUMNS="72"))
    assert r.rc == 2
    # every line fits, but a path longer than the terminal, which is never split
    assert all(len(line) <= 72 or " " not in line.strip() for line in ANSI.sub("", r.out).splitlines()), r.out
    assert "DSV202" in r.out
    # piped: one line per finding, for grep, whatever COLUMNS says
    piped = run("check", str(bad_pack), env=environ(COLUMNS="72")).out
    (line,) = [line for line in piped.splitlines() if ": error " in line]
    assert line.startswith(f"{bad_pack}/xx.yaml:16:40: error DSV202 ") and line.endswith('"8.9"]')  # whole


def test_an_unknown_backend_is_not_a_700_character_message():
    r = run("explain", "--platform", "cuda", "--backend", "FLASHMLA_SPARS")
    assert r.rc == 2 and "did you mean 'FLASHMLA_SPARSE'?" in r.err
    assert len(r.err) < 600 and "XFORMERS" not in r.err, r.err


# ------------------------------------------------------------------ a pack installed and named with --rules

def test_an_installed_pack_named_again_with_rules_loads_once_everywhere(tmp_path):
    import shutil
    import subprocess

    from _cli import environ

    site, source = tmp_path / "site", tmp_path / "src"
    shutil.copytree(REPO / "examples" / "b12x-pack", source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                    "--target", str(site), str(source)], check=True, capture_output=True)
    env = environ(PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
                  DSV4SEL_CACHE_DIR=str(tmp_path / "cache"))
    working_copy = "examples/b12x-pack/dsv4sel_b12x/rules"  # the same package, dsv4sel_b12x.rules
    once = run("check", "--rules", working_copy, "--allow-impl-module", "dsv4sel_b12x").out.splitlines()[0]
    for rules in (working_copy, str(site / "dsv4sel_b12x" / "rules")):
        check = run("check", "--rules", rules, env=env)
        assert check.rc == 0 and check.out.splitlines()[0] == once, check  # loaded once, not twice
        explain = run("explain", "--platform", "cuda", "--capability", "12.1", "--rules", rules, env=env)
        assert explain.rc == 0 and "selected  B12X_MLA_SPARSE (platform default)" in explain.out, explain
        diff = run("diff", "--pack", "-", rules, env=env)  # the installed pack is in both sides
        assert diff.rc == 0 and diff.out.startswith("no change"), diff
        test = run("test", "examples/b12x-pack/tests", "--rules", rules, env=env)
        assert test.rc == 0 and "7 of 7 rules reached" in test.out, test
    # the working copy is what is explained (its file and line), with the installed pack's impl allowance
    explain = run("explain", "--platform", "cuda", "--capability", "12.1", "--rules", working_copy, env=env)
    assert f"{working_copy}/b12x.yaml:" in explain.out


def test_rule_errors_fit_the_terminal(tmp_path):
    from _cli import environ

    pack = tmp_path / "long"
    shutil.copytree(RULES / "long", pack)  # a temporary path: longer than the terminal below
    r = run_tty("explain", "--platform", "cuda", "--rules", str(pack), env=environ(COLUMNS="60"), both=True)
    assert r.rc == 2 and "did you mean 'fp8_e4m3'?" in r.out
    # a word longer than the terminal (this temporary path) stays whole: wrapping never splits one
    assert all(len(line) <= 60 or " " not in line.strip() or len(max(line.split(), key=len)) > 60 - 8
               for line in ANSI.sub("", r.out).splitlines()), r.out
    piped = run("explain", "--platform", "cuda", "--rules", str(pack))
    assert len(piped.err.strip().splitlines()) == 5  # the head line and one per problem


def test_test_failures_as_sarif():
    r = run("test", "tests/cli/cases/wrong_xpu.yaml", "--format", "sarif")
    assert r.rc == 1, r
    (result,) = json.loads(r.out)["runs"][0]["results"]
    assert result["ruleId"] == "DSV510" and result["message"]["text"].startswith("case wrong: expected backend")
    assert result["locations"][0]["physicalLocation"]["region"] == {"startLine": 5, "startColumn": 14}
