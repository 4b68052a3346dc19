"""The mistakes a new pack author makes most (examples/mistakes/), each pinned to the one finding
`dsv4sel check` gives it: code, severity, file, line and column. docs/adding-a-backend.md shows
their messages, generated from the same packs; the message text of each code is checked once,
here or in tests/engine/test_codes.py. Also issue 18's "one problem, one finding" cases (no `kind:`,
a tab, a wrong field in `defaults:`), the hint that names the pack's file, and explain's warning
for an impl that cannot be imported."""

from __future__ import annotations

import json
import sys

import pytest


from _cli import REPO, run  # noqa: E402

MISTAKES = "examples/mistakes"
CLEAN = (REPO / MISTAKES / "clean" / "my.yaml").read_text()
# The variants below that a test writes are one edit of the clean pack, made at test time from
# CLEAN so that they follow the example; a whole pack of this file's own is a YAML file:
WIDE = "tests/check/rules/mistakes/wide_default"


def findings(*args: str, env=None) -> list[tuple]:
    result = run("check", "--json", *args, env=env)
    assert result.rc in (0, 1, 2), result  # 2: a file that does not load
    return [(f["code"], f["severity"], f["file"], f["line"], f["column"]) for f in json.loads(result.out)["findings"]]


@pytest.mark.parametrize("mistake, code, severity, file, line, column", [
    ("value-typo", "DSV301", "error", "my.yaml", 23, 74),
    ("overlap", "DSV402", "error", "my.yaml", 22, None),
    ("gap", "DSV401", "error", "my.yaml", 4, None),
    ("wrong-impl-module", "DSV406", "error", "my.yaml", 7, 9),   # at `defaults: impl`, once
    ("capability-spelling", "DSV301", "error", "my.yaml", 23, 40),
    ("unquoted-number", "DSV202", "error", "my.yaml", 23, 40),
    ("duplicate-key", "DSV106", "error", "my.yaml", 23, 75),
    ("hijacking-override", "DSV413", "warning", "defaults.yaml", 8, None),
    ("widened-override", "DSV414", "warning", "defaults.yaml", 10, None),
    ("wrong-field-type", "DSV201", "error", "my.yaml", 12, 15),
    ("missing-field", "DSV204", "error", "my.yaml", 27, 13),
    ("no-vllm-host", "DSV412", "warning", "my.yaml", 18, None),  # at its first select rule, once
])
def test_each_mistake_is_one_finding_with_its_code_and_location(mistake, code, severity, file, line, column):
    got = findings("--rules", f"{MISTAKES}/{mistake}")
    assert got == [(code, severity, f"{MISTAKES}/{mistake}/{file}", line, column)]


def test_the_clean_pack_is_clean():
    assert findings("--rules", f"{MISTAKES}/clean") == []


def test_a_backend_without_a_vllm_class_is_one_warning_naming_the_fix():
    # issue 22 point 4: check and test pass it, and the vLLM plugin refuses every selection of it
    # (the warning's wording: tests/engine/wording.yaml, DSV412)
    result = run("check", "--rules", f"{MISTAKES}/no-vllm-host")
    (line,) = [s for s in result.out.splitlines() if "DSV412" in s]
    assert line.startswith(f"{MISTAKES}/no-vllm-host/my.yaml:18: warning DSV412 [hostless] backend MY_MLA_SPARSE ")
    assert result.rc == 1  # a warning is a finding


def test_a_select_rule_without_a_vllm_class_is_named(tmp_path):
    # one select rule names a class of its own, the other none: the warning names the other
    host = '{vllm: {class: "vllm.models.deepseek_v4.nvidia.flashinfer_sparse:DeepseekV4FlashInferSM120Attention", versions: ">=0.33.0,<0.34"}}'
    text = CLEAN.replace(f"  hosts: {host}\n", "").replace("select: {}", f"select: {{hosts: {host}}}")
    assert text != CLEAN and "hosts" in text
    (tmp_path / "my.yaml").write_text(text)
    result = run("check", "--rules", str(tmp_path))
    (line,) = [s for s in result.out.splitlines() if "DSV412" in s]
    assert f"{tmp_path}/my.yaml:21: warning DSV412" in line
    assert "but its rule my-fp8 names no vLLM class (`hosts: vllm`); the vLLM plugin refuses every such selection" in line


