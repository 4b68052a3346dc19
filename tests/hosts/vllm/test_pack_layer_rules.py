"""A rule served by dsv4sel's vLLM pack layer, as the rules and ``dsv4sel check`` see it (no vLLM
needed): DSV415 per way a rule does not fit the vLLM layer that hosts its impl, a pack's own vLLM layer
class allowed only as its impl module is (DSV315 says how), and the hosting table (issue 33)."""
from __future__ import annotations

from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.dsv4.vllm_hosting import PACK_LAYER, host_layer, releases_of
from dsv4sel.engine.sources import default_packs

HERE = Path(__file__).resolve().parent
CODES = HERE.parents[1] / "engine" / "rules" / "codes" / "pack_layer"
B12X = HERE.parents[2] / "examples" / "b12x-pack"


def _findings(paths, allowed=(), code="DSV415"):
    report = dsv4sel.verify([*default_packs(), *paths], allowed_impl_modules=allowed)
    return [f for f in report.findings if f.code == code]


def test_check_refuses_each_rule_that_does_not_fit_its_hosting_layer():
    """One finding per rule and problem, at the rule's line: no prefill path (SM8x, an impl without the
    hook), a layout and size vLLM's layer does not store, an input the layer's __init__ needs, and a
    platform where vLLM has no layer that can host an impl."""
    found = {(f.line, f.rules[0].id): f.message for f in _findings([CODES])}
    assert sorted(found) == [(21, "p-sm8x-no-prefill"), (24, "p-rows"), (27, "p-sm120-any-flashinfer"),
                             (30, "p-rocm")], found
    assert "no prefill path" in found[(21, "p-sm8x-no-prefill")]
    assert "layout 'bf16_row' (the layer: 'fp8_ds_mla')" in found[(24, "p-rows")]
    assert "flashinfer_sm120=missing" in found[(27, "p-sm120-any-flashinfer")]
    assert "has no DeepSeek-V4 layer that can serve an impl for deepseek_v4 on rocm" in found[(30, "p-rocm")]


def test_check_refuses_fp8_ds_mla_pages_handed_to_an_impl_that_reads_bf16_rows(tmp_path, monkeypatch):
    (tmp_path / "rows_only.py").write_text(
        "from dsv4sel.kernels.reference import DeepseekV4ReferenceSparseImpl\n\n"
        "class RowsOnly(DeepseekV4ReferenceSparseImpl):\n"
        "    supported_layouts = frozenset({'bf16_row'})\n")
    rules = tmp_path / "rules"
    rules.mkdir()
    text = (HERE / "rules" / "torchref" / "torchref.yaml").read_text()
    (rules / "rows.yaml").write_text(text.replace("dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl",
                                                  "rows_only:RowsOnly"))
    monkeypatch.syspath_prepend(str(tmp_path))
    found = _findings([rules], allowed=("rows_only",))
    assert {f.rules[0].id for f in found} == {"torchref-fp8-ds-mla", "torchref-fp8"}, [f.message for f in found]
    assert all("hands the impl fp8_ds_mla pages, but RowsOnly reads bf16_row" in f.message for f in found)
    assert all(str(f.file).endswith("rows.yaml") for f in found)


def test_the_example_pack_and_the_suite_s_pack_are_clean(monkeypatch):
    monkeypatch.syspath_prepend(str(B12X))
    assert _findings([B12X / "dsv4sel_b12x" / "rules"], allowed=("dsv4sel_b12x",)) == []
    assert _findings([HERE / "rules" / "torchref"]) == []


def test_a_pack_s_own_vllm_layer_needs_its_module_allowed_and_the_error_says_how():
    with pytest.raises(dsv4sel.RuleError) as err:
        dsv4sel.load_rules([*default_packs(), HERE / "rules" / "ownlayer"], use_cache=False)
    (problem,) = [p for p in err.value.problems if p.code == "DSV315"]
    assert str(problem.loc).endswith("ownlayer.yaml:14:17"), problem.loc
    for part in ("'ownlayer_pack.layer:OwnFlashMLAAttention' is outside the host's package 'vllm'",
                 "--allow-impl-module ownlayer_pack", "DSV4SEL_ALLOW_IMPL_MODULES=ownlayer_pack", PACK_LAYER):
        assert part in problem.message, problem.message
    rules = dsv4sel.load_rules([*default_packs(), HERE / "rules" / "ownlayer"],
                               allowed_impl_modules=("ownlayer_pack",), use_cache=False)
    sel = rules.select(platform="cuda", capability="9.0", backend="OWNLAYER_MLA_SPARSE")
    assert sel.host_class("vllm") == ("ownlayer_pack.layer:OwnFlashMLAAttention", ">=0.33.0,<0.34")


def test_the_pack_layer_is_a_vllm_host_class_the_rules_may_name_without_an_allow_list():
    rules = dsv4sel.load_rules([*default_packs(), HERE / "rules" / "torchref"], use_cache=False)
    sel = rules.select(platform="cuda", capability="9.0", backend="TORCHREF_MLA_SPARSE")
    assert sel.host_class("vllm") == (PACK_LAYER, ">=0.33.0,<0.34")


@pytest.mark.parametrize(("release", "model", "capability", "base", "layout", "block"), [
    ("0.33.0", "deepseek_v4", "9.0", "DeepseekV4FlashMLAAttention", "fp8_ds_mla", 256),
    ("0.33.0", "deepseek_v4", "8.6", "DeepseekV4FlashMLAAttention", "fp8_ds_mla", 256),
    ("0.33.0", "deepseek_v4", "12.1", "DeepseekV4FlashInferSM120Attention", "fp8_ds_mla", 256),
    ("0.33.0", "deepseek_v4_1", "9.0", "DeepseekV4FlashMLAAttention", "fp8_ds_mla", 64),
    ("0.33.0", "deepseek_v4_1", "10.0", "DeepseekV4FlashMLAAttention", "fp8_ds_mla_v41", 128),
    ("0.33.0", "deepseek_v4_1", "12.0", "DeepseekV4FlashInferSM120Attention", "fp8_ds_mla", 128),
    ("0.34.0", "deepseek_v4_1", "12.0", "DeepseekV4FlashInferSM120Attention", "fp8_ds_mla", 64),
])
def test_the_hosting_table_names_vllm_s_layer_and_its_cache(release, model, capability, base, layout, block):
    row = host_layer(release, model, "cuda", capability)
    assert row is not None and (row.base_name, row.layout, row.block_size) == (base, layout, block)
    assert row.base.startswith("vllm.models.deepseek_v41." if model == "deepseek_v4_1" else "vllm.models.deepseek_v4.")


@pytest.mark.parametrize(("platform", "capability"), [("rocm", "gfx942"), ("cpu", None), ("xpu", None),
                                                      ("cuda", "unknown"), ("cuda", None)])
def test_the_hosting_table_has_no_layer_where_vllm_has_none(platform, capability):
    assert host_layer("0.33.0", "deepseek_v4", platform, capability) is None
    assert host_layer("0.35.0", "deepseek_v4", "cuda", "9.0") is None  # a release the table does not describe


def test_a_rule_s_versions_pick_the_releases_check_proves():
    assert releases_of(">=0.33.0,<0.34") == ("0.33.0",)
    assert releases_of(">=0.33.0,<0.35") == ("0.33.0", "0.34.0")
    assert releases_of("not a spec") == ()
