"""dsv4sel.vllm: the seed's three functions, same contracts, the seed's bugs fixed."""

import logging
from types import SimpleNamespace

import pytest
import torch

from dsv4sel import InvalidQuery, SelectionError
from dsv4sel import vllm as dv


def vllm_config(backend=None, cache_dtype="auto"):
    return SimpleNamespace(attention_config=SimpleNamespace(backend=backend),
                           cache_config=SimpleNamespace(cache_dtype=cache_dtype))


@pytest.fixture(autouse=True)
def _fresh_log_once():
    dv._logged.clear()


def test_resolve_backend_reads_attention_config_or_returns_none():
    assert dv.resolve_dsv4_backend(None) is None
    assert dv.resolve_dsv4_backend(SimpleNamespace()) is None
    assert dv.resolve_dsv4_backend(vllm_config("FLASHMLA_SPARSE_DSV4")) == "FLASHMLA_SPARSE_DSV4"


def test_kv_dtype_rewrites_cache_config_like_the_seed_and_logs_once(caplog):
    cache_config = SimpleNamespace(cache_dtype="fp8")
    with caplog.at_level(logging.INFO, logger="dsv4sel"):
        for _ in range(3):
            result = dv.resolve_dsv4_kv_cache_dtype(None, "fp8", cache_config, platform="cuda", capability="9.0")
    assert result == ("fp8_ds_mla", torch.uint8)
    assert cache_config.cache_dtype == "fp8_ds_mla"
    assert [r.getMessage() for r in caplog.records].count("Using DeepSeek's fp8_ds_mla KV cache format.") == 1


def test_auto_works_where_the_seed_asserted():
    cache_config = SimpleNamespace(cache_dtype="auto")
    assert dv.resolve_dsv4_kv_cache_dtype(None, "auto", cache_config, platform="cuda",
                                          capability=(9, 0)) == ("fp8_ds_mla", torch.uint8)
    assert cache_config.cache_dtype == "fp8_ds_mla"


def test_flashinfer_sm10x_keeps_the_string_like_the_seed():
    cache_config = SimpleNamespace(cache_dtype="fp8")
    assert dv.resolve_dsv4_kv_cache_dtype("FLASHINFER_MLA_SPARSE_DSV4", "fp8", cache_config, platform="cuda",
                                          capability="10.0") == ("fp8", torch.float8_e4m3fn)
    assert dv.resolve_dsv4_kv_cache_dtype("FLASHINFER_MLA_SPARSE_DSV4", "auto", None, platform="cuda",
                                          capability="10.0") == ("auto", torch.bfloat16)
    assert cache_config.cache_dtype == "fp8"


@pytest.mark.parametrize("kv", ["fp8_e5m2", "bfloat16"])
def test_a_rejection_raises_and_leaves_cache_config_untouched(kv):
    cache_config = SimpleNamespace(cache_dtype=kv)
    with pytest.raises(SelectionError):
        dv.resolve_dsv4_kv_cache_dtype(None, kv, cache_config, platform="cuda", capability="9.0")
    assert cache_config.cache_dtype == kv


def test_select_impl_follows_the_platform_default_and_the_request(caplog):
    with caplog.at_level(logging.INFO, logger="dsv4sel"):
        cls = dv.select_v4_sparse_impl(vllm_config(), platform="cuda", capability="9.0")
    assert cls.__name__ == "DeepseekV4FlashMLASparseImpl"
    assert "Using FLASHMLA_SPARSE_DSV4 backend." in caplog.messages
    cls = dv.select_v4_sparse_impl(vllm_config("FLASHINFER_MLA_SPARSE_DSV4", "fp8"), platform="cuda",
                                   capability="10.0")
    assert cls.__name__ == "DeepseekV4FlashInferMLASparseImpl"


def test_select_impl_never_gives_rocm_a_cuda_impl():
    # the seed checked FLASHINFER before ROCm and returned the CUDA impl on ROCm
    with pytest.raises(SelectionError, match="needs a CUDA GPU"):
        dv.select_v4_sparse_impl(vllm_config("FLASHINFER_MLA_SPARSE_DSV4"), platform="rocm", capability="gfx942")
    assert dv.select_v4_sparse_impl(None, platform="rocm", capability="gfx942").__name__ == \
        "DeepseekV4ROCMAiterMLASparseImpl"


def test_select_impl_rejects_non_dsv4_backends_instead_of_falling_back():
    with pytest.raises(SelectionError, match="not a DeepSeek-V4 one"):
        dv.select_v4_sparse_impl(vllm_config("TRITON_MLA"), platform="cuda", capability="9.0")


@pytest.fixture
def no_gpu(monkeypatch):
    """torch as on a machine without an accelerator, whatever this machine has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)


def test_platform_detection_reads_cuda_and_rocm_from_torch(monkeypatch):
    monkeypatch.delenv("DSV4SEL_PLATFORM", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=0: (12, 0))
    monkeypatch.setattr(torch.version, "hip", None)
    assert dv.select_v4_sparse_impl(None).__name__ == "DeepseekV4FlashInferMLASparseImpl"
    monkeypatch.setattr(torch.version, "hip", "6.4")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device=0: SimpleNamespace(gcnArchName="gfx942:sramecc+:xnack-"))
    assert dv.select_v4_sparse_impl(None).__name__ == "DeepseekV4ROCMAiterMLASparseImpl"


def test_platform_detection_falls_back_to_the_environment(monkeypatch, no_gpu):
    # no GPU visible to torch: detection reaches DSV4SEL_PLATFORM
    monkeypatch.setenv("DSV4SEL_PLATFORM", "cpu")
    assert dv.select_v4_sparse_impl(None).__name__ == "DeepseekV4ReferenceSparseImpl"
    monkeypatch.setenv("DSV4SEL_PLATFORM", "cuda")
    monkeypatch.setenv("DSV4SEL_CAPABILITY", "12.0")
    assert dv.resolve_dsv4_kv_cache_dtype(None, "fp8_ds_mla", None) == ("fp8_ds_mla", torch.uint8)


def test_platform_detection_failure_names_the_options(monkeypatch, no_gpu):
    monkeypatch.delenv("DSV4SEL_PLATFORM", raising=False)
    with pytest.raises(InvalidQuery, match="cannot detect the platform.*cuda, rocm, xpu, cpu.*DSV4SEL_PLATFORM"):
        dv.select_v4_sparse_impl(None)
    monkeypatch.setenv("DSV4SEL_PLATFORM", "tpu")
    with pytest.raises(InvalidQuery, match="DSV4SEL_PLATFORM='tpu' is not a platform"):
        dv.select_v4_sparse_impl(None)
