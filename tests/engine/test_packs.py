"""Rule packs: installed (entry points), DSV4SEL_RULES_PATH and --rules; precedence and overrides."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel import RuleError
from dsv4sel.engine.sources import default_packs, directory_pack

from _repo import REPO

EXAMPLE = os.path.join(REPO, "examples", "b12x-pack")
EXAMPLE_RULES = os.path.join(EXAMPLE, "dsv4sel_b12x", "rules")
#: this file's own packs, one folder each
RULES = Path(__file__).with_name("rules") / "packs"


def _shown(path) -> str:
    """A rule file's name as problems give it: relative to the working directory when below it."""
    rel = os.path.relpath(path)
    return str(path) if rel.startswith("..") else rel


@pytest.fixture
def example_importable(monkeypatch):
    monkeypatch.syspath_prepend(EXAMPLE)


def with_example(**kw):
    return dsv4sel.load_rules([*default_packs(), EXAMPLE_RULES],
                              allowed_impl_modules=("dsv4sel.kernels", "dsv4sel_b12x"), **kw)


def test_a_directory_pack_adds_a_backend_and_names_itself(example_importable):
    rules = with_example()
    sel = dsv4sel.select(platform="cuda", capability="12.0", backend="B12X_MLA_SPARSE", rules=rules)
    assert (sel.backend, sel.layout, sel.bytes_per_token) == ("B12X_MLA_SPARSE", "fp8_ds_mla", 584)
    assert sel.rule.pack == "dsv4sel_b12x" and sel.rule.file.endswith("dsv4sel_b12x/rules/b12x.yaml")
    assert sel.load_impl().__name__ == "B12XMLASparseImpl"


def test_a_pack_overrides_a_default_only_where_it_says_so(example_importable):
    rules = with_example()
    assert dsv4sel.select(platform="cuda", capability="12.1", rules=rules).backend == "B12X_MLA_SPARSE"
    # SM120 keeps the shipped default: the pack's override names 12.1 only
    assert dsv4sel.select(platform="cuda", capability="12.0", rules=rules).backend == "FLASHINFER_MLA_SPARSE_DSV4"


def test_without_override_a_pack_default_cannot_displace_the_shipped_one(tmp_path):
    rules = dsv4sel.load_rules([*default_packs(), str(RULES / "quiet")])  # 12.1 to FLASHMLA, no override
    assert dsv4sel.select(platform="cuda", capability="12.1", rules=rules).backend == "FLASHINFER_MLA_SPARSE_DSV4"


def test_a_pack_may_not_take_over_an_existing_backend_table():
    pack = RULES / "hijack"  # a table for FLASHMLA_SPARSE_DSV4
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules([*default_packs(), str(pack)])
    assert [(p.code, p.file, p.line) for p in info.value.problems] == [("DSV308", _shown(pack / "flashmla.yaml"), 2)]


def test_override_is_refused_outside_the_default_decision():
    pack = RULES / "override_in_backend"  # a backend table's rule with `override: true`
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules([*default_packs(), str(pack)])
    assert [(p.code, p.file, p.line) for p in info.value.problems] == [("DSV309", _shown(pack / "x.yaml"), 6)]


def test_a_directory_pack_cannot_import_its_impl_without_an_explicit_allowance():
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules([*default_packs(), EXAMPLE_RULES])
    assert {p.code for p in info.value.problems} == {"DSV310"}
    assert {p.file for p in info.value.problems} == {_shown(os.path.join(EXAMPLE_RULES, "b12x.yaml"))}


def test_environment_packs_join_the_default_set(monkeypatch):
    monkeypatch.setenv("DSV4SEL_RULES_PATH", os.pathsep.join([EXAMPLE_RULES, "/elsewhere/rules"]))
    packs = default_packs()
    assert [p.name for p in packs][:1] == ["dsv4sel"]
    assert packs[-2] == directory_pack(EXAMPLE_RULES) and packs[-2].name == "dsv4sel_b12x"
    assert packs[-1].path == "/elsewhere/rules"


def test_an_installed_pack_is_found_through_its_entry_point(tmp_path):
    site, source = tmp_path / "site", tmp_path / "src"
    # build from a copy: an in-tree build leaves *.egg-info metadata next to the example
    shutil.copytree(EXAMPLE, source)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
                    "--target", str(site), str(source)], check=True, capture_output=True)
    code = textwrap.dedent("""\
        import dsv4sel
        sel = dsv4sel.select(platform="cuda", capability="12.1")
        print(sel.backend, sel.rule.pack, sel.rule.file, sel.load_impl().__name__)
        """)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), DSV4SEL_CACHE_DIR=str(tmp_path / "cache"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(tmp_path), check=True).stdout.split()
    assert out == ["B12X_MLA_SPARSE", "b12x", "b12x/b12x.yaml", "B12XMLASparseImpl"]