def test_the_platforms_held_to_vllm_are_those_the_plugin_patches_in_every_release():
    import importlib

    from dsv4sel.dsv4.host_registry import HOST_PLATFORMS, HOSTS

    for release in HOSTS["vllm"].releases:
        assert set(HOST_PLATFORMS["vllm"]) == set(importlib.import_module(release.package).TARGETS), release


def test_a_rule_set_that_names_no_vllm_class_is_not_held_to_vllm():
    # SGLang's own rule set (its own vocabulary and host) gets no vLLM warning
    from dsv4sel import verify

    report = verify([str(REPO / "rules" / "compat" / "sglang-0.5.23")])
    assert [f for f in report.findings if f.code == "DSV412"] == []


def test_a_hijacking_override_names_the_rule_an_input_it_lost_and_the_fix():
    result = run("check", "--rules", f"{MISTAKES}/hijacking-override")
    (line,) = [s for s in result.out.splitlines() if "DSV413" in s]
    assert "rule my-default sends 460 inputs to MY_MLA_SPARSE, whose table rejects every one of them" in line
    assert "platform=cuda capability=9.0 backend=<none>" in line
    assert "which --attention-backend FLASHMLA_SPARSE_DSV4 serves with flashmla-" in line
    assert line.endswith("narrow my-default's `when:` to the inputs MY_MLA_SPARSE serves, or drop its "
                         "`override: true`")
    assert result.rc == 1  # a warning is a finding


def test_an_override_widened_past_its_backend_names_an_input_it_took_from_a_served_default(tmp_path):
    # issue 32 point 21: the pack's table serves SM8x, so DSV413 (a table rejecting everything it
    # is sent) does not apply, yet every H100 query without --attention-backend lost FlashMLA
    result = run("check", "--rules", f"{MISTAKES}/widened-override")
    (line,) = [s for s in result.out.splitlines() if "DSV414" in s]
    pack = f"{MISTAKES}/widened-override"
    assert line.startswith(
        f"{pack}/defaults.yaml:10: warning DSV414 [takeover] rule my-default turns 16 inputs that earlier packs' "
        "default rules served into rejections (of the 460 inputs it takes): it sends them to MY_MLA_SPARSE, whose "
        "table rejects them (e.g. model=deepseek_v4 platform=cuda capability=9.0 backend=<none> kv_cache_dtype=")
    assert ": default-cuda-sm9x-sm10x (rules/defaults.yaml:" in line
    assert "chose FLASHMLA_SPARSE_DSV4, which selects it with flashmla-" in line
    assert f"; now my-unsupported ({pack}/my.yaml:26) rejects it)" in line
    assert line.endswith(": a query without --attention-backend there no longer gets a backend; narrow my-default's "
                         "`when:` to the inputs MY_MLA_SPARSE serves, or drop its `override: true`")
    assert result.rc == 1  # a warning is a finding
    assert [(code, n) for code, n in json_counts(f"{MISTAKES}/widened-override")] == [("DSV414", 16)]
    # narrowed to what it was written for (one edit of the example, made here so that it follows
    # it), the override takes only inputs no default served: clean
    narrowed = tmp_path / "narrowed"
    narrowed.mkdir()
    for name in ("my.yaml", "defaults.yaml"):
        text = (REPO / MISTAKES / "widened-override" / name).read_text()
        (narrowed / name).write_text(text.replace("capability: [8.x, 9.x]", "capability: 8.x"))
    assert "capability: 8.x}" in (narrowed / "defaults.yaml").read_text()
    assert findings("--rules", str(narrowed)) == []


def json_counts(pack: str) -> list[tuple[str, int]]:
    return [(f["code"], f["count"]) for f in json.loads(run("check", "--json", "--rules", pack).out)["findings"]]


def test_a_capability_in_a_query_spelling_names_the_declared_value():
    result = run("check", "--rules", f"{MISTAKES}/capability-spelling")
    assert ("'sm120' is not a declared value of 'capability'; rules write the declared value: '12.0' "
            "(queries accept 'sm120' as a spelling of it)") in result.out


def test_a_default_field_problem_is_reported_once_at_defaults(tmp_path):
    pack = tmp_path / "bpt"
    pack.mkdir()
    (pack / "my.yaml").write_text(CLEAN.replace("bytes_per_token: 584", "bytes_per_token: 512"))
    assert findings("--rules", str(pack)) == [("DSV408", "error", f"{pack}/my.yaml", 11, 20)]
    out = run("check", "--rules", str(pack)).out
    assert ("defaults: bytes_per_token 512 disagrees with layout fp8_ds_mla, which stores 584 bytes per token "
            "(inherited by rules my-fp8-ds-mla, my-fp8)") in out


