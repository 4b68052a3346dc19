"""Bad rule files: every problem is reported at once, as file:line:column, never as a traceback."""

from pathlib import Path

import pytest

import dsv4sel
from dsv4sel import RuleError

#: the rule sets of these tests: ``minimal/`` (a vocabulary, a default decision, backend B) and
#: one folder per broken variant, whose files replace minimal's of the same name
RULES = Path(__file__).with_name("rules") / "rule_files"


def load(write_rules, variant=None, use_cache=True):
    folders = [RULES / "minimal"] + ([RULES / variant] if variant else [])
    return dsv4sel.load_rules([write_rules(*folders)], use_cache=use_cache)


def problems(write_rules, variant):
    """The problems of ``variant`` as ``(code, file:line:column)``, and the error."""
    with pytest.raises(RuleError) as info:
        load(write_rules, variant)
    return [(p.code, str(p.loc)) for p in info.value.problems], info.value


def test_a_valid_minimal_rule_set_selects_and_rejects(write_rules):
    rules = load(write_rules)
    sel = dsv4sel.select(platform="cuda", capability="10.3", model="m", rules=rules)
    assert (sel.backend, sel.rule.id, sel.rule.line) == ("B", "b-fp8", 12)
    with pytest.raises(dsv4sel.SelectionError, match="no bfloat16 on cuda"):
        dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="bfloat16", model="m", rules=rules)


def test_schema_errors_carry_file_line_column_and_all_are_reported(write_rules):
    found, error = problems(write_rules, "schema_errors")  # hit_policy: sometimes, block_size: big
    assert found == [("DSV201", "rules/b.yaml:3:13"), ("DSV201", "rules/b.yaml:10:15")]
    assert (error.file, error.line) == ("rules/b.yaml", 3)
    assert isinstance(error, ValueError)


def test_an_unknown_field_points_at_the_key(write_rules):
    assert problems(write_rules, "unknown_field")[0] == [("DSV203", "rules/b.yaml:14:5")]  # selcet:


def test_duplicate_keys_are_errors(write_rules):
    assert problems(write_rules, "duplicate_key")[0] == [("DSV106", "rules/b.yaml:11:3")]


def test_python_tags_are_refused(write_rules):
    assert problems(write_rules, "python_tag")[0] == [("DSV104", "rules/b.yaml:16:22")]


def test_yaml_syntax_errors_are_located(write_rules):
    assert problems(write_rules, "yaml_syntax")[0] == [("DSV102", "rules/b.yaml:3:1")]


def test_vocabulary_typos_suggest_the_nearest_declared_value(write_rules):
    found, error = problems(write_rules, "value_typo")  # fp9
    assert found == [("DSV301", "rules/b.yaml:13:53")]
    assert error.problems[0].message.endswith("did you mean 'fp8'?")  # the nearest value, not the wording


def test_unknown_inputs_and_families_are_errors(write_rules):
    found, error = problems(write_rules, "unknown_input")  # capabilty: 11.x
    assert found == [("DSV302", "rules/b.yaml:13:12")]
    assert error.problems[0].message.endswith("did you mean 'capability'?")


def test_impl_classes_outside_the_allow_list_are_refused(write_rules):
    assert problems(write_rules, "impl_outside")[0] == [("DSV310", "rules/b.yaml:5:9")]  # os:system


def test_use_of_a_backend_without_a_table_is_an_error(write_rules):
    assert problems(write_rules, "dangling_use")[0] == [("DSV311", "rules/defaults.yaml:5:10")]  # use: C


def test_bad_template_placeholders_are_errors(write_rules):
    found, error = problems(write_rules, "placeholder_typo")  # {platfrom}
    assert found == [("DSV304", "rules/b.yaml:16:22")]
    assert error.problems[0].message.endswith("did you mean 'platform'?")


