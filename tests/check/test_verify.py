"""dsv4sel.verify: what it finds, where it says it is, and the shipped rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks"))

from _verify_programs import Reference  # noqa: E402
from test_cases import case_report  # noqa: E402
from test_verify_properties import gap_inputs  # noqa: E402

import dsv4sel  # noqa: E402
from dsv4sel.dsv4.profile import PROFILE  # noqa: E402
from dsv4sel.check.cubes import describe  # noqa: E402
from dsv4sel.engine.space import merge  # noqa: E402
from dsv4sel.check.findings import VerifyError  # noqa: E402
from dsv4sel.api import verify  # noqa: E402
from dsv4sel.check.verifier import verify_program  # noqa: E402

STRUCTURAL = ("gap", "overlap", "redundant", "shadowed", "dead", "fixpoint", "dangling", "cycle", "vocabulary",
              "schema", "load", "compile")


def shipped_program():
    from dsv4sel.engine import sources
    from dsv4sel.engine.build import build_program

    packs = sources.default_packs()
    srcs = [s for p in packs for s in p.sources()]
    allowed = tuple(dict.fromkeys((*dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES, *(m for p in packs for m in p.impl_modules))))
    return build_program(srcs, allowed, PROFILE)


@pytest.fixture(scope="module")
def shipped():
    program = shipped_program()
    return program, verify_program(program)


# ------------------------------------------------------------ shipped rules

def test_shipped_rules_have_no_structural_finding(shipped):
    """Complete, no overlap under unique, nothing shadowed, dead or redundant,
    every rewrite a fixpoint."""
    _, report = shipped
    assert report.analysed
    assert [str(f) for f in report.findings if f.kind in STRUCTURAL] == []
    assert report.coverage.totals.undecided == 0


def test_shipped_rules_are_clean(shipped):
    _, report = shipped
    assert [str(f) for f in report.findings] == []


def test_shipped_coverage_equals_evaluating_every_input(shipped):
    program, report = shipped
    ref = Reference(program)
    counts = ref.counts()
    cov = report.coverage
    assert cov.points == len(ref.points)
    assert cov.inputs == len(ref.points) * (1 + len(program.backends)) == cov.totals.total
    for b in cov.backends:
        assert (b.counts.select, b.counts.reject, b.counts.undecided) == tuple(counts[b.backend].values())
    on_path: dict[str, int] = {}
    for start in (None, *program.backends):
        for point in ref.points:
            for rule in program.resolve(start, point).path:
                on_path[rule.ref.id] = on_path.get(rule.ref.id, 0) + 1
    assert {r.rule.id: r.inputs for r in cov.rules} == {r.ref.id: on_path.get(r.ref.id, 0) for r in program.rules}


def test_verify_accepts_paths_ruleset_and_program(shipped):
    from dsv4sel.check.host_spaces import with_host_spaces

    program, verified = shipped
    # the default rules also get the per-host stage (the shipped host translations)
    report = with_host_spaces(verified, dsv4sel.default_rules())
    assert report.hosts and report.findings == verified.findings
    assert verify() == report
    assert verify(program) == report
    assert verify(dsv4sel.default_rules()) == report
    assert dsv4sel.verify is verify and isinstance(report, dsv4sel.Report)


def test_report_is_plain_data(shipped):
    _, report = shipped
    data = json.loads(json.dumps(report.to_dict()))
    assert data["coverage"]["inputs"] == report.coverage.inputs
    assert data["ok"] is report.ok


def test_import_stays_light_and_verify_stays_a_function():
    code = textwrap.dedent("""
        import sys, dsv4sel
        heavy = [m for m in ("yaml", "jsonschema", "torch") if m in sys.modules]
        assert not heavy, heavy
        import dsv4sel.check.verifier, dsv4sel.check.findings
        assert callable(dsv4sel.verify) and dsv4sel.verify is dsv4sel.api.verify
        assert dsv4sel.VerifyError.__mro__[1] is ValueError
        assert "torch" not in sys.modules
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ------------------------------------------------------------ unusable input

