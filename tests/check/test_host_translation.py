"""Host translations (dsv4sel.translation) and their `dsv4sel check` stage (dsv4sel.check.host_spaces):
the shipped SGLang translation decides every input of its space once, and a broken translation
is a coded problem or finding at its file:line. Needs no SGLang."""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest


import dsv4sel
from dsv4sel.check.host_spaces import check_translation
from dsv4sel.dsv4.host_registry import HOSTS
from dsv4sel.errors import RuleError
from dsv4sel.sglang_plugin.translation import FILE
from dsv4sel.translation import load

SHIPPED = Path(FILE).read_text()


def _variant(tmp_path: Path, old: str, new: str) -> str:
    assert old in SHIPPED
    path = tmp_path / "t.yaml"
    path.write_text(SHIPPED.replace(old, new, 1))
    return str(path)


def _line_of(text: str, needle: str) -> int:
    return text.splitlines().index(next(line for line in text.splitlines() if needle in line)) + 1


def test_dsv4sel_check_proves_every_host_release_space_decided():
    from _cli import run

    result = run("check", "--format", "json")
    report = json.loads(result.out)
    assert result.rc == 0 and report["ok"], report["findings"][:3]
    hosts = {(h["host"], h["file"]): h for h in report["hosts"]}
    assert set(hosts) == {(host.name, release.display) for host in HOSTS.values() for release in host.releases}
    sglang = hosts["sglang", "dsv4sel/sglang_plugin/v0_5_23/sglang-0.5.23.yaml"]
    # the host space of tests/sglang523 (what the real SGLang is asked about), all decided
    assert sglang["inputs"] == 20_480 + 23_040 == sglang["selected"] + sglang["refused"]
    # vLLM's: every enum member of the release (0.34 adds two) and no backend, its 22 cache dtypes,
    # LoRA and prefill context parallelism, the two hardware answers on CUDA; every selection names
    # a vLLM class for that release
    for file, backends in (("dsv4sel/vllm_plugin/v0_33/vllm-0.33.yaml", 51),
                           ("dsv4sel/vllm_plugin/v0_34/vllm-0.34.yaml", 53)):
        vllm = hosts["vllm", file]
        assert vllm["inputs"] == 2 * (13 * 4 + 8 + 1 + 1) * backends * 22 * 4 == vllm["selected"] + vllm["refused"]
        assert vllm["selected"] > 0


def test_the_grouped_host_walk_counts_as_the_input_by_input_walk():
    """check's host stage groups a host space by the inputs the translation looks at; on the SGLang
    space (where most groups are single inputs) and on vLLM 0.34's (large groups) it must count
    exactly what deciding every input on its own counts."""
    import dsv4sel
    from dsv4sel.check.host_spaces import _Walk, check_translation, shipped_translations

    rules = dsv4sel.default_rules()
    translations = {t.file.rsplit("/", 1)[1]: t for t in shipped_translations()}
    vllm = copy.copy(translations["vllm-0.34.yaml"])  # a slice of its space, so the input-by-input walk stays short
    vllm.space = {**vllm.space, "capability": {**vllm.space["capability"], "cuda": ["9.0", "10.0", "12.0", "unknown"]},
                  "attention_backend": ["unset", "FLASHMLA_SPARSE_DSV41", "FLASHMLA_MEGA_ATTN_DSV41", "FLASHINFER_TS",
                                        "FLASHINFER_MLA_SPARSE_DSV4", "ROCM_FLASHMLA_SPARSE_DSV41"],
                  "kv_cache_dtype": ["auto", "fp8", "bfloat16", "nvfp4_ds_mla", "fp8_ds_mla"]}
    for translation in (translations["sglang-0.5.23.yaml"], vllm):
        grouped, _ = check_translation(translation, rules)
        one = _Walk(translation, rules)
        for point in translation.points():
            one._one(point)
        assert grouped.selected > 0 and grouped.refused > 0
        assert (grouped.inputs, grouped.selected, grouped.refused) == (one.inputs, one.selected, one.refused)
        assert one.used == _walked(translation, rules).used, "rows and rules counted as used"


