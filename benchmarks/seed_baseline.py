"""The seed's selection logic, re-expressed for timing only (not used by dsv4sel).

The seed (vLLM's deepseek_v4/attention.py at b5235fca2) reads the backend from
the config, compares it with an enum, asks the platform whether it is ROCm,
runs function-level ``from ... import`` statements and a log-once helper,
and maps the kv dtype with string tests. This module does the same steps
against stand-in modules so that both can be timed in one process.
"""

from __future__ import annotations

import enum
import sys
import types


class AttentionBackendEnum(enum.Enum):
    FLASHMLA_SPARSE_DSV4 = enum.auto()
    FLASHINFER_MLA_SPARSE_DSV4 = enum.auto()
    ROCM_FLASHMLA_SPARSE_DSV4 = enum.auto()


class _Platform:
    def __init__(self, rocm: bool):
        self._rocm = rocm

    def is_rocm(self) -> bool:
        return self._rocm


class _Impl:
    pass


def _install_stand_ins() -> None:
    """Modules the seed imports inside its functions, as cheap stand-ins. They get a
    module spec like real modules: the import statement's fast path checks it."""
    import importlib.util

    registry = types.ModuleType("seed_stub_registry")
    registry.AttentionBackendEnum = AttentionBackendEnum
    impls = types.ModuleType("seed_stub_impls")
    impls.FlashInferImpl = impls.RocmImpl = impls.FlashMLAImpl = _Impl
    for module in (registry, impls):
        module.__spec__ = importlib.util.spec_from_loader(module.__name__, loader=None)
        sys.modules[module.__name__] = module


_install_stand_ins()
current_platform = _Platform(rocm=False)
_seen: set[str] = set()


def _info_once(message: str) -> None:
    if message not in _seen:
        _seen.add(message)


def resolve_backend(vllm_config):
    if vllm_config is None:
        return None
    attn_config = getattr(vllm_config, "attention_config", None)
    return getattr(attn_config, "backend", None) if attn_config is not None else None


def resolve_kv_cache_dtype(backend, kv_cache_dtype, cache_config):
    from seed_stub_registry import AttentionBackendEnum as Enum

    if backend == Enum.FLASHINFER_MLA_SPARSE_DSV4:
        if kv_cache_dtype.startswith("fp8"):
            return kv_cache_dtype, "float8_e4m3fn"
        return kv_cache_dtype, "bfloat16"
    assert kv_cache_dtype.startswith("fp8")
    if kv_cache_dtype != "fp8_ds_mla":
        if cache_config is not None:
            cache_config.cache_dtype = "fp8_ds_mla"
        kv_cache_dtype = "fp8_ds_mla"
        _info_once("Using DeepSeek's fp8_ds_mla KV cache format.")
    return kv_cache_dtype, "uint8"


def select_impl(vllm_config=None):
    from seed_stub_registry import AttentionBackendEnum as Enum

    backend = resolve_backend(vllm_config)
    if backend == Enum.FLASHINFER_MLA_SPARSE_DSV4:
        from seed_stub_impls import FlashInferImpl

        _info_once("Using FLASHINFER_MLA_SPARSE_DSV4 backend.")
        return FlashInferImpl
    if current_platform.is_rocm():
        from seed_stub_impls import RocmImpl

        _info_once("Using ROCM_FLASHMLA_SPARSE_DSV4 backend.")
        return RocmImpl
    from seed_stub_impls import FlashMLAImpl

    _info_once("Using FLASHMLA_SPARSE_DSV4 backend.")
    return FlashMLAImpl
