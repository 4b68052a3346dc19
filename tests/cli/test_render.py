"""The operator tools return typed values; the CLI parses, calls and renders them.

Each command's output is made in ``dsv4sel.cli.render`` from the value a tool
returns, so rendering the value in process gives the command's bytes. The
machine ``doctor`` reports is the one ``explain --detect`` fills its query
from, and an impl's availability has one answer, the kernels'.
"""

from __future__ import annotations

import json

import pytest

import dsv4sel
from dsv4sel.cli.render import diff as render_diff
from dsv4sel.cli.render.data import document
from dsv4sel.cli.render.text import Style
from dsv4sel.dsv4 import platform as machine_platform
from dsv4sel.dsv4.platform import InputProbe, Machine, impl_available, machine
from dsv4sel.tools.diff import ABSENT, Change, Diff, Outcome, diff
from dsv4sel.tools.upgrade import Category, Detail, Gist, Group, Upgrade, View
from dsv4sel.tools.doctor import Report, build_report, impl_checks
from dsv4sel.dsv4.contract import KVContract
from dsv4sel.dsv4.kvmemory import KVMemory
from dsv4sel.tools.explain import Explanation, explain
from dsv4sel.tools.fleet import FleetReport
from dsv4sel.tools.matrix import Matrix, build_matrix

from _cli import REPO, environ, run
from _rule_text import edited_shipped_rules

CPU = environ(DSV4SEL_PLATFORM="cpu", CUDA_VISIBLE_DEVICES="")
PLAIN = Style(False)  # what a pipe gets


@pytest.fixture(scope="module")
def rules():
    return dsv4sel.default_rules()


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    """A copy of the shipped rules in which SM12x defaults to FlashMLA (as in test_diff)."""
    return edited_shipped_rules(tmp_path_factory.mktemp("edited") / "rules")


# ---------------------------------------------------------------- values, not text

RENDERING = ("to_markdown", "to_json", "to_text", "to_dict", "render", "lines", "describe")


@pytest.mark.parametrize("kind", [Matrix, Diff, Change, Outcome, Explanation, Report, Machine, InputProbe,
                                  FleetReport, KVContract, KVMemory, Upgrade, Category, Group, Detail, Gist, View])
def test_the_tools_values_carry_no_rendering(kind):
    # as_dict() is a value's data (JSON-ready, versioned); text of any kind is cli/render's
    assert [name for name in RENDERING if hasattr(kind, name)] == []


def test_no_tool_module_renders():
    import dsv4sel.tools.diff
    import dsv4sel.tools.matrix
    import dsv4sel.tools.testcases

    assert not hasattr(dsv4sel.tools.diff, "describe_outcome")
    assert not hasattr(dsv4sel.tools.matrix, "GENERATE_COMMAND")
    assert not hasattr(dsv4sel.tools.testcases.CaseResult, "lines")


# ---------------------------------------------------------------- one rendering, the CLI's

def test_the_support_matrix_markdown_is_the_committed_page_and_the_cli_output(rules):
    from dsv4sel.cli.render.table import markdown

    text = markdown(build_matrix(rules))
    assert text == (REPO / "docs" / "backends.md").read_text()
    assert run("table", "--format", "md").out == text


def test_the_support_matrix_json_is_its_as_dict(rules):
    matrix = build_matrix(rules)
    out = run("table", "--format", "json").out
    assert out == document(matrix.as_dict())
    assert json.loads(out)["rows"][0]["backend"] == matrix.rows[0].backend


def test_diff_returns_outcomes_and_the_cli_prints_their_rendering(rules, edited):
    result = diff(rules, dsv4sel.load_rules(paths=[edited]))
    assert all(isinstance(c.old, Outcome) and isinstance(c.new, Outcome) for c in result.changes)
    lost = next(c for c in result.changes if c.old.kind == "select")  # SM12x loses its FlashInfer default
    assert (lost.old.backend, lost.old.layout, lost.new.kind, lost.new.backend) == \
        ("FLASHINFER_MLA_SPARSE_DSV4", "fp8_ds_mla", "reject", "FLASHMLA_SPARSE_DSV4")
    assert render_diff.outcome(lost.old).startswith("select FLASHINFER_MLA_SPARSE_DSV4 layout=fp8_ds_mla ")
    assert render_diff.outcome(lost.new).startswith("reject (FLASHMLA_SPARSE_DSV4): FlashMLA's sparse kernels")
    assert render_diff.outcome(ABSENT) == "not in the decision space"
    shipped = str(REPO / "rules")
    text = run("diff", shipped, edited)
    assert (text.rc, text.out) == (1, render_diff.text(result))
    data = run("diff", "--json", shipped, edited)
    assert data.out == document(render_diff.as_dict(result))
    assert json.loads(data.out)["changed"] == result.changed == 184


