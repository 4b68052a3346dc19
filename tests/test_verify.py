"""dsv4sel.verify: what it finds, where it says it is, and the shipped rules."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))

from _verify_programs import DEFAULTS, HEAD, VOCAB, Reference  # noqa: E402
from test_verify_properties import gap_inputs  # noqa: E402

import dsv4sel  # noqa: E402
from dsv4sel.cubes import describe  # noqa: E402
from dsv4sel.space import merge  # noqa: E402
from dsv4sel.findings import Report, VerifyError  # noqa: E402
from dsv4sel.verifier import verify, verify_program  # noqa: E402

STRUCTURAL = ("gap", "overlap", "redundant", "shadowed", "dead", "fixpoint", "dangling", "cycle", "vocabulary",
              "schema", "load", "compile")


def shipped_program():
    from dsv4sel import sources
    from dsv4sel.build import build_program

    packs = sources.default_packs()
    srcs = [s for p in packs for s in p.sources()]
    allowed = tuple(dict.fromkeys((*dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES, *(m for p in packs for m in p.impl_modules))))
    return build_program(srcs, allowed)


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
    program, report = shipped
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
        import dsv4sel.verifier, dsv4sel.findings
        assert callable(dsv4sel.verify) and dsv4sel.verify is dsv4sel.verifier.verify
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

CATCH_ALL = """\
  - id: a-rest
    reject: {reason: nothing else}