def _walked(translation, rules):
    from dsv4sel.check.host_spaces import _Walk

    walk = _Walk(translation, rules)
    for partial, free in walk.partials():
        walk.decide_group(partial, free)
    return walk


def test_a_name_outside_the_space_is_located(tmp_path):
    path = _variant(tmp_path, "when: {deployment: prefill_backend_other}", "when: {deployment: prefil_backend_other}")
    with pytest.raises(RuleError) as info:
        load(path)
    (p,) = info.value.problems
    text = Path(path).read_text()
    line = _line_of(text, "prefil_backend_other")
    column = text.splitlines()[line - 1].index("prefil_backend_other") + 1
    assert (p.code, p.line, p.column) == ("DSV601", line, column)  # at the misspelt name
    # DSV601's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`); the values
    # listed are the shipped space's, data
    assert re.fullmatch(r"deployment value 'prefil_backend_other' is not in the translation's space \([a-z_, ]+\)",
                        p.message), p.message


def test_a_schema_violation_is_located(tmp_path):
    path = _variant(tmp_path, "  - fix: S1\n", "  - fix: S1\n    because: typo\n")
    with pytest.raises(RuleError) as info:
        load(path)
    (p,) = info.value.problems
    assert p.code.startswith("DSV2") and p.line == _line_of(Path(path).read_text(), "because: typo")


def test_an_unmapped_kv_dtype_is_a_host_gap(tmp_path):
    path = _variant(tmp_path, "    map: {auto: auto, fp8_e4m3: fp8, bfloat16: bfloat16, fp8_e5m2: fp8_e5m2}",
                    "    map: {auto: auto, bfloat16: bfloat16, fp8_e5m2: fp8_e5m2}")
    _, findings = check_translation(load(path), dsv4sel.default_rules())
    gaps = [f for f in findings if f.code == "DSV602"]
    assert len(gaps) == 1 and gaps[0].count > 0 and "kv_cache_dtype=fp8_e4m3" in gaps[0].message  # the input it misses (data)
    assert gaps[0].severity == "error"
    # DSV602's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`)
    assert re.fullmatch(r"\d+ SGLang inputs of the host space are not decided: no translation row maps it "
                        r"\(KeyError 'fp8_e4m3'\); e\.g\. model=\S+ .*", gaps[0].message), gaps[0].message


def test_a_row_that_decides_nothing_is_a_warning_at_its_line(tmp_path):
    # a copy of the first refusal ahead of it: the copy takes every input the shipped row matches
    row = "  - fix: S1\n    when: {deployment: attention_backend_other}\n    reason: first\n"
    path = _variant(tmp_path, "refuse:\n", "refuse:\n" + row)
    _, findings = check_translation(load(path), dsv4sel.default_rules())
    (dead,) = [f for f in findings if f.code == "DSV603"]
    lines = Path(path).read_text().splitlines()
    shipped_row = [i for i, line in enumerate(lines, 1) if "when: {deployment: attention_backend_other}" in line][1] - 1
    assert dead.severity == "warning" and dead.line == shipped_row
    # DSV603's wording, pinned here once (tests/engine/wording.yaml's `elsewhere:`)
    assert dead.message == ("this SGLang translation row decides no input of the host space (earlier rows take "
                            "all it matches, or it matches none); remove it or fix its `when`")


@pytest.mark.parametrize(("when", "point", "held"), [
    ({"platform": ("cuda", "rocm")}, {"platform": "rocm"}, True),
    ({"platform": ("cuda",)}, {"platform": "rocm"}, False),
    ({"kv_layout_env": ("!unset",)}, {"kv_layout_env": "unset"}, False),
    ({"kv_layout_env": ("!unset", "!auto")}, {"kv_layout_env": "flat"}, True),
    ({"platform": ("cuda",)}, {}, False),  # an input the point lacks meets no value
    ({"platform": ("!cuda",)}, {}, True),  # ... and every exclusion
    # a value a host handed over that is no string at all (a list): none of the named values
    ({"platform": ("cuda",)}, {"platform": ["cuda"]}, False),
    ({"platform": ("!cuda",)}, {"platform": ["cuda"]}, True),
])
def test_a_row_condition_names_values_or_excludes_them(when, point, held):
    from dsv4sel.translation import holds

    assert holds(when, point) is held