def test_diff_of_identical_rule_sets_renders_no_change(rules):
    result = diff(rules, rules)
    assert result.changes == () and render_diff.text(result) == \
        f"no change: {result.compared} inputs decide the same way\n"


@pytest.mark.parametrize("query", [
    dict(platform="cuda", capability="9.0"),
    dict(platform="cuda", capability="10.0", kv_cache_dtype="bfloat16"),
    dict(platform="rocm", capability="gfx942", backend="FLASHMLA_SPARSE_DSV4"),
])
def test_explain_renders_the_explanation_it_is_given(rules, query):
    from dsv4sel.cli.render.explain import report_text
    from dsv4sel.cli.render.text import PIPE_WIDTH

    ex = explain(rules, **query)
    argv = ["explain"] + [f"--{k.replace('_', '-')}={v}" for k, v in query.items()]
    text = run(*argv)
    assert text.rc == (0 if ex.ok else 1)
    assert text.out == report_text(ex, PLAIN, PIPE_WIDTH)
    assert run(*argv, "--json").out == document(ex.as_dict())


def test_doctor_renders_the_report_it_is_given(rules):
    from dsv4sel.cli.render.doctor import report_text

    report = build_report(rules, "cuda", "9.0")
    text = run("doctor", "--platform", "cuda", "--capability", "9.0", env=CPU)
    assert text.out == report_text(report, PLAIN, None)  # piped: its tables are not wrapped
    assert run("doctor", "--platform", "cuda", "--capability", "9.0", "--json", env=CPU).out == \
        document(report.as_dict())


def test_check_and_test_render_their_reports(tmp_path, monkeypatch):
    from dsv4sel.cli.render import check as render_check
    from dsv4sel.cli.render import test as render_test
    from dsv4sel.cli.render.diagnostics import github
    from dsv4sel.tools.testcases import load_cases, run_tests

    report = dsv4sel.verify()
    assert run("check").out == render_check.text(report)
    assert run("check", "--format", "github").out == github(render_check.diagnostics(report)) == ""
    cases = tmp_path / "t.yaml"
    cases.write_text((REPO / "tests" / "cli" / "cases" / "wrong_cpu.yaml").read_text())  # named from its copy
    monkeypatch.chdir(tmp_path)  # test files are named relative to the working directory
    found, files = load_cases([str(cases)])
    result = run_tests(dsv4sel.default_rules(), found, files=files)
    out = run("test", str(cases), cwd=tmp_path)
    assert out.rc == 1 and out.out == render_test.text(result)
    assert out.out.startswith("t.yaml:5:14: case wrong: expected backend FLASHMLA_SPARSE_DSV4, got ")
    assert run("test", str(cases), "--format", "github", cwd=tmp_path).out == \
        github(render_test.diagnostics(result))


# ---------------------------------------------------------------- one machine

def _no_gpu(monkeypatch, env: str | None = None, capability: str | None = None):
    monkeypatch.setattr(machine_platform, "probe_torch", lambda: (None, "torch sees no GPU"))
    for name, value in (("DSV4SEL_PLATFORM", env), ("DSV4SEL_CAPABILITY", capability)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)


def test_a_given_machine_is_asked_about_as_given(rules):
    m = machine(rules, "cuda", "9.0")
    assert (m.platform, m.capability, m.source, m.given, m.detected) == ("cuda", "9.0", "--platform", True, False)
    assert m.target == ("cuda", "9.0")
    assert [p.name for p in m.probes] == list(rules.probes) and set(m.inputs) == set(rules.probes)
    assert machine(rules, "cpu", "unknown").target == ("cpu", None)  # the kernels' word for unknown is None


def test_a_detected_machine_says_where_it_came_from(rules, monkeypatch):
    _no_gpu(monkeypatch, env="cpu")
    m = machine(rules)
    assert (m.platform, m.capability, m.source, m.detected) == ("cpu", None, "DSV4SEL_PLATFORM", True)
    assert m.target == (None, None)  # the kernels look at this machine themselves
    m = machine(rules, capability="unknown")
    assert (m.capability, m.source) == ("unknown", "DSV4SEL_PLATFORM, --capability")


def test_an_undetectable_machine_is_a_value_not_an_error(rules, monkeypatch):
    _no_gpu(monkeypatch)
    m = machine(rules)
    assert m.platform is None and not m.detected and "cannot detect the platform" in m.problem
    assert m.probes  # the probes still ask the kernels about this machine


