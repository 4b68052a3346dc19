"""The shipped DeepSeek-V4 landscape: every case issue #2 lists, as a user sees it."""

import pytest

import dsv4sel
from dsv4sel import InvalidQuery, SelectionError

FLASHMLA_IMPL = "dsv4sel.kernels.flashmla:DeepseekV4FlashMLASparseImpl"
FLASHINFER_IMPL = "dsv4sel.kernels.flashinfer:DeepseekV4FlashInferMLASparseImpl"
ROCM_IMPL = "dsv4sel.kernels.rocm:DeepseekV4ROCMAiterMLASparseImpl"
REWRITE_MESSAGE = "Using DeepSeek's fp8_ds_mla KV cache format."
NON_FP8 = ["float16", "bfloat16", "int8", "fp8_e5m2", "fp8_inc", "fp8_per_token_head",
           "int8_per_token_head", "int4_per_token_head", "nvfp4", "turboquant_k8v4",
           "turboquant_4bit_nc", "turboquant_3bit_nc"]


def select(**kw):
    return dsv4sel.select(**kw)


def assert_ds_mla(sel, *, rewritten):
    assert (sel.layout, sel.cache_dtype, sel.torch_dtype_name, sel.bytes_per_token, sel.block_size) == (
        "fp8_ds_mla", "fp8_ds_mla", "uint8", 584, 256)
    if rewritten:
        assert dict(sel.rewrites) == {"cache_dtype": "fp8_ds_mla"}
        assert REWRITE_MESSAGE in sel.messages
    else:
        assert dict(sel.rewrites) == {}
        assert REWRITE_MESSAGE not in sel.messages


# ---------------------------------------------------------------- defaults

@pytest.mark.parametrize("capability", ["12.0", "12.1", (12, 0)])
def test_default_on_sm12x_is_flashinfer_in_fp8_ds_mla(capability):
    sel = select(platform="cuda", capability=capability, kv_cache_dtype="fp8")
    assert sel.backend == "FLASHINFER_MLA_SPARSE_DSV4"
    assert sel.impl == FLASHINFER_IMPL
    assert_ds_mla(sel, rewritten=True)
    assert sel.path[0].id == "default-cuda-sm12x"


@pytest.mark.parametrize("capability", ["9.0", "10.0", "10.3", (9, 0)])
def test_default_on_other_cuda_is_flashmla(capability):
    sel = select(platform="cuda", capability=capability, kv_cache_dtype="fp8")
    assert (sel.backend, sel.impl) == ("FLASHMLA_SPARSE_DSV4", FLASHMLA_IMPL)
    assert_ds_mla(sel, rewritten=True)


@pytest.mark.parametrize("capability", ["gfx942", "gfx950", "gfx942:sramecc+:xnack-"])
def test_default_on_rocm_is_the_rocm_port(capability):
    sel = select(platform="rocm", capability=capability, kv_cache_dtype="auto")
    assert (sel.backend, sel.impl) == ("ROCM_FLASHMLA_SPARSE_DSV4", ROCM_IMPL)
    assert_ds_mla(sel, rewritten=True)


def test_unknown_cuda_capability_is_treated_as_not_sm12_with_a_message():
    sel = select(platform="cuda", capability=None, kv_cache_dtype="auto")
    assert sel.backend == "FLASHMLA_SPARSE_DSV4"
    assert any("capability unknown" in m and m.level == "warning" for m in sel.messages)
    fi = select(platform="cuda", capability=None, backend="FLASHINFER_MLA_SPARSE_DSV4", kv_cache_dtype="auto")
    assert fi.layout == "bf16_row"
    assert any("capability unknown" in m for m in fi.messages)


def test_an_undeclared_capability_is_refused_not_decided_as_unknown():
    with pytest.raises(InvalidQuery) as info:
        select(platform="cuda", capability="10.1", kv_cache_dtype="fp8")
    assert "cuda capability '10.1' is not declared" in str(info.value)
    assert info.value.suggestions == ("--capability unknown",)


# ---------------------------------------------------- fp8_ds_mla layout family

