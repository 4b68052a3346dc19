"""Reading a vLLM config as a dsv4sel query, in two steps.

1. :func:`host_point`: the config as a point of the wired release's host translation
   (``vllm-0.3x.yaml``): the platform and its capability, the backend the user named, the cache
   dtype, the model family, LoRA, prefill context parallelism, and what vLLM's own code answers
   about mega-attention and FlashInfer's SM120 specialization.
2. :func:`query_of`: the translation turns the point into the rules' query (as data, proven
   complete over vLLM's space by ``dsv4sel check``), and a rule set that declares the process's
   role under disaggregation gets it (:func:`role`, :mod:`dsv4sel.dsv4.roles`).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from ..errors import SelectionError
from .state import _state
from .targets import REQUESTED, release


def _platform() -> str:
    from vllm.platforms import current_platform as p

    if p.is_cuda():
        return "cuda"
    if p.is_rocm():
        return "rocm"
    if p.is_xpu():
        return "xpu"
    if p.is_cpu():
        return "cpu"
    return type(p).__name__  # UnspecifiedPlatform, or an out-of-tree platform


def _capability(platform: str) -> str | None:
    """CUDA ``major.minor`` or the ROCm gfx arch as vLLM read it; None when unknown."""
    from vllm.platforms import current_platform as p

    if platform == "cuda":
        cap = p.get_device_capability()
        return None if cap is None else f"{cap.major}.{cap.minor}"
    if platform == "rocm":
        rocm = sys.modules.get("vllm.platforms.rocm")
        arch = getattr(rocm, "_GCN_ARCH", None) if rocm is not None else None
        return arch.split(":")[0] if arch else None
    return None


def _mega_attn(vllm_config: Any, model: str, platform: str) -> str:
    """Whether vLLM's mega-attention layer can serve this config: the kernel is
    built and usable here and the topology gives it 8 heads per ``wo_a`` group
    (vLLM's own ``is_available_for``)."""
    if model != "deepseek_v4_1" or platform != "cuda":
        return "unavailable"
    from vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn import (
        DeepseekV4MegaAttnAttention,
    )

    return "available" if DeepseekV4MegaAttnAttention.is_available_for(vllm_config) else "unavailable"


def _flashinfer_sm120(vllm_config: Any, model: str, platform: str, capability: str | None) -> str:
    """Whether FlashInfer has the SM120 decode specialization the SM120 layer will ask for: the
    same question, with vLLM's own functions, that the layer's ``__init__`` asks (and raises on)."""
    if platform != "cuda" or not capability or not capability.startswith("12."):
        return "available"
    import importlib

    package = "deepseek_v4" if model == "deepseek_v4" else "deepseek_v41"
    layer_module = importlib.import_module(f"vllm.models.{package}.nvidia.flashinfer_sparse")
    flashinfer = importlib.import_module("vllm.utils.flashinfer")
    hf = vllm_config.model_config.hf_config
    hf = getattr(hf, "text_config", hf)
    tp = getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", 1) or 1
    padded = layer_module.DeepseekV4FlashInferSM120Attention.get_padded_num_q_heads(hf.num_attention_heads // tp)
    top_k = getattr(layer_module, release().SM120_TOPK)(vllm_config, hf.sliding_window)
    return "available" if flashinfer.has_flashinfer_sparse_mla_sm120_config(padded, top_k) else "missing"


def _rules():
    rules = _state["rules"]
    if rules is None:
        import dsv4sel

        rules = _state["rules"] = dsv4sel.default_rules()
    return rules


def _int_setting(vllm_config: Any, name: str) -> int:
    """``parallel_config.<name>`` as an int (None reads as 1); anything else is one SelectionError
    (a string "2" would otherwise compare as a TypeError deep in the query)."""
    value = getattr(getattr(vllm_config, "parallel_config", None), name, 1)
    if value is None:
        return 1
    if type(value) is not int:
        raise SelectionError(f"dsv4sel: parallel_config.{name} is {value!r} ({type(value).__name__}); it must be "
                             "an int (vLLM's --" + name.replace("_", "-") + ")")
    return value


def role(vllm_config: Any) -> str:
    """The process's role under disaggregation (:data:`dsv4sel.dsv4.roles.ROLES`), as vLLM's own
    ``KVTransferConfig`` answers it: a producer and a consumer (``kv_both``, or a MultiConnector
    with both) is ``both``; no KV connector is ``none``."""
    transfer = getattr(vllm_config, "kv_transfer_config", None)
    if transfer is None:
        return "none"
    producer, consumer = bool(transfer.is_kv_producer), bool(transfer.is_kv_consumer)
    return {(True, True): "both", (True, False): "prefill", (False, True): "decode"}.get((producer, consumer), "none")


def host_point(vllm_config: Any, model: str, kv_cache_dtype: str | None = None) -> dict[str, str]:
    """The config as a point of the wired release's host translation (its ``space``), each value
    asked with vLLM's own code."""
    platform = _platform()
    attention = getattr(vllm_config, "attention_config", None)
    # the name the user gave, before AttentionConfig erased a MiniMax alias (CUTLASS_MSA...)
    backend = getattr(attention, REQUESTED, None) or getattr(attention, "backend", None)
    if kv_cache_dtype is None:
        kv_cache_dtype = getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", None) or "auto"
    capability = _capability(platform)
    pcp = _int_setting(vllm_config, "prefill_context_parallel_size")
    point = {"model": model, "platform": platform, "capability": capability or "unknown",
             "attention_backend": str(getattr(backend, "name", backend) or "unset"),
             "kv_cache_dtype": str(kv_cache_dtype),
             "lora": "on" if getattr(vllm_config, "lora_config", None) is not None else "off",
             "prefill_context_parallel": "on" if pcp > 1 else "off"}
    if platform == "cuda":
        point["mega_attn"] = _mega_attn(vllm_config, model, platform)
        point["flashinfer_sm120"] = _flashinfer_sm120(vllm_config, model, platform, capability)
    return point


def translation():
    """The wired release's host translation (loaded and checked once per release)."""
    return _translation(release().__name__)


@functools.lru_cache(maxsize=None)
def _translation(package: str):
    from ..dsv4.host_registry import HOSTS
    from ..translation import load

    found = next(r for r in HOSTS["vllm"].releases if r.package == package)
    return load(found.translation_path, found.display)


def query_of(vllm_config: Any, model: str, kv_cache_dtype: str | None = None) -> dict[str, Any]:
    """The dsv4sel query for a vLLM config: keyword arguments of ``RuleSet.select`` (a refusing
    translation row raises its SelectionError)."""
    from ..dsv4.roles import with_role

    point = host_point(vllm_config, model, kv_cache_dtype)
    t = translation()
    t.refuse_point(point)
    query = t.query(point)
    if query["capability"] == "unknown" and point["capability"] == "unknown":
        query["capability"] = None  # vLLM could not read it: the rules' own word for that
    return with_role(query, _rules().plain_inputs, role(vllm_config))


def decide(vllm_config: Any, model: str, kv_cache_dtype: str | None = None):
    """The Selection for a vLLM config (raises SelectionError on a rejection)."""
    return _rules().select(**query_of(vllm_config, model, kv_cache_dtype))


def model_of(vllm_config: Any) -> str | None:
    """The rules' model for the config's architecture (vLLM's own registry says which package
    serves it), or None when it is not DeepSeek-V4 / V4.1."""
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None:
        return None
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in getattr(model_config, "architectures", None) or ():
        registered = ModelRegistry.models.get(arch)
        family = release().MODEL_PACKAGES.get(str(getattr(registered, "module_name", "")))
        if family is not None:
            return family
    return None

