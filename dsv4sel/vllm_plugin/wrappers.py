"""The functions the plugin puts in place of vLLM's: each decides with the rules (memoized) and keeps
vLLM's signature; ``__wrapped_vllm__`` holds vLLM's own."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable

from ..errors import SelectionError
from .decision import _log_decision, decide_config, host_class
from .reading import _rules, query_of
from .state import _state
from .targets import REQUESTED


def _keep_original(wrapper: Callable, original: Callable) -> None:
    """Leave vLLM's own function on its replacement (``uninstall`` and readers of a patched vLLM use it)."""
    setattr(wrapper, "__wrapped_vllm__", original)  # noqa: B010 - a function has no declared slot for it


def _make_post_init(original: Callable) -> Callable:
    def __post_init__(self) -> None:
        # vLLM erases CUTLASS_MSA / TRITON_MSA to None here; keep the name the user gave so an
        # explicit backend is decided, never silently replaced by the default
        backend = getattr(self, "backend", None)
        object.__setattr__(self, REQUESTED, getattr(backend, "name", backend))
        original(self)

    _keep_original(__post_init__, original)
    return __post_init__


def _make_config_hook(original: Callable) -> classmethod:
    def check_and_update_config(cls, vllm_config) -> None:
        original(vllm_config)
        decide_config(vllm_config)

    _keep_original(check_and_update_config, original)
    return classmethod(check_and_update_config)


def _make_select(model: str, original: Callable) -> Callable:
    def _select_dsv4_attn_cls(vllm_config):
        query = query_of(vllm_config, model)
        selection = _rules().select(**query)  # SelectionError: nothing was built or changed
        cls = host_class(selection)
        _log_decision(selection, cls, query)
        return cls

    _keep_original(_select_dsv4_attn_cls, original)
    _select_dsv4_attn_cls.__doc__ = f"dsv4sel's decision for {model} (replaces vLLM's {original.__qualname__})."
    return _select_dsv4_attn_cls


def _layers_of_caller() -> list:
    """The attention layers whose ``__init__`` frames are on the stack, innermost first (vLLM's
    mega-attention layer builds a FlashMLA-V4.1 layer inside its own ``__init__``)."""
    frame: types.FrameType | None = sys._getframe(1)
    found: list = []
    while frame is not None:
        layer = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if layer is not None and hasattr(layer, "_uses_fp8_ds_mla_layout") and not any(layer is x for x in found):
            found.append(layer)
        frame = frame.f_back
    return found


def _make_resolve(model: str, original: Callable) -> Callable:
    def resolve(use_fp8_ds_mla_layout, kv_cache_dtype, cache_config, packed_kv_cache_dtype="fp8_ds_mla"):
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
        if vllm_config is None:
            raise SelectionError("dsv4sel: no current vLLM config while resolving the DeepSeek-V4 kv-cache "
                                 "dtype (called outside vLLM's model construction)")
        query = query_of(vllm_config, model, kv_cache_dtype)
        selection = _rules().select(**query)
        cls = host_class(selection)
        building = _layers_of_caller()
        if building and not any(isinstance(layer, cls) for layer in building):
            layer = building[-1]
            raise SelectionError(
                f"vLLM is building {type(layer).__qualname__}, but {selection.rule.id} "
                f"({selection.rule.location}) names {cls.__qualname__} for this config; "
                "vLLM hard-codes this platform's class, so the rules must name it",
                rule=selection.rule, query=selection.query, path=selection.path)
        packed = selection.torch_dtype_name == "uint8"
        if bool(use_fp8_ds_mla_layout) != packed:
            raise SelectionError(
                f"the layer stores {'packed' if use_fp8_ds_mla_layout else 'plain-row'} KV records but "
                f"{selection.rule.id} ({selection.rule.location}) selects layout {selection.layout} "
                f"({selection.torch_dtype_name})", rule=selection.rule, query=selection.query,
                path=selection.path)
        selection.apply(cache_config)  # all or nothing
        _state["selection"] = selection  # what this worker's KV cache holds: its handshakes carry it
        _log_decision(selection, cls, query)
        return selection.cache_dtype, selection.torch_dtype

    resolve.__name__ = resolve.__qualname__ = "_resolve_dsv4_kv_cache_dtype"
    _keep_original(resolve, original)
    if model == "deepseek_v4":
        # keep vLLM's 3-parameter signature for V4.0 (install() checks signatures)
        def resolve_v4(use_fp8_ds_mla_layout, kv_cache_dtype, cache_config):
            return resolve(use_fp8_ds_mla_layout, kv_cache_dtype, cache_config)

        resolve_v4.__name__ = resolve_v4.__qualname__ = "_resolve_dsv4_kv_cache_dtype"
        _keep_original(resolve_v4, original)
        return resolve_v4
    return resolve
