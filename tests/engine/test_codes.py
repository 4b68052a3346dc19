"""Every problem and finding has a stable code (dsv4sel.engine.codes): each code is held
here to a real rule file that produces it, through the real pipeline."""

from __future__ import annotations

import os
import textwrap



from _verify_programs import DEFAULTS, HEAD, VOCAB  # noqa: E402

import dsv4sel  # noqa: E402
from _rule_text import BACKEND_HEAD  # noqa: E402
from dsv4sel.engine.codes import CODES, kind_code  # noqa: E402
from dsv4sel.engine.sources import default_packs  # noqa: E402


def write(directory, files):
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(textwrap.dedent(text))
    return directory


def codes_of(report):
    return [(f.file.rsplit("/", 1)[-1], f.code) for f in report.findings]


BACKEND = BACKEND_HEAD


def test_load_and_schema_codes(tmp_path):
    pack = write(tmp_path / "p", {
        "a_syntax.yaml": "kind: backend\nrules: [\n",
        "b_empty.yaml": "",
        "c_tag.yaml": "kind: !!python/name:os.system backend\n",
        "e_dup.yaml": "kind: default\nkind: default\n",
        "f_unquoted.yaml": BACKEND.format(name="F_DSV4") + "  - id: f\n    when: {capability: 9.0}\n    select: {}\n",
        "g_unknown_field.yaml": BACKEND.format(name="G_DSV4") + "  - id: g\n    selct: {}\n",
        "h_required.yaml": "kind: default\nhit_policy: first\n",
        "i_enum.yaml": "kind: rules\n",
    })
    report = dsv4sel.verify([*default_packs(), str(pack)])
    got = dict(codes_of(report))
    assert got == {
        "a_syntax.yaml": "DSV102", "b_empty.yaml": "DSV103", "c_tag.yaml": "DSV104",
        "e_dup.yaml": "DSV106", "f_unquoted.yaml": "DSV202", "g_unknown_field.yaml": "DSV203",
        "h_required.yaml": "DSV204", "i_enum.yaml": "DSV201",
    }, [str(f) for f in report.findings]
    assert len(report.findings) == len(got), [str(f) for f in report.findings]  # one finding per problem


def test_compile_codes(tmp_path):
    pack = write(tmp_path / "p", {
        "vocab.yaml": "kind: vocabulary\ninputs:\n  extra_in: {values: [a, b]}\n",
        "x.yaml": BACKEND.format(name="X_DSV4") + textwrap.dedent("""\
              - id: x-value
                when: {kv_cache_dtype: fp8_e4m4}
                select: {}
              - id: x-input
                when: {kv_dtype: fp8}
                select: {}
              - id: x-family
                when: {capability: 13.x}
                select: {}
              - id: x-placeholder
                reject: {reason: "no {platfrom}"}
              - id: x-value
                reject: {reason: again}
              - id: x-two
                use: FLASHMLA_SPARSE_DSV4
                reject: {reason: both}
              - id: x-use
                use: NOWHERE_DSV4
            """),
        "y.yaml": BACKEND.format(name="FLASHMLA_SPARSE_DSV4").replace(
            "dsv4sel.kernels.flashmla:DeepseekV4FlashMLASparseImpl", "evil.mod:Impl") + "  - id: y\n    select: {}\n",
    })
    report = dsv4sel.verify([*default_packs(), str(pack)])
    codes = sorted(f.code for f in report.findings)
    assert codes == sorted(["DSV305", "DSV301", "DSV302", "DSV303", "DSV304", "DSV307", "DSV309", "DSV311",
                            "DSV308", "DSV310"]), [str(f) for f in report.findings]
    impl = next(f for f in report.findings if f.code == "DSV310")
    assert "--allow-impl-module evil" in impl.message and "entry point in group dsv4sel.rules" in impl.message


def test_a_copied_pack_file_is_one_problem(tmp_path):
    pack = write(tmp_path / "copy", {"flashmla.yaml": (tmp_path / ".." / ".." ).joinpath(
        os.path.join(os.path.dirname(__file__), "..", "..", "rules", "flashmla.yaml")).read_text()})
    report = dsv4sel.verify([*default_packs(), str(pack)])
    assert [f.code for f in report.findings] == ["DSV313"], [str(f) for f in report.findings]
    assert "is a copy of rules/flashmla.yaml" in report.findings[0].message


def test_verification_codes(tmp_path):
    rules = write(tmp_path / "v", {
        "vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULTS,
        "a.yaml": HEAD.format(policy="unique") + textwrap.dedent("""\
              - id: a-cuda
                when: {platform: cuda, kv_cache_dtype: [auto, fp8]}
                reject: {reason: x}
              - id: a-fp8
                when: {kv_cache_dtype: fp8}
                reject: {reason: y}
              - id: a-dead
                when: {platform: rocm, capability: "9.0"}
                reject: {reason: z}
            """),
        "b.yaml": HEAD.replace("[A]", "[B]").format(policy="first") + textwrap.dedent("""\
              - id: b-all
                reject: {reason: b}
              - id: b-never
                when: {platform: cuda}
                reject: {reason: c}
              - id: b-same
                reject: {reason: b}
            """),
    })
    report = dsv4sel.verify([str(rules)])
    codes = {f.code for f in report.findings}
    assert {"DSV401", "DSV402", "DSV403", "DSV404", "DSV405"} <= codes, [str(f) for f in report.findings]
    for f in report.findings:
        assert f.to_dict()["code"] == f.code and f" {f.code} [{f.kind}] " in str(f)


