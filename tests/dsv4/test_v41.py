"""DeepSeek-V4.1, added as YAML: its own backends, never crossing with V4.0 classes."""

import pytest

import dsv4sel
from dsv4sel import SelectionError

V41 = dict(model="deepseek_v4_1", platform="cuda")
V40_IMPLS = ("dsv4sel.kernels.flashmla:", "dsv4sel.kernels.flashinfer:", "dsv4sel.kernels.rocm:",
             "dsv4sel.kernels.reference:")


@pytest.mark.parametrize("capability", ["12.0", "12.1"])
def test_sm12x_defaults_to_flashinfer_dsv41_on_v4s_record_in_blocks_of_128(capability):
    # vLLM 0.33 writes V4.1's 528-byte record on SM100 only; FlashInfer-V4.1's kernel block is always 128
    sel = dsv4sel.select(capability=capability, **V41)
    assert (sel.backend, sel.layout, sel.bytes_per_token, sel.block_size) == (
        "FLASHINFER_MLA_SPARSE_DSV41", "fp8_ds_mla", 584, 128)
    assert (sel.cache_dtype, sel.torch_dtype_name, dict(sel.rewrites)) == ("fp8_ds_mla", "uint8", {"cache_dtype": "fp8_ds_mla"})
    assert sel.host_class("vllm")[0].endswith(":DeepseekV4FlashInferSM120Attention")


def test_sm100_gets_mega_attention_when_available():
    sel = dsv4sel.select(capability="10.0", mega_attn="available", **V41)
    assert sel.backend == "FLASHMLA_MEGA_ATTN_DSV41"
    assert sel.impl == "dsv4sel.kernels.v41:DeepseekV41MegaAttnImpl"
    assert (sel.layout, sel.bytes_per_token, sel.block_size) == ("fp8_ds_mla_v41", 528, 128)
    assert any("nvfp4_ds_mla" in m and "288 B/token" in m for m in sel.messages)


def test_sm100_falls_back_to_flashmla_dsv41_without_mega_attention_and_says_why():
    sel = dsv4sel.select(capability="10.0", **V41)
    assert (sel.backend, sel.block_size) == ("FLASHMLA_SPARSE_DSV41", 128)
    assert any("mega-attention is unavailable" in m for m in sel.messages)


@pytest.mark.parametrize("kv", ["auto", "fp8", "fp8_ds_mla"])
def test_sm90_uses_flashmla_dsv41_on_v4s_record_in_blocks_of_64(kv):
    # FlashMLA decodes V4.1's 528-byte record only in its SM100 kernels: Hopper keeps V4's 584-byte one
    sel = dsv4sel.select(capability="9.0", kv_cache_dtype=kv, **V41)
    assert (sel.backend, sel.layout, sel.bytes_per_token, sel.block_size) == ("FLASHMLA_SPARSE_DSV41", "fp8_ds_mla", 584, 64)
    assert sel.cache_dtype == "fp8_ds_mla"


@pytest.mark.parametrize("capability", ["10.0", "10.3"])
def test_the_528_byte_record_is_selected_on_sm100_only(capability):
    sel = dsv4sel.select(capability=capability, backend="FLASHMLA_SPARSE_DSV41", **V41)
    assert (sel.layout, sel.bytes_per_token, sel.block_size) == ("fp8_ds_mla_v41", 528, 128)
    rules = dsv4sel.default_rules()
    # an unknown CUDA capability is taken as SM100 by FlashMLA-V4.1 (with the default rules' warning)
    where = {key[1:3] for key, index in rules.items() if rules.rows[index].kind == "select"
             and rules.rows[index].layout == "fp8_ds_mla_v41" and key[2] != "unknown"}
    assert where == {("cuda", "10.0"), ("cuda", "10.3")}


def test_nvfp4_ds_mla_is_kept_by_mega_attention_only():
    sel = dsv4sel.select(capability="10.0", mega_attn="available", kv_cache_dtype="nvfp4_ds_mla", **V41)
    # the string names the compressed cache's format; the main/SWA cache keeps V4.1's fp8 record
    assert (sel.layout, sel.cache_dtype, sel.bytes_per_token, dict(sel.rewrites)) == (
        "fp8_ds_mla_v41", "nvfp4_ds_mla", 528, {})
    assert any("nvfp4_ds_mla" in m and "288 B/token" in m for m in sel.messages)
    with pytest.raises(SelectionError):
        dsv4sel.select(capability="10.0", kv_cache_dtype="nvfp4_ds_mla", **V41)
    with pytest.raises(SelectionError):
        dsv4sel.select(platform="cuda", capability="10.0", kv_cache_dtype="nvfp4_ds_mla")


