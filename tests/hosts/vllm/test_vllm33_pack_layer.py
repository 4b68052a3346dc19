"""dsv4sel's pack layer in the real vLLM 0.33.0 (.venv-vllm): a pack's backend, named by
``--attention-backend`` or chosen by its default rule, is built by vLLM as vLLM's own DeepSeek-V4 layer
with the rule's impl as its sparse decode, and that decode call site equals the reference (issue 33).

One process of the vLLM environment (``tests/vllm33/pack_layer.py``, started on the suite's pool by
``tests/_vllm33.py``) runs every case: the plugin loaded by vLLM's ``load_general_plugins()``, each
configuration built as ``vllm serve`` builds it, each layer as vLLM's decoder layer builds it.
Skipped, with the reason, when the environment is missing.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for _vllm33
import _vllm33  # noqa: E402
from _vllm33 import B12X_PACK, RULES  # noqa: E402

pytestmark = pytest.mark.skipif(_vllm33.skip_reason() is not None, reason=_vllm33.skip_reason() or "")
PACK_MODULE = "dsv4sel.vllm_plugin.pack_layer"


@pytest.fixture(scope="module")
def cases(request, tmp_path_factory):
    _vllm33.start(request.session, tmp_path_factory)
    return _vllm33.result("pack_layer")


def _selection(capability: str, backend: str | None):
    """What the rules (shipped + the packs the vLLM process loads) select, decided here without vLLM."""
    import dsv4sel
    from dsv4sel.engine.sources import default_packs

    rules = dsv4sel.load_rules([*default_packs(), B12X_PACK / "dsv4sel_b12x" / "rules", RULES / "torchref"],
                               allowed_impl_modules=("dsv4sel_b12x",))
    return rules.select(platform="cuda", capability=capability, backend=backend)


@pytest.mark.parametrize(("case", "capability", "backend", "base"), [
    ("b12x-by-name", "12.0", "B12X_MLA_SPARSE", "vllm.models.deepseek_v4.nvidia.flashinfer_sparse."
     "DeepseekV4FlashInferSM120Attention"),
    ("b12x-by-default", "12.1", None, "vllm.models.deepseek_v4.nvidia.flashinfer_sparse."
     "DeepseekV4FlashInferSM120Attention"),
    ("torchref-by-name", "9.0", "TORCHREF_MLA_SPARSE", "vllm.models.deepseek_v4.nvidia.flashmla."
     "DeepseekV4FlashMLAAttention"),
])
def test_vllm_builds_the_pack_layer_with_the_rule_s_impl_and_cache(cases, case, capability, backend, base):
    """The layer vLLM's decoder builds is dsv4sel's pack layer on vLLM's own layer for the layout, its
    decode served by the rule's impl, with the rule's layout, cache dtype (vLLM's config rewritten to
    it), torch dtype, bytes per token (vLLM's KV-cache spec) and block size (what vLLM sets)."""
    got = cases[case]
    assert got["ok"], got
    sel = _selection(capability, backend)
    assert got["class"].startswith(PACK_MODULE + ".PackImpl") and got["pack_layer"] and got["is_vllm_base"], got
    assert got["vllm_base"] == base, got
    assert (got["impl"], got["impl_layout"]) == (sel.impl, sel.layout), got
    assert (got["cache_dtype"], got["cache_config"], got["torch_dtype"]) == (
        sel.cache_dtype, sel.cache_dtype, sel.torch_dtype_name), got
    assert (got["bytes_per_token"], got["block_size"]) == (sel.bytes_per_token, sel.block_size), got


def test_a_rejection_comes_when_vllm_validates_its_config_before_any_layer(cases):
    got = cases["b12x-rejected"]
    assert (got["ok"], got["at"], got["selection_error"]) == (False, "config", True), got
    assert "b12x-not-sm12x" in got["message"] and "Would work:" in got["message"], got


def test_a_pack_rule_that_vllm_s_layer_could_not_build_is_rejected_at_config(cases):
    # vLLM's SM120 layer prefills with FlashInfer's SM120 kernel and refuses to be built without it;
    # the pack's rule says so before any layer (check proves every pack-layer rule guards it: DSV415)
    got = cases["b12x-no-flashinfer"]
    assert (got["ok"], got["at"], got["selection_error"]) == (False, "config", True), got
    assert "b12x-no-flashinfer-prefill" in got["message"], got


def test_an_unknown_name_is_still_vllm_s_refusal_with_the_rules_suggestion(cases):
    got = cases["unknown-name"]
    assert (got["ok"], got["error"]) == (False, "ValueError"), got
    assert got["message"].startswith("Unknown attention backend: 'B12X_MLA_SPARES'"), got
    assert "did you mean 'B12X_MLA_SPARSE'?" in got["message"], got


def test_a_pack_name_given_to_another_model_is_refused_at_config(cases):
    got = cases["not-deepseek"]
    assert (got["ok"], got["at"], got["selection_error"]) == (False, "config", True), got
    assert "LlamaForCausalLM is not a DeepSeek-V4 model" in got["message"], got


def test_a_pack_s_own_vllm_layer_is_built_when_the_process_allows_its_module(cases):
    got = cases["own-layer"]
    assert got["ok"] and got["class"] == "ownlayer_pack.layer.OwnFlashMLAAttention" and not got["pack_layer"], got


@pytest.mark.parametrize("ratio", [1, 4, 128])
def test_the_decode_and_prefill_call_sites_equal_the_reference_decode(cases, ratio):
    """Sliding-window, C4A and C128A layers on vLLM's FlashMLA layer, caches and metadata laid out as
    vLLM hands them, a batch of two decode tokens and a prefill request: ``forward_mqa`` writes exactly
    what the reference decode gives on the same pages; the step's plan is made once and reused by the
    next layer of the type, a C4A layer re-plans only its own top-k lengths."""
    got = cases[f"decode-ratio-{ratio}"]
    assert "error" not in got, got
    assert got["equal"] and got["again_equal"] and got["finite"] and got["max_abs_diff"] == 0.0, got
    assert got["calls"] == {"plan": 1, "run": 2, "prefill": 2, "replan": 1 if ratio == 4 else 0}, got
    assert got["swa_rows"] == 64 and got["compressed_rows"] == (0 if ratio == 1 else 256 // ratio), got


def test_a_registered_name_unpickles_in_a_process_that_never_registered_it(cases):
    got = cases["pickle"]
    assert got == {"case": "pickle", "missing_before": True, "name": "B12X_MLA_SPARSE",
                   "value": "dsv4sel:B12X_MLA_SPARSE", "same": True}, got