def test_explain_names_the_pack_that_decided():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([EXAMPLE, os.environ.get("PYTHONPATH", "")]))
    dsv4sel_cli = os.path.join(os.path.dirname(sys.executable), "dsv4sel")
    result = subprocess.run([dsv4sel_cli, "explain", "--platform", "cuda", "--capability", "12.1",
                             "--rules", EXAMPLE_RULES, "--allow-impl-module", "dsv4sel_b12x"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    assert "selected  B12X_MLA_SPARSE (platform default)" in result.stdout
    assert "b12x-fp8" in result.stdout and "(pack dsv4sel_b12x)" in result.stdout


def test_the_example_pack_checks_clean_combined_with_the_shipped_rules():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([EXAMPLE, os.environ.get("PYTHONPATH", "")]))
    dsv4sel_cli = os.path.join(os.path.dirname(sys.executable), "dsv4sel")
    result = subprocess.run([dsv4sel_cli, "check", "--rules", EXAMPLE_RULES, "--allow-impl-module", "dsv4sel_b12x"],
                            capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "B12X_MLA_SPARSE" in result.stdout and result.stdout.rstrip().splitlines()[-1].startswith("clean:")


@pytest.mark.parametrize("entry", ["", "a..b", "my_pack.", "../x", "own;rm"])
def test_every_way_to_allow_an_impl_module_refuses_the_same_entries(entry, monkeypatch):
    # issue 32 point 11: allowed_impl_modules=[''] and --allow-impl-module '' were taken, though
    # the environment variable refused them; one test now holds each way in, with one wording
    from _cli import run

    said = f"{entry!r} is not a dotted module name; write e.g. my_pack.kernels"
    with pytest.raises(RuleError) as api:
        dsv4sel.load_rules(allowed_impl_modules=["dsv4sel_b12x", entry])
    assert [(p.code, str(p.loc), p.message) for p in api.value.problems] == [
        ("DSV310", "<allowed_impl_modules>:1:1", f"allowed_impl_modules: {said}")]
    with pytest.raises(RuleError):
        dsv4sel.verify(allowed_impl_modules=(entry,))
    cli = run("explain", "--platform", "cuda", "--allow-impl-module", entry)
    assert cli.rc == 2 and cli.err.endswith(f"error: argument --allow-impl-module: {said}\n"), cli
    if entry:  # the variable's empty entries are the separators' (`a,,b`), skipped
        monkeypatch.setenv("DSV4SEL_ALLOW_IMPL_MODULES", entry)
        with pytest.raises(RuleError) as env:
            dsv4sel.load_rules()
        assert [p.message for p in env.value.problems] == [f"DSV4SEL_ALLOW_IMPL_MODULES: {said} (comma-separated)"]


def test_a_module_name_in_any_way_in_is_taken(monkeypatch):
    assert dsv4sel.load_rules(allowed_impl_modules="my_pack.kernels").allowed_impl_modules[-1] == "my_pack.kernels"
    monkeypatch.setenv("DSV4SEL_ALLOW_IMPL_MODULES", " my_pack.kernels ,, other ")
    assert dsv4sel.load_rules().allowed_impl_modules[-2:] == ("my_pack.kernels", "other")


def test_a_pack_from_the_environment_without_its_module_allowed_names_the_variable_first(monkeypatch):
    # issue 32 point 19: the serving process (select(), the plugins) has no command line; the
    # message named --allow-impl-module and allowed_impl_modules=, not the variable it needs
    pack = RULES / "own_module"
    monkeypatch.setenv("DSV4SEL_RULES_PATH", str(pack))
    monkeypatch.delenv("DSV4SEL_ALLOW_IMPL_MODULES", raising=False)
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules()
    (problem,) = info.value.problems
    assert (problem.code, problem.file, problem.line) == ("DSV310", _shown(pack / "own.yaml"), 8)
    assert problem.message.endswith(
        "; to allow it, set DSV4SEL_ALLOW_IMPL_MODULES=my_pack beside DSV4SEL_RULES_PATH, which names this "
        "pack, or pass --allow-impl-module my_pack (Python: allowed_impl_modules=('my_pack',)), or install the "
        "pack with an entry point in group dsv4sel.rules, whose top-level package may name impl classes")
    # the same pack given by the caller: the caller's own ways first, the variable still named
    monkeypatch.delenv("DSV4SEL_RULES_PATH")
    with pytest.raises(RuleError) as given:
        dsv4sel.load_rules(extra=[str(pack)])
    assert ("to allow it, pass --allow-impl-module my_pack (Python: allowed_impl_modules=('my_pack',)), set "
            "DSV4SEL_ALLOW_IMPL_MODULES=my_pack in a serving process's environment, or install the pack"
            ) in given.value.problems[0].message
    # and with the variable set, the pack loads
    monkeypatch.setenv("DSV4SEL_RULES_PATH", str(pack))
    monkeypatch.setenv("DSV4SEL_ALLOW_IMPL_MODULES", "my_pack")
    assert "OWN_MLA_SPARSE" in dsv4sel.load_rules().backends


def test_the_hints_name_the_variables_the_sources_read():
    from dsv4sel.engine import hints, sources

    assert (hints.ALLOW_IMPL_ENV, hints.RULES_PATH_ENV) == (sources.ALLOW_IMPL_ENV, sources.RULES_PATH_ENV)