DS_MLA_SETUPS = [
    dict(platform="cuda", capability="9.0", backend=None),
    dict(platform="cuda", capability="10.0", backend="FLASHMLA_SPARSE_DSV4"),
    dict(platform="cuda", capability="12.0", backend="FLASHINFER_MLA_SPARSE_DSV4"),
    dict(platform="rocm", capability="gfx950", backend=None),
]


@pytest.mark.parametrize("setup", DS_MLA_SETUPS)
@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3", "auto"])
def test_fp8_and_auto_map_to_fp8_ds_mla_with_a_rewrite(setup, kv):
    # auto is vLLM's CLI default; the seed asserted here (vLLM #47174)
    assert_ds_mla(select(kv_cache_dtype=kv, **setup), rewritten=True)


@pytest.mark.parametrize("setup", DS_MLA_SETUPS)
def test_fp8_ds_mla_is_kept_without_a_rewrite(setup):
    assert_ds_mla(select(kv_cache_dtype="fp8_ds_mla", **setup), rewritten=False)


@pytest.mark.parametrize("setup", DS_MLA_SETUPS)
@pytest.mark.parametrize("kv", NON_FP8)
def test_fp8_ds_mla_layout_rejects_e5m2_inc_and_non_fp8(setup, kv):
    # the seed silently rewrote fp8_e5m2 to e4m3 data and asserted on bfloat16
    with pytest.raises(SelectionError) as info:
        select(kv_cache_dtype=kv, **setup)
    assert kv in str(info.value)
    assert any("--kv-cache-dtype" in s for s in info.value.suggestions)


# ------------------------------------------------ FlashInfer on SM10x rows

@pytest.mark.parametrize("capability", ["10.0", "10.3", None])
def test_flashinfer_sm10x_bf16_rows_keep_the_requested_string(capability):
    for kv in ("auto", "bfloat16"):
        sel = select(platform="cuda", capability=capability, backend="FLASHINFER_MLA_SPARSE_DSV4",
                     kv_cache_dtype=kv)
        assert (sel.impl, sel.layout, sel.cache_dtype, sel.torch_dtype_name, sel.bytes_per_token) == (
            FLASHINFER_IMPL, "bf16_row", kv, "bfloat16", 1024)
        assert dict(sel.rewrites) == {}