def test_unusable_input_raises_verify_error(tmp_path):
    with pytest.raises(VerifyError, match="does not exist"):
        verify([str(tmp_path / "nope")])
    with pytest.raises(VerifyError, match="no rule files"):
        verify([str(tmp_path)])
    assert issubclass(VerifyError, ValueError)


# ------------------------------------------------------------ rule files

#: rule sets as files: tests/rules/small/ (a vocabulary, everything to backend A) and A's table,
#: one folder per variant
SMALL = Path(__file__).resolve().parent.parent / "rules" / "small"
RULES = Path(__file__).with_name("rules") / "verify"


def line_of(path: str, needle: str) -> int:
    with open(path) as fh:
        return next(i for i, text in enumerate(fh, 1) if needle in text)


# The findings of these cases (codes, locations, rules, cubes) are checked by
# tests/check/test_cases.py; what a case file cannot say is checked here.

def test_a_clean_case_covers_every_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = case_report("clean_table", tmp_path)
    assert report.ok
    assert report.coverage.totals.select == 2 * 3 * 5  # 2 requests x 3 dtypes x 5 cuda capabilities


def test_a_gap_carries_a_counterexample_and_prints_its_code(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (gap,) = case_report("gap_in_first_table", tmp_path).findings
    assert gap.counterexample.as_dict() == {"model": "m", "platform": "cuda", "capability": "12.0",
                                            "backend": None, "kv_cache_dtype": "float16"}
    assert (gap.code, str(gap.loc), gap.count) == ("DSV401", "rules/a.yaml:2", 4)
    assert str(gap).startswith("rules/a.yaml:2: error DSV401 [gap] ")  # printed: location, severity, code, kind


def test_an_overlap_gives_an_input_both_rules_match(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (f,) = case_report("overlap_under_unique", tmp_path).findings
    assert f.counterexample.as_dict()["kv_cache_dtype"] == "fp8"
    assert f.rules[1].line == line_of("rules/a.yaml", "id: a-fp8")


def test_a_dead_rule_has_no_counterexample(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    dead = case_report("shadowed_dead_redundant", tmp_path).of_kind("dead")[0]
    assert dead.counterexample is None


def test_a_fixpoint_finding_shows_the_rewritten_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (fix,) = case_report("selection_checks", tmp_path).of_kind("fixpoint")
    assert fix.counterexample.as_dict()["kv_cache_dtype"] in ("auto", "fp8")


def test_problems_stop_the_analysis(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = case_report("file_problems", tmp_path)
    assert not report.analysed and report.coverage is None


# -------------------------------------------------------------- building blocks

def test_describe_compacts_values():
    domain = ["9.0", "10.0", "10.3", "12.0", "12.1", "unknown"]
    assert describe(["12.0", "12.1"], domain) == "12.x"
    assert describe(["9.0", "10.0", "10.3"], domain) == "9.0,10.x"
    assert describe(domain, domain) == "*"
    assert describe(["9.0", "10.0", "10.3", "12.0", "12.1"], domain) == "not(unknown)"
    assert describe([None], [None, "A", "B"]) == "<none>"


def test_merge_keeps_the_union():
    # {0}x{0} + {0}x{1} + {1}x{0,1}: one 2x2 cube, carrying both payloads
    boxes = [((1, 1), frozenset("a")), ((1, 2), frozenset("b")), ((2, 3), frozenset())]
    assert merge(boxes) == [((3, 3), frozenset("ab"))]
    # cubes that differ in two dimensions stay apart
    assert merge([((1, 1), frozenset()), ((2, 2), frozenset())]) == [((1, 1), frozenset()), ((2, 2), frozenset())]


def test_benchmark_table_agrees_with_brute_force():
    """The synthetic tables of benchmarks/bench_verify.py (families, several
    extra inputs, grid boxes, widened overlaps), small enough to enumerate."""
    from bench_verify import synthetic_program

    for policy in ("unique", "first"):
        program = synthetic_program(3000, 60, policy, seed=3)
        report = verify_program(program)
        ref = Reference(program)
        assert gap_inputs(report) == ref.input_gaps()
        pairs = ref.pairs()
        assert {(f.table, f.rules[0].id, f.rules[1].id) for f in report.of_kind("overlap")} == pairs["overlap"]
        assert {(f.table, f.rules[0].id, f.rules[1].id) for f in report.of_kind("redundant")} == pairs["redundant"]
        if policy == "unique":  # dropped grid cells are gaps, widened boxes overlap
            assert report.of_kind("gap") and report.of_kind("overlap")
        else:  # the catch-all decides everything; overlaps are how first works
            assert not report.of_kind("gap") and report.coverage.totals.undecided == 0


def test_layouts_can_be_given_and_a_broken_layout_module_is_a_finding(write_rules, monkeypatch):
    from types import SimpleNamespace

    from dsv4sel.check import outcomes
    from dsv4sel.engine.build import build_program
    from dsv4sel.engine.sources import expand

    directory = write_rules(SMALL, RULES / "catch_all")
    program = build_program(expand(directory), ("dsv4sel.kernels",), PROFILE)
    assert verify_program(program).ok  # reject-only: nothing selected, nothing to check
    directory = write_rules(RULES / "select_all")
    program = build_program(expand(directory), ("dsv4sel.kernels",), PROFILE)
    own = {"fp8_ds_mla": SimpleNamespace(bytes_per_token=600, torch_dtype_name="uint8")}
    (finding,) = verify_program(program, layouts=own).findings
    assert finding.code == "DSV408" and "600" in finding.message  # the size of the layouts given
    monkeypatch.setattr(outcomes, "LAYOUTS_MODULE", "dsv4sel.kernels.no_such_layouts")
    (finding,) = verify_program(program).findings
    assert finding.code == "DSV407" and "no_such_layouts" in finding.message  # the module it could not read


def test_verify_a_ruleset_loaded_from_a_directory(write_rules):
    directory = write_rules(SMALL, RULES / "catch_all")
    ruleset = dsv4sel.load_rules([directory])
    assert verify(ruleset) == verify([directory])
    write_rules(RULES / "catch_all_and_later")  # the files changed since loading
    with pytest.raises(VerifyError, match="cannot find the rule files"):
        verify(ruleset)



def _served_then_rejected(program) -> int:
    """Point by point (the specification, ``Program.resolve``): the inputs without a requested
    backend that the default rules of the first pack alone got selected and the program rejects."""
    import copy

    before = copy.copy(program)
    before.default_table = copy.copy(program.default_table)
    first = program.rules[0].ref.pack
    before.default_table.rules = [r for r in program.default_table.rules if r.ref.pack == first]
    points: list[dict] = [{}]
    for name, decl in program.inputs.items():
        points = [{**p, name: v} for p in points for v in decl.values_for(p)]
    return sum(1 for p in points
               if program.resolve(None, p).kind == "reject" and before.resolve(None, p).kind == "select")


@pytest.mark.parametrize(("pack", "codes", "lost"), [
    ("widened-override", ["DSV414"], 16),
    ("hijacking-override", ["DSV413"], 16),  # its table rejects everything: DSV413 says it, once
    ("clean", [], 0),
])
def test_a_takeover_counts_exactly_the_inputs_a_pack_turned_from_served_to_rejected(pack, codes, lost):
    # DSV414 scans cubes; the reference resolves every point with and without the pack's default rules
    from _cli import REPO
    from dsv4sel.engine.build import build_program

    _, srcs, allowed = dsv4sel.api.resolve(extra=[str(REPO / "examples" / "mistakes" / pack)])
    program = build_program(srcs, allowed, PROFILE)
    assert _served_then_rejected(program) == lost
    findings = verify_program(program).findings
    assert [f.code for f in findings] == codes
    assert [f.count for f in findings if f.code == "DSV414"] == ([lost] if codes == ["DSV414"] else [])