def test_a_file_without_kind_is_one_finding_that_names_the_kind(tmp_path):
    pack = tmp_path / "nokind"
    pack.mkdir()
    (pack / "my.yaml").write_text(CLEAN.replace("kind: backend\n", ""))
    assert findings("--rules", str(pack)) == [("DSV204", "error", f"{pack}/my.yaml", 3, 1)]
    assert "the file has no `kind:`; a rule file starts with `kind: backend`" in run(
        "check", "--rules", str(pack)).out


def test_a_tab_in_indentation_says_so(tmp_path):
    pack = tmp_path / "tab"
    pack.mkdir()
    (pack / "my.yaml").write_text(CLEAN.replace("  - id: my-fp8\n", "\t- id: my-fp8\n"))
    assert findings("--rules", str(pack)) == [("DSV102", "error", f"{pack}/my.yaml", 22, 1)]
    assert "a tab character: YAML indents with spaces only; replace the tab with spaces" in run(
        "check", "--rules", str(pack)).out


def test_a_full_override_of_a_shipped_default_points_at_the_pack():
    pack = WIDE  # wide-default takes every ROCm input, with `override: true`
    assert findings("--rules", str(pack)) == [("DSV404", "error", f"{pack}/defaults.yaml", 4, None)]
    out = run("check", "--rules", str(pack)).out
    assert "rule default-rocm (rules/defaults.yaml:" in out
    assert ("wide-default (" + f"{pack}/defaults.yaml:4) has `override: true` and takes every one of them: if "
            "default-rocm should keep some, narrow wide-default's `when:`") in out
    assert "give default-rocm `override: true`" not in out


def test_explain_warns_when_the_selected_impl_cannot_be_imported():
    args = ("explain", "--platform", "cuda", "--capability", "12.0", "--backend", "MY_MLA_SPARSE",
            "--rules", f"{MISTAKES}/wrong-impl-module")
    result = run(*args)
    assert result.rc == 0
    # piped, explain wraps at 100 columns: compared with the wrapping undone
    assert ("warning the impl dsv4sel.kernels.refrence:DeepseekV4ReferenceSparseImpl cannot be loaded here "
            "(no module named 'dsv4sel.kernels.refrence'): loading it will fail; `dsv4sel check` reports this as "
            "DSV406") in " ".join(result.out.split())
    data = json.loads(run(*args, "--json").out)
    assert [m["level"] for m in data["messages"]] == ["warning"]
    # a module that is there: no warning
    ok = json.loads(run("explain", "--platform", "cuda", "--capability", "12.0", "--backend", "MY_MLA_SPARSE",
                        "--rules", f"{MISTAKES}/clean", "--json").out)
    assert ok["messages"] == [] and ok["status"] == "selected"


def test_loading_an_unimportable_impl_is_one_error_naming_the_module_the_rule_and_the_fix(monkeypatch):
    # select() answers without importing the impl (the hot path imports no kernel library);
    # the error comes where the class is asked for, and names what to change
    from dsv4sel import ImplLoadError, load_rules, select
    from dsv4sel.engine.sources import default_packs

    monkeypatch.chdir(REPO)  # pack files are named relative to the working directory

    rules = load_rules([*default_packs(), f"{MISTAKES}/wrong-impl-module"])
    sel = select(platform="cuda", capability="12.0", backend="MY_MLA_SPARSE", rules=rules)
    assert "dsv4sel.kernels.refrence" not in sys.modules
    with pytest.raises(ImplLoadError) as info:
        sel.load_impl()
    assert str(info.value) == (
        "MY_MLA_SPARSE: impl 'dsv4sel.kernels.refrence:DeepseekV4ReferenceSparseImpl': cannot import "
        "dsv4sel.kernels.refrence: ModuleNotFoundError: No module named 'dsv4sel.kernels.refrence'; it was "
        f"selected by rule my-fp8 ({MISTAKES}/wrong-impl-module/my.yaml:22): correct that rule's `impl:` (or its "
        "`defaults: impl`), or install the module it names; `dsv4sel check` reports this as DSV406")
    # the same selection from the clean pack loads its class
    clean = load_rules([*default_packs(), f"{MISTAKES}/clean"])
    assert select(platform="cuda", capability="12.0", backend="MY_MLA_SPARSE", rules=clean).load_impl().__name__ \
        == "DeepseekV4ReferenceSparseImpl"