def test_a_rule_needs_exactly_one_outcome(write_rules):
    assert problems(write_rules, "two_outcomes")[0] == [("DSV309", "rules/b.yaml:12:5")]  # select and reject


def test_duplicate_rule_ids_and_backend_tables_are_errors(write_rules):
    found, _ = problems(write_rules, "second_table")  # c.yaml: b.yaml again, plus a comment
    assert found == [("DSV308", "rules/c.yaml:2:12"), ("DSV307", "rules/c.yaml:12:9"), ("DSV307", "rules/c.yaml:15:9")]


def test_an_identical_copy_of_a_rule_file_is_one_problem(write_rules):
    assert problems(write_rules, "copied_file")[0] == [("DSV313", "rules/c.yaml:1:1")]


def test_problems_in_several_files_are_reported_together(write_rules):
    found, _ = problems(write_rules, "two_files_wrong")  # hit_policy: worst / last
    assert found == [("DSV201", "rules/b.yaml:3:13"), ("DSV201", "rules/defaults.yaml:2:13")]


def test_a_missing_path_is_a_located_problem(tmp_path):
    with pytest.raises(RuleError) as info:
        dsv4sel.load_rules([str(tmp_path / "nope.yaml")])
    assert [(p.code, p.file, p.line) for p in info.value.problems] == [("DSV101", str(tmp_path / "nope.yaml"), 1)]


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


def _raised_from(error: ImportError, context: ImportError) -> ImportError:
    """``error`` as Python raises it inside an ``except`` block of ``context``."""
    try:
        try:
            raise context
        except ImportError:
            raise error  # noqa: B904 - the implicit context is the point
    except ImportError as raised:
        return raised


@pytest.mark.parametrize(("failure", "raised", "says"), [
    (ModuleNotFoundError("No module named 'jsonschema'", name="jsonschema"), ImportError,
     "it is not installed: pip install jsonschema"),
    # a dependency of it missing, or a broken install: reinstall, never "pip install" what is there
    (ModuleNotFoundError("No module named 'rpds'", name="rpds"), ImportError,
     "installed but does not import (ModuleNotFoundError: No module named 'rpds'); reinstall it"),
    # the dynamic loader under a memory limit: what the user lacks is memory
    (ImportError("rpds.so: failed to map segment from shared object"), MemoryError,
     "importing jsonschema: rpds.so: failed to map segment from shared object"),
    # a package that falls back to another module when the first does not import: the fallback's
    # ModuleNotFoundError comes from the loader that could not map the first
    (_raised_from(ModuleNotFoundError("No module named 'importlib_resources'", name="importlib_resources"),
                  ImportError("_struct.so: failed to map segment from shared object")), MemoryError,
     "importing jsonschema: No module named 'importlib_resources'"),
    (_raised_from(ModuleNotFoundError("No module named 'importlib_resources'", name="importlib_resources"),
                  ImportError("cannot import name 'files'")), ImportError, "installed but does not import"),
])
def test_a_compiler_dependency_that_does_not_import_is_told_apart_from_a_missing_one(failure, raised, says):
    from dsv4sel.engine.hints import dependency_error

    error = dependency_error(failure, "jsonschema", "jsonschema")
    assert type(error) is raised and says in str(error), error


# the compiled-rules cache follows the rule files' content (was in tests/dsv4/test_api.py, which
# could import this module's rule texts only when pytest had collected tests/engine too)
def test_the_cache_is_invalidated_when_a_rule_file_changes(write_rules, tmp_path):
    directory = write_rules(RULES / "minimal")
    first = dsv4sel.load_rules([directory])
    assert dsv4sel.select(platform="cuda", capability="10.0", model="m", rules=first).block_size == 256
    write_rules(RULES / "smaller_blocks")  # b.yaml with block_size: 64
    second = dsv4sel.load_rules([directory])
    assert first.digest != second.digest
    assert dsv4sel.select(platform="cuda", capability="10.0", model="m", rules=second).block_size == 64