def test_a_table_that_never_tests_model_is_a_warning_with_the_fix(tmp_path):
    two_models = VOCAB.replace("model: {values: [m], default: m}", "model: {values: [m, m2], default: m}")
    rules = write(tmp_path / "m", {
        "vocabulary.yaml": two_models,
        "defaults.yaml": "kind: default\nhit_policy: first\nrules:\n  - id: d-m\n    when: {model: m}\n    use: A\n"
                         "  - id: d-other\n    reject: {reason: no}\n".replace("reason: no", "reason: none"),
        "a.yaml": HEAD.format(policy="first") + "  - id: a-any\n    select: {}\n",
    })
    report = dsv4sel.verify([str(rules)])
    assert [(f.code, f.severity) for f in report.findings] == [("DSV410", "warning")], report.findings
    f = report.findings[0]
    assert f.file.endswith("a.yaml") and f.line == 2
    assert "table A never tests `model`, so it selects for every declared model (m, m2)" in f.message
    assert "`- {id: a-other-model, when: {model: {not: m}}, reject: {reason: A serves m only, not {model}.}}`" \
        in f.message
    # with the guard the warning goes
    (rules / "a.yaml").write_text(HEAD.format(policy="first") + "  - id: a-other\n    when: {model: {not: m}}\n"
                                  "    reject: {reason: m only}\n  - id: a-any\n    select: {}\n")
    assert dsv4sel.verify([str(rules)]).ok


def test_a_shadowed_pack_default_says_override(tmp_path):
    pack = write(tmp_path / "quiet", {"defaults.yaml": """\
        kind: default
        hit_policy: first
        rules:
          - id: quiet-default
            when: {model: deepseek_v4, platform: cuda, capability: "12.1"}
            use: FLASHMLA_SPARSE_DSV4
        """})
    report = dsv4sel.verify([*default_packs(), str(pack)])
    (f,) = report.findings
    assert f.code == "DSV404" and f.message.endswith("give quiet-default `override: true`")


def test_every_code_is_documented_and_classified():
    assert all(code.startswith("DSV") and len(code) == 6 for code in CODES)
    assert kind_code("gap") == "DSV401" and kind_code("impl") == "DSV406"
    for code in CODES:
        assert code in open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "cli.md")).read(), code


def test_codes_are_set_where_problems_are_found_not_read_from_their_text():
    # a message that reads like another kind of problem keeps its own code
    from dsv4sel.engine.load import load_text

    _, problems = load_text('kind: "duplicate key"\nkind: x\n', "t.yaml")
    assert [(p.code, p.line) for p in problems] == [("DSV106", 2)]


def test_a_test_file_among_the_rules_is_one_problem(tmp_path):
    pack = write(tmp_path / "mixed", {"cases.yaml": "kind: tests\ncases:\n  - query: {platform: cpu}\n"
                                                    "    expect: {backend: CPU_V4_MLA_SPARSE}\n"})
    report = dsv4sel.verify([*default_packs(), str(pack)])
    assert [(f.code, f.line) for f in report.findings] == [("DSV501", 1)], [str(f) for f in report.findings]
    assert "`dsv4sel test PATH` runs test files" in report.findings[0].message


def test_selection_codes(tmp_path):
    pack = write(tmp_path / "z", {"z.yaml": BACKEND.format(name="Z_DSV4") + textwrap.dedent("""\
          - id: z-other-model
            when: {model: {not: deepseek_v4}}
            reject: {reason: deepseek_v4 only}
          - id: z-noimpl
            when: {kv_cache_dtype: fp8}
            select: {impl: "dsv4sel.kernels.flashmla:NoSuchImpl"}
          - id: z-layout
            when: {kv_cache_dtype: fp8_e4m3}
            select: {layout: no_such_layout}
          - id: z-size
            when: {kv_cache_dtype: fp8_ds_mla}
            select: {bytes_per_token: 512}
          - id: z-rewrite
            when: {kv_cache_dtype: auto}
            select: {rewrites: {cache_dtype: bfloat16}}
          - id: z-rest
            reject: {reason: nothing else}
        """)})
    report = dsv4sel.verify([*default_packs(), str(pack)])
    by_rule = {f.rules[0].id: f.code for f in report.findings if f.code != "DSV412"}
    assert by_rule == {"z-noimpl": "DSV406", "z-layout": "DSV407", "z-size": "DSV408", "z-rewrite": "DSV409"}, \
        [str(f) for f in report.findings]
    # and, as the pack names no vLLM class, one DSV412 warning at its first select rule
    (hostless,) = [f for f in report.findings if f.code == "DSV412"]
    assert (hostless.severity, hostless.rules[0].id, hostless.table) == ("warning", "z-noimpl", "Z_DSV4")


def test_a_use_cycle_is_dsv312(tmp_path):
    head = BACKEND.split("defaults:")[0]
    pack = write(tmp_path / "loop", {
        "a.yaml": head.format(name="LOOPA_DSV4") + "rules:\n  - id: loopa\n    use: LOOPB_DSV4\n",
        "b.yaml": head.format(name="LOOPB_DSV4") + "rules:\n  - id: loopb\n    use: LOOPA_DSV4\n",
    })
    report = dsv4sel.verify([*default_packs(), str(pack)])
    assert {f.code for f in report.findings} == {"DSV312"}, [str(f) for f in report.findings]
