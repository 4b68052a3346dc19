"""Bad rule files: every problem is reported at once, as file:line:column, never as a traceback."""

import textwrap

import pytest

import dsv4sel
from dsv4sel import RuleError
from _rule_text import BACKEND_HEAD

VOCAB = textwrap.dedent("""\
    kind: vocabulary
    inputs:
      model: {default: m, values: [m]}
      platform: {values: [cuda, cpu]}
      capability:
        by: platform
        default: unknown
        values: {cuda: ["9.0", "10.0", "10.3", unknown], cpu: [unknown]}
      kv_cache_dtype: {default: auto, values: [auto, fp8, bfloat16]}
    """)
DEFAULT = textwrap.dedent("""\
    kind: default
    hit_policy: first
    rules:
      - id: d
        use: B
    """)
BACKEND = BACKEND_HEAD.format(name="B") + """\
  - id: b-fp8
    when: {capability: 10.x, kv_cache_dtype: [auto, fp8]}
    select: {}
  - id: b-other
    reject: {reason: "no {kv_cache_dtype} on {platform}"}
"""


def load(write_rules, use_cache=True, **overrides):
    files = {"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULT, "b.yaml": BACKEND}
    files.update(overrides)
    return dsv4sel.load_rules([write_rules(files)], use_cache=use_cache)


def problems(write_rules, **overrides):
    with pytest.raises(RuleError) as info:
        load(write_rules, **overrides)
    return [str(p) for p in info.value.problems], info.value


def test_a_valid_minimal_rule_set_selects_and_rejects(write_rules):
    rules = load(write_rules)
    sel = dsv4sel.select(platform="cuda", capability="10.3", model="m", rules=rules)
    assert (sel.backend, sel.rule.id, sel.rule.line) == ("B", "b-fp8", 12)
    with pytest.raises(dsv4sel.SelectionError, match="no bfloat16 on cuda"):
        dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="bfloat16", model="m", rules=rules)


def test_schema_errors_carry_file_line_column_and_all_are_reported(write_rules):
    bad = BACKEND.replace("hit_policy: first", "hit_policy: sometimes").replace(
        "block_size: 256", "block_size: big")
    found, error = problems(write_rules, **{"b.yaml": bad})
    assert any(p.startswith("rules/b.yaml:3:13: $.hit_policy: 'sometimes' is not one of") for p in found), found
    assert any(p.startswith("rules/b.yaml:10:15: $.defaults.block_size: 'big' is not of type 'integer'")
               for p in found), found
    assert (error.file, error.line) == ("rules/b.yaml", 3)
    assert isinstance(error, ValueError)


def test_an_unknown_field_points_at_the_key(write_rules):
    bad = BACKEND.replace("    select: {}", "    selcet: {}", 1)
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert any(p.startswith("rules/b.yaml:14:5: $.rules[0]: unknown field 'selcet'") for p in found), found


def test_duplicate_keys_are_errors(write_rules):
    bad = BACKEND.replace("  block_size: 256\n", "  block_size: 256\n  layout: bf16_row\n")
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert "rules/b.yaml:11:3: duplicate key 'layout' (first defined on line 6)" in found


def test_python_tags_are_refused(write_rules):
    bad = BACKEND.replace('reason: "no {kv_cache_dtype} on {platform}"',
                          'reason: !!python/object/apply:os.system ["echo pwned"]')
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert any("rules/b.yaml:16:" in p and "is not allowed: rule files are plain YAML data" in p
               for p in found), found


def test_yaml_syntax_errors_are_located(write_rules):
    found, _ = problems(write_rules, **{"b.yaml": "kind: backend\nbackends: [B\n"})
    assert len(found) == 1 and found[0].startswith("rules/b.yaml:3:1: YAML syntax error")


def test_vocabulary_typos_suggest_the_nearest_declared_value(write_rules):
    bad = BACKEND.replace("kv_cache_dtype: [auto, fp8]", "kv_cache_dtype: [auto, fp9]")
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert "rules/b.yaml:13:53: 'fp9' is not a declared value of 'kv_cache_dtype'; did you mean 'fp8'?" in found