def test_requesting_mega_attention_when_unavailable_is_rejected_with_the_alternative():
    with pytest.raises(SelectionError, match="mega-attention cannot serve here") as info:
        dsv4sel.select(capability="10.0", backend="FLASHMLA_MEGA_ATTN_DSV41", **V41)
    assert any("FLASHMLA_SPARSE_DSV41" in s for s in info.value.suggestions)


@pytest.mark.parametrize("backend", ["ROCM_FLASHMLA_SPARSE_DSV4", "CPU_V4_MLA_SPARSE"])
def test_a_v41_query_never_resolves_a_v40_backend(backend):
    with pytest.raises(SelectionError, match="serves deepseek_v4 only"):
        dsv4sel.select(capability="10.0", backend=backend, **V41)


@pytest.mark.parametrize("alias, target", [("FLASHMLA_SPARSE_DSV4", "FLASHMLA_SPARSE_DSV41"),
                                           ("FLASHMLA_SPARSE", "FLASHMLA_SPARSE_DSV41"),
                                           ("FLASHINFER_MLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV41")])
def test_v40_names_are_aliases_of_the_v41_backends_as_in_vllm_033(alias, target):
    """vLLM 0.33 accepts the V4.0 names for V4.1 and builds V4.1's own class."""
    sel = dsv4sel.select(capability="10.0", backend=alias, **V41)
    assert sel.backend == target and sel.impl.startswith("dsv4sel.kernels.v41:")
    assert sel.host_class("vllm")[0].startswith("vllm.models.deepseek_v41.")


def test_v41_packed_layouts_refuse_fp8_e4m3_as_vllm_033_does():
    with pytest.raises(SelectionError):
        dsv4sel.select(capability="9.0", kv_cache_dtype="fp8_e4m3", **V41)


def test_mega_attention_defaults_to_nvfp4_ds_mla():
    sel = dsv4sel.select(capability="10.0", mega_attn="available", **V41)
    assert (sel.cache_dtype, dict(sel.rewrites)) == ("nvfp4_ds_mla", {"cache_dtype": "nvfp4_ds_mla"})


def test_prefill_context_parallelism_is_served_by_flashmla_only():
    sel = dsv4sel.select(capability="10.0", mega_attn="available", prefill_context_parallel="on", **V41)
    assert sel.backend == "FLASHMLA_SPARSE_DSV41"
    with pytest.raises(SelectionError, match="prefill context parallelism"):
        dsv4sel.select(capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV41", prefill_context_parallel="on",
                       **V41)


@pytest.mark.parametrize("backend", ["FLASHMLA_SPARSE_DSV41", "FLASHINFER_MLA_SPARSE_DSV41",
                                     "FLASHMLA_MEGA_ATTN_DSV41"])
def test_a_v40_query_never_resolves_a_v41_backend(backend):
    with pytest.raises(SelectionError, match="serves deepseek_v4_1 only"):
        dsv4sel.select(platform="cuda", capability="10.0", backend=backend, mega_attn="available")


def test_no_selection_anywhere_crosses_models():
    rules = dsv4sel.default_rules()
    for key, index in rules.items():
        row = rules.rows[index]
        if row.kind != "select":
            continue
        model, impl = key[0], row.impl
        if model == "deepseek_v4_1":
            assert impl.startswith("dsv4sel.kernels.v41:"), (key, impl)
        else:
            assert impl.startswith(V40_IMPLS), (key, impl)


def test_v41_on_rocm_defaults_to_rocm_flashmla_sparse_dsv41():
    sel = dsv4sel.select(model="deepseek_v4_1", platform="rocm", capability="gfx942")
    assert (sel.backend, sel.layout, sel.bytes_per_token, sel.block_size) == (
        "ROCM_FLASHMLA_SPARSE_DSV41", "fp8_ds_mla", 584, 64)
    assert sel.host_class("vllm")[0] == "vllm.models.deepseek_v41.amd.rocm:DeepseekV41ROCMAiterMLAAttention"
    with pytest.raises(SelectionError, match="gfx942, gfx950 and gfx11"):
        dsv4sel.select(model="deepseek_v4_1", platform="rocm", capability="gfx90a")