def test_explain_detect_and_doctor_read_the_same_machine():
    doctor = json.loads(run("doctor", "--json", env=CPU).out)
    ex = json.loads(run("explain", "--detect", "--json", env=CPU).out)
    query = ex["query"]
    assert (query["platform"], query["capability"]) == (doctor["query"]["platform"], doctor["query"]["capability"])
    assert {p["input"]: p["value"] for p in doctor["probes"]} == {k: query[k] for k in (p["input"] for p in doctor["probes"])}


def test_explain_detect_with_a_platform_asks_about_that_platform():
    # --platform names the machine, as doctor's does: nothing of it is detected, so the
    # capability this machine claims (cuda 9.0 here) is not taken for it
    fake = environ(DSV4SEL_PLATFORM="cuda", DSV4SEL_CAPABILITY="9.0", CUDA_VISIBLE_DEVICES="")
    detected = json.loads(run("explain", "--detect", "--json", env=fake).out)["query"]
    assert (detected["platform"], detected["capability"]) == ("cuda", "9.0")
    r = run("explain", "--detect", "--platform", "cuda", "--json", env=fake)
    assert json.loads(r.out)["query"]["capability"] == "unknown"
    doctor = json.loads(run("doctor", "--platform", "cuda", "--json", env=fake).out)
    assert doctor["machine"]["capability"] == "unknown" and doctor["machine"]["source"] == "--platform"


# ---------------------------------------------------------------- one availability

def test_the_doctor_and_the_kernels_agree_on_every_impl(rules):
    from dsv4sel.kernels import availability_report

    kernels = {s.spec: (s.available, s.reason) for s in availability_report("cpu", None)}
    checks = {c.impl: (c.available, c.reason) for c in impl_checks(rules, "cpu", None)}
    shared = sorted(set(kernels) & set(checks))
    assert shared and [checks[s] for s in shared] == [kernels[s] for s in shared]
    # a probe asked (mega-attention on SM10x) gives the kernels' own answer
    on_sm100 = {s.spec: s.reason for s in availability_report("cuda", "10.0")}
    asked = [p for p in machine(rules, "cuda", "10.0").probes if p.asked]
    assert asked and all(p.reason == on_sm100[p.impl] for p in asked if p.impl in on_sm100)


def test_an_impl_that_cannot_answer_is_unavailable_with_the_reason():
    from dsv4sel.kernels.platform import impl_availability

    class Silent:
        pass

    class Broken:
        @classmethod
        def is_available(cls, platform=None, capability=None):
            raise ZeroDivisionError("boom")

    assert impl_availability(Silent) == (False, "Silent has no is_available() classmethod")
    assert impl_availability(Broken, "cpu") == (False, "is_available() raised ZeroDivisionError: boom")
    ok, reason = impl_available("os:path", ("os",))
    assert not ok and reason.startswith("cannot load: ")
    ok, reason = impl_available("elsewhere:Impl", ("dsv4sel.kernels",))
    assert not ok and reason.startswith("cannot load: ")



def test_fleet_s_text_and_json_are_its_report_rendered_in_process(rules):
    from dsv4sel.cli.render.fleet import report_lines
    from dsv4sel.tools.deployment import load_deployment
    from dsv4sel.tools.fleet import decide_fleet

    path = "tests/tools/fleet/row09_sglang_v41_h200_b200_pd.yaml"
    report = decide_fleet(load_deployment(str(REPO / path)), rules, "engine")
    cli = run("fleet", path, "--as", "engine")
    assert cli.out == "\n".join(report_lines(report.replace(file=path), PLAIN)) + "\n"
    assert run("fleet", path, "--as", "engine", "--json").out == document(report.replace(file=path).as_dict())


def test_a_location_inside_the_installed_package_is_shown_from_the_package_on():
    """In a wheel install the shipped rules lie in site-packages: a report names them
    ``dsv4sel/rules/flashmla.yaml:34``, not by a path as long as the line."""
    import os

    import dsv4sel
    from dsv4sel.cli.render.text import location
    from dsv4sel.errors import Loc

    package = os.path.dirname(os.path.abspath(dsv4sel.__file__))
    inside = os.path.join(package, "schema", "rules.schema.json")  # a file the package holds
    assert location(Loc(inside, 34)) == "dsv4sel/schema/rules.schema.json:34"
    outside = str(REPO / "rules" / "flashmla.yaml")
    assert location(Loc(outside, 34)) == f"{outside}:34"  # any other file: as it opens from here


def test_a_path_with_blanks_is_never_wrapped_inside():
    from dsv4sel.cli.render.text import unbroken, wrap_lines

    path = "/home/me/My Rules/pack one/flashmla.yaml:34"
    lines = wrap_lines([f"  decided by  flashmla-fp8  {unbroken(path)} and more words after it"], 30)
    assert any(path in line for line in lines), lines
    assert all("\ue000" not in line for line in lines)