def test_unknown_inputs_and_families_are_errors(write_rules):
    bad = BACKEND.replace("when: {capability: 10.x,", "when: {capabilty: 11.x,")
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert any("unknown input 'capabilty'" in p and "did you mean 'capability'" in p for p in found), found


def test_impl_classes_outside_the_allow_list_are_refused(write_rules):
    bad = BACKEND.replace("dsv4sel.kernels.flashmla:DeepseekV4FlashMLASparseImpl", "os:system")
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert any(p.startswith("rules/b.yaml:5:") and "'os:system' is outside the allowed modules" in p
               for p in found), found


def test_use_of_a_backend_without_a_table_is_an_error(write_rules):
    found, _ = problems(write_rules, **{"defaults.yaml": DEFAULT.replace("use: B", "use: C")})
    assert any(p.startswith("rules/defaults.yaml:5:") and "`use: C` names a backend without a table" in p
               for p in found), found


def test_bad_template_placeholders_are_errors(write_rules):
    bad = BACKEND.replace("{platform}", "{platfrom}")
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert any("unknown placeholder {platfrom}" in p and "did you mean 'platform'" in p for p in found), found


def test_a_rule_needs_exactly_one_outcome(write_rules):
    bad = BACKEND.replace("    select: {}", "    select: {}\n    reject: {reason: x}")
    found, _ = problems(write_rules, **{"b.yaml": bad})
    assert any("needs exactly one of select, use, reject (found select, reject)" in p for p in found), found


def test_duplicate_rule_ids_and_backend_tables_are_errors(write_rules):
    found, _ = problems(write_rules, **{"c.yaml": BACKEND + "# another table for B\n"})
    assert any(p.startswith("rules/c.yaml:2:") and "backend B already has a table in rules/b.yaml" in p
               for p in found), found
    assert any("rule id 'b-fp8' is already used at rules/b.yaml:12" in p for p in found), found


def test_an_identical_copy_of_a_rule_file_is_one_problem(write_rules):
    found, _ = problems(write_rules, **{"c.yaml": BACKEND})
    assert len(found) == 1 and found[0].startswith("rules/c.yaml:1:1: this file is a copy of rules/b.yaml"), found


def test_problems_in_several_files_are_reported_together(write_rules):
    found, _ = problems(write_rules, **{"b.yaml": BACKEND.replace("first", "worst"),
                                        "defaults.yaml": DEFAULT.replace("first", "last")})
    assert {p.split(":")[0] for p in found} == {"rules/b.yaml", "rules/defaults.yaml"}


def test_a_missing_path_is_a_located_problem(tmp_path):
    with pytest.raises(RuleError, match="cannot read rule file"):
        dsv4sel.load_rules([str(tmp_path / "nope.yaml")])


def test_a_missing_compiler_dependency_is_named_with_its_fix(write_rules, monkeypatch):
    import sys

    from dsv4sel.engine import validate

    validate.validator.cache_clear()
    monkeypatch.setitem(sys.modules, "jsonschema", None)  # makes `import jsonschema` fail
    try:
        with pytest.raises(ImportError, match="needs jsonschema to compile rule files.*pip install jsonschema"):
            load(write_rules, use_cache=False)
    finally:
        validate.validator.cache_clear()


# the compiled-rules cache follows the rule files' content (was in tests/dsv4/test_api.py, which
# could import this module's rule texts only when pytest had collected tests/engine too)
def test_the_cache_is_invalidated_when_a_rule_file_changes(write_rules, tmp_path):
    directory = write_rules({"vocabulary.yaml": VOCAB, "defaults.yaml": DEFAULT, "b.yaml": BACKEND})
    first = dsv4sel.load_rules([directory])
    assert dsv4sel.select(platform="cuda", capability="10.0", model="m", rules=first).block_size == 256
    (tmp_path / "rules" / "b.yaml").write_text(BACKEND.replace("block_size: 256", "block_size: 64"))
    second = dsv4sel.load_rules([directory])
    assert first.digest != second.digest
    assert dsv4sel.select(platform="cuda", capability="10.0", model="m", rules=second).block_size == 64