@pytest.mark.parametrize("kv", ["fp8", "fp8_e4m3"])
def test_flashinfer_sm10x_fp8_rows_keep_the_requested_string(kv):
    sel = select(platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4", kv_cache_dtype=kv)
    assert (sel.layout, sel.cache_dtype, sel.torch_dtype_name, sel.bytes_per_token) == (
        "fp8_e4m3_row", kv, "float8_e4m3fn", 512)
    assert dict(sel.rewrites) == {}


@pytest.mark.parametrize("kv", ["fp8_ds_mla", "fp8_e5m2", "float16", "int8", "nvfp4"])
def test_flashinfer_sm10x_rejects_other_dtypes(kv):
    with pytest.raises(SelectionError, match="plain bf16 or fp8 e4m3 rows"):
        select(platform="cuda", capability="10.0", backend="FLASHINFER_MLA_SPARSE_DSV4", kv_cache_dtype=kv)


def test_flashinfer_on_sm9x_is_rejected_and_suggests_flashmla():
    with pytest.raises(SelectionError) as info:
        select(platform="cuda", capability="9.0", backend="FLASHINFER_MLA_SPARSE_DSV4", kv_cache_dtype="fp8")
    assert "SM100 or SM120" in str(info.value)
    assert any("FLASHMLA_SPARSE_DSV4" in s for s in info.value.suggestions)


# ------------------------------------------------ explicit backend requests

@pytest.mark.parametrize("capability", ["12.0", "12.1"])
def test_flashmla_on_sm12x_is_rejected(capability):
    with pytest.raises(SelectionError, match="SM90 and SM100 only") as info:
        select(platform="cuda", capability=capability, backend="FLASHMLA_SPARSE_DSV4", kv_cache_dtype="fp8")
    assert any("FLASHINFER_MLA_SPARSE_DSV4" in s for s in info.value.suggestions)


def test_flashmla_on_rocm_gives_the_rocm_port_with_a_warning():
    sel = select(platform="rocm", capability="gfx942", backend="FLASHMLA_SPARSE_DSV4", kv_cache_dtype="fp8")
    assert (sel.backend, sel.impl) == ("ROCM_FLASHMLA_SPARSE_DSV4", ROCM_IMPL)
    assert any(m.level == "warning" and "CUDA-only" in m for m in sel.messages)
    assert [r.id for r in sel.path] == ["flashmla-on-rocm", "rocm-fp8"]


def test_flashinfer_on_rocm_is_rejected():
    with pytest.raises(SelectionError, match="needs a CUDA GPU"):
        select(platform="rocm", capability="gfx942", backend="FLASHINFER_MLA_SPARSE_DSV4", kv_cache_dtype="fp8")


@pytest.mark.parametrize("capability", ["9.0", "10.0", "12.0"])
def test_rocm_backend_on_cuda_is_rejected(capability):
    with pytest.raises(SelectionError, match="runs on ROCm only"):
        select(platform="cuda", capability=capability, backend="ROCM_FLASHMLA_SPARSE_DSV4", kv_cache_dtype="fp8")


@pytest.mark.parametrize("name", ["FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120", "TRITON_MLA", "FLASH_ATTN"])
def test_non_dsv4_backends_are_rejected_naming_the_dsv4_ones(name):
    with pytest.raises(SelectionError) as info:
        select(platform="cuda", capability="9.0", backend=name, kv_cache_dtype="fp8")
    message = str(info.value)
    assert f"{name} is a vLLM attention backend but not a DeepSeek-V4 one" in message
    for dsv4 in ("FLASHMLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV4", "ROCM_FLASHMLA_SPARSE_DSV4"):
        assert dsv4 in message


def test_unknown_backend_name_lists_the_valid_names_and_the_nearest():
    with pytest.raises(dsv4sel.InvalidQuery) as info:
        select(platform="cuda", capability="9.0", backend="FLASHMLA_SPARSE_DSV5")
    message = str(info.value)
    assert "unknown attention backend 'FLASHMLA_SPARSE_DSV5'" in message
    assert "did you mean 'FLASHMLA_SPARSE_DSV4'" in message
    assert "DeepSeek-V4 backends: " in message and "ROCM_FLASHMLA_SPARSE_DSV4" in message
    assert info.value.suggestions == ("--attention-backend FLASHMLA_SPARSE_DSV4",)


def test_unsupported_cuda_generation_is_rejected_by_the_default_decision():
    with pytest.raises(SelectionError, match="no DeepSeek-V4 attention backend runs on CUDA 8.0") as info:
        select(platform="cuda", capability="8.0")
    assert info.value.rule.id == "default-cuda-unsupported"
    assert info.value.suggestions == ()


# ------------------------------------------------------------ xpu and cpu

@pytest.mark.parametrize("platform,backend", [("cpu", "CPU_V4_MLA_SPARSE"), ("xpu", "XPU_V4_MLA_SPARSE")])
def test_cpu_and_xpu_run_the_reference_decode_over_fp8_ds_mla(platform, backend):
    sel = select(platform=platform, kv_cache_dtype="auto")
    assert sel.backend == backend
    assert sel.impl == "dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl"
    assert_ds_mla(sel, rewritten=True)
    assert any("reference" in m and m.level == "warning" for m in sel.messages)
    with pytest.raises(SelectionError):
        select(platform=platform, kv_cache_dtype="bfloat16")


# ---------------------------------------------------------- rule locations

def test_selection_names_the_deciding_rule_file_and_line():
    sel = select(platform="cuda", capability="9.0", kv_cache_dtype="fp8_ds_mla")
    assert sel.rule.id == "flashmla-fp8-ds-mla"
    assert sel.rule.file == "rules/flashmla.yaml"
    from dsv4sel.engine.sources import shipped_rules_dir

    with open(shipped_rules_dir() + "/flashmla.yaml") as fh:
        lines = fh.read().splitlines()
    assert lines[sel.rule.line - 1].strip() == "- id: flashmla-fp8-ds-mla"