"""


def check(write_rules, body: str, policy: str = "first", catch_all: bool = True, defaults: str = DEFAULTS) -> Report:
    directory = write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": defaults,
                             "a.yaml": HEAD.format(policy=policy) + textwrap.indent(textwrap.dedent(body), "  ")
                             + (CATCH_ALL if catch_all else "")})
    return verify([directory])


def line_of(path: str, needle: str) -> int:
    with open(path) as fh:
        return next(i for i, text in enumerate(fh, 1) if needle in text)


def test_clean_rules(write_rules):
    report = check(write_rules, """\
      - id: a-ds
        when: {platform: cuda, kv_cache_dtype: fp8_ds_mla}
        select: {}
      - id: a-fp8
        when: {platform: cuda, kv_cache_dtype: [auto, fp8]}
        select: {rewrites: {cache_dtype: fp8_ds_mla}}
    """)
    assert report.ok, [str(f) for f in report.findings]
    assert report.coverage.totals.select == 2 * 3 * 5  # 2 requests x 3 dtypes x 5 cuda capabilities


def test_gap_is_a_compact_cube_with_a_counterexample(write_rules):
    report = check(write_rules, """\
      - id: a-not-12
        when: {capability: [9.x, 10.x, unknown, gfx942]}
        reject: {reason: fine}
      - id: a-12-fp8
        when: {capability: 12.x, kv_cache_dtype: [auto, fp8, fp8_ds_mla]}
        reject: {reason: fine}
    """, catch_all=False)
    gaps = report.of_kind("gap")
    assert len(gaps) == 1
    gap = gaps[0]
    assert gap.cubes[0].text == "model=* platform=cuda capability=12.x backend=* kv_cache_dtype=float16"
    assert gap.count == 4 and gap.table == "A" and gap.file == "rules/a.yaml"
    assert gap.rules[0].id == "d-all"  # routed there by the default rule
    point = gap.counterexample.as_dict()
    assert point == {"model": "m", "platform": "cuda", "capability": "12.0", "backend": None,
                     "kv_cache_dtype": "float16"}
    # located at the table's `backends:` line
    assert str(gap).startswith("rules/a.yaml:2: error DSV401 [gap] no rule of table A decides 4 inputs")


def test_overlap_under_unique_names_both_rules(write_rules):
    report = check(write_rules, """\
      - id: a-cuda
        when: {platform: cuda}
        reject: {reason: one}
      - id: a-fp8
        when: {kv_cache_dtype: fp8}
        reject: {reason: two}
      - id: a-rest
        when: {platform: rocm, kv_cache_dtype: [auto, float16, fp8_ds_mla]}
        reject: {reason: three}
    """, policy="unique", catch_all=False)
    assert [f.kind for f in report.findings] == ["overlap"]
    f = report.findings[0]
    path = "rules/a.yaml"
    assert (f.file, f.line, f.severity) == (path, line_of(path, "id: a-cuda"), "error")
    assert [r.id for r in f.rules] == ["a-cuda", "a-fp8"] and f.rules[1].line == line_of(path, "id: a-fp8")
    assert f.count == 5 and "kv_cache_dtype=fp8" in f.message
    assert f.counterexample.as_dict()["kv_cache_dtype"] == "fp8"


def test_shadowed_dead_and_redundant(write_rules):
    report = check(write_rules, """\
      - id: a-cuda
        when: {platform: cuda}
        reject: {reason: cuda}
      - id: a-cuda-fp8
        when: {platform: cuda, kv_cache_dtype: fp8}
        reject: {reason: never wins}
      - id: a-impossible
        when: {platform: rocm, capability: "12.0"}
        reject: {reason: no such input}
      - id: a-rocm-fp8
        when: {platform: rocm, kv_cache_dtype: fp8}
        reject: {reason: same}
      - id: a-rocm-gfx-fp8
        when: {platform: rocm, capability: gfx942, kv_cache_dtype: [fp8, auto]}
        reject: {reason: same}
    """)
    kinds = {f.kind: f for f in report.findings}
    assert set(kinds) == {"shadowed", "dead", "redundant"}, [str(f) for f in report.findings]
    assert kinds["shadowed"].rules[0].id == "a-cuda-fp8" and kinds["shadowed"].rules[1].id == "a-cuda"
    assert kinds["dead"].rules[0].id == "a-impossible" and kinds["dead"].counterexample is None
    assert "platform and capability" in kinds["dead"].message
    red = kinds["redundant"]
    assert [r.id for r in red.rules] == ["a-rocm-fp8", "a-rocm-gfx-fp8"] and red.severity == "warning"
    assert red.cubes[0].text == "model=* platform=rocm capability=gfx942 backend=A kv_cache_dtype=fp8"


def test_selection_checks(write_rules):
    report = check(write_rules, """\
      - id: a-no-class
        when: {platform: cuda, capability: "9.0"}
        select: {impl: "dsv4sel.kernels.flashmla:NoSuchImpl"}
      - id: a-no-layout
        when: {platform: cuda, capability: "10.0"}
        select: {layout: bf16_rwo, torch_dtype: bfloat16, bytes_per_token: 1024}
      - id: a-wrong-size
        when: {platform: cuda, capability: 12.x}
        select: {layout: bf16_row, torch_dtype: uint8, bytes_per_token: 1024, cache_dtype: "{kv_cache_dtype}"}
      - id: a-rewrite-then-reject
        when: {platform: rocm, kv_cache_dtype: [auto, fp8]}
        select: {rewrites: {cache_dtype: float16}}
    """)
    by_kind = {}
    for f in report.findings:
        by_kind.setdefault(f.kind, []).append(f)
    assert set(by_kind) == {"impl", "layout", "consistency", "fixpoint"}, [str(f) for f in report.findings]
    assert by_kind["impl"][0].rules[0].id == "a-no-class" and "NoSuchImpl" in by_kind["impl"][0].message
    assert "did you mean 'bf16_row'?" in by_kind["layout"][0].message
    dtype, unread = sorted(by_kind["consistency"], key=lambda f: "does not read" in f.message)
    assert {dtype.rules[0].id, unread.rules[0].id} == {"a-wrong-size"}
    assert "torch_dtype 'uint8' disagrees with layout bf16_row" in dtype.message
    assert "DeepseekV4FlashMLASparseImpl does not read layout 'bf16_row'; it reads fp8_ds_mla" in unread.message
    (fix,) = by_kind["fixpoint"]
    assert [r.id for r in fix.rules] == ["a-rewrite-then-reject", "a-rest"]
    assert "kv_cache_dtype=float16" in fix.message and "rejected" in fix.message
    assert fix.counterexample.as_dict()["kv_cache_dtype"] in ("auto", "fp8")


def test_file_problems_are_findings_with_line_and_column(write_rules):
    report = check(write_rules, """\
      - id: a-typo
        when: {kv_cache_dtype: fp8_ds_mal}
        reject: {reason: typo}
      - id: a-route
        when: {platform: rocm}
        use: NOWHERE
    """)
    assert not report.analysed and report.coverage is None
    kinds = sorted(f.kind for f in report.findings)
    assert kinds == ["dangling", "vocabulary"], [str(f) for f in report.findings]
    typo = report.of_kind("vocabulary")[0]
    line = line_of("rules/a.yaml", "fp8_ds_mal")
    with open("rules/a.yaml") as fh:
        column = fh.read().splitlines()[line - 1].index("fp8_ds_mal") + 1
    assert (typo.file, typo.line, typo.column) == ("rules/a.yaml", line, column)
    assert "did you mean 'fp8_ds_mla'?" in typo.message
    assert report.of_kind("dangling")[0].line == line_of("rules/a.yaml", "use: NOWHERE")


def test_schema_and_yaml_errors(write_rules):
    directory = write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULTS,
                             "a.yaml": HEAD.format(policy="first") + "  - id: a\n    select: {bogus: 1}\n",
                             "b.yaml": "kind: backend\nbackends: [B\n"})
    report = verify([directory])
    kinds = {(f.kind, f.file) for f in report.findings}
    assert kinds == {("schema", "rules/a.yaml"), ("load", "rules/b.yaml")}, [str(f) for f in report.findings]
    schema = report.of_kind("schema")[0]
    line = line_of("rules/a.yaml", "bogus")
    with open("rules/a.yaml") as fh:
        column = fh.read().splitlines()[line - 1].index("bogus") + 1
    assert (schema.line, schema.column) == (line, column)
    assert "bogus" in schema.message


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

    from dsv4sel import outcomes
    from dsv4sel.build import build_program
    from dsv4sel.sources import expand

    directory = write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULTS,
                             "a.yaml": HEAD.format(policy="first") + CATCH_ALL})
    program = build_program(expand(directory), ("dsv4sel.kernels",))
    assert verify_program(program).ok  # reject-only: nothing selected, nothing to check
    directory = write_rules({"a.yaml": HEAD.format(policy="first") + "  - id: a-sel\n    select: {}\n"})
    program = build_program(expand(directory), ("dsv4sel.kernels",))
    own = {"fp8_ds_mla": SimpleNamespace(bytes_per_token=600, torch_dtype_name="uint8")}
    (finding,) = verify_program(program, layouts=own).findings
    assert finding.kind == "consistency" and "600" in finding.message
    monkeypatch.setattr(outcomes, "LAYOUTS_MODULE", "dsv4sel.kernels.no_such_layouts")
    (finding,) = verify_program(program).findings
    assert finding.kind == "layout" and "no_such_layouts" in finding.message


def test_verify_a_ruleset_loaded_from_a_directory(write_rules):
    directory = write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULTS,
                             "a.yaml": HEAD.format(policy="first") + CATCH_ALL})
    ruleset = dsv4sel.load_rules([directory])
    assert verify(ruleset) == verify([directory])
    with open(os.path.join(directory, "a.yaml"), "a") as fh:  # the files changed since loading
        fh.write("  - id: a-later\n    reject: {reason: late}\n")
    with pytest.raises(VerifyError, match="cannot find the rule files"):
        verify(ruleset)
