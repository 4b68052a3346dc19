"""vLLM's own DeepSeek-V4 decision for one dsv4sel input (runs in a release's vLLM environment only).

For an input (model, platform, capability, backend, kv-cache dtype and the hardware inputs) this
builds vLLM's real config objects (``AttentionConfig``, ``CacheConfig``: once per value, they are
only read), asks vLLM's own ``_select_dsv4_attn_cls`` for the layer class where vLLM has one
(NVIDIA V4.0 and V4.1, AMD V4.1; AMD/CPU/XPU V4.0 build the class their model module names), then
builds that layer for real (:mod:`layers`): its whole ``__init__`` (which calls vLLM's own
``_resolve_dsv4_kv_cache_dtype`` and checks its kernels), its KV-cache spec and the platform's
block size. Nothing of vLLM's logic is copied; only hardware answers are stubbed (:mod:`stubs`):
the device capability / gfx arch, whether FlashMLA's mega-attention kernels are built
(``mega_attn``) and whether FlashInfer has the SM120 specialization (``flashinfer_sm120``). The
model topology is real config data: 64 heads in 8 ``wo_a`` groups at TP 1. LoRA (the input
``lora``) is vLLM's own ``LoRAConfig`` (its defaults) in ``vllm_config.lora_config``, or None:
a release that does not read it (0.33) decides the same either way.

An outcome is a dict: ``{"kind": "select", "class", "cache_dtype", "torch_dtype", "cache_config",
"bytes_per_token", "block_size"}`` (what the built layer holds), ``{"kind": "reject", "error",
"message", "at"}`` when vLLM refuses the input (its config classes at ``config``, a ValueError of
the selection function or of the layer's ``__init__``), or ``{"kind": "undecided", ...}`` for any
other exception (an assert, NotImplementedError...). Once vLLM has chosen a class, the outcome also
names it (``"chose"``), whatever the layer then does.
"""
from __future__ import annotations

import importlib
import types

import stubs

_MEGA = {"available": False}
#: Does the (stand-in) FlashInfer build have the SM120 decode specialization? (flashinfer_sm120)
FLASHINFER_SM120 = stubs.FLASHINFER_SM120
_patched: list = []


class _FlashMLAOps:
    """``torch.ops._flashmla_C`` as a FlashMLA build with or without the mega-attention ops."""

    def __getattr__(self, name):
        if _MEGA["available"] and name in ("fused_norm_rope_attn_rope_cast_decode", "permute_q_b_proj"):
            return object()
        raise AttributeError(name)


class _Ops:
    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return _FlashMLAOps() if name == "_flashmla_C" else getattr(self._real, name)


class _TorchWithFlashMLAOps:
    """The mega-attention module's ``torch``: real torch, except which FlashMLA ops are built."""

    def __init__(self, real):
        self._real = real
        self.ops = _Ops(real.ops)

    def __getattr__(self, name):
        return getattr(self._real, name)


def _cls_path(cls) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def prepare(platform: str) -> None:
    stubs.setup(platform)
    if not _patched:
        if platform != "rocm":
            # hardware: FlashMLA's compiled library is present (vLLM still checks the capability)...
            flashmla_ops = importlib.import_module("vllm.v1.attention.ops.flashmla")
            flashmla_ops._is_flashmla_available = lambda: (True, None)
            # ...and its build has the mega-attention ops exactly when the input says mega_attn=available
            mega = importlib.import_module("vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn")
            mega.torch = _TorchWithFlashMLAOps(mega.torch)
            # FlashInfer: a stand-in package (stubs._flashinfer); whether its SM120 dispatch table
            # has the specialization is the input, read by vLLM's own probe in the layer's __init__
        _patched.append(True)


def hf_config():
    return types.SimpleNamespace(num_attention_heads=64, o_groups=8, sliding_window=128, model_type="deepseek_v4")


ARCHITECTURE = {"deepseek_v4": "DeepseekV4ForCausalLM", "deepseek_v4_1": "DeepseekV41ForCausalLM"}
_configs: dict = {}


def clear_configs() -> None:
    """Forget the config objects built so far (after the plugin patched AttentionConfig)."""
    _configs.clear()


def _config_part(kind, value):
    """vLLM's AttentionConfig / CacheConfig for one value, built once: the selection functions
    read them and never change them (the layer is built from its own config, :mod:`layers`).
    A refusal (pydantic ValidationError, KeyError from the enum lookup) is remembered too."""
    from vllm.config import AttentionConfig, CacheConfig

    key = (kind, value)
    if key not in _configs:
        try:
            _configs[key] = AttentionConfig(backend=value) if kind == "attention" else CacheConfig(cache_dtype=value)
        except Exception as exc:  # noqa: BLE001 - remembered and re-raised to every caller of this input
            _configs[key] = exc
    got = _configs[key]
    if isinstance(got, Exception):
        raise got
    return got


def lora_config(lora: str):
    """vLLM's ``LoRAConfig`` (built once, with its defaults) for ``lora="on"``, None for off."""
    if lora == "off":
        return None
    if lora != "on":
        raise ValueError(f"lora={lora!r}")
    if ("lora", "on") not in _configs:
        from vllm.config import LoRAConfig

        _configs[("lora", "on")] = LoRAConfig()
    return _configs[("lora", "on")]


def vllm_config(backend, kv, *, tp=1, pcp=1, model="deepseek_v4", lora="off"):
    """vLLM's config objects for one input; raises what vLLM's config classes raise."""
    attention = _config_part("attention", backend)
    cache = _config_part("cache", kv)
    parallel = types.SimpleNamespace(prefill_context_parallel_size=pcp, tensor_parallel_size=tp)
    arch = ARCHITECTURE[model]
    model_config = types.SimpleNamespace(hf_config=hf_config(), architectures=[arch], architecture=arch)
    return types.SimpleNamespace(attention_config=attention, cache_config=cache, parallel_config=parallel,
                                 model_config=model_config, lora_config=lora_config(lora))


def _layer_class(model: str, platform: str, cfg):
    if model == "deepseek_v4":
        if platform == "cuda":
            return importlib.import_module("vllm.models.deepseek_v4.nvidia.model")._select_dsv4_attn_cls(cfg)
        # vLLM hard-codes these; read the name each model module builds
        module, name = {
            "rocm": ("vllm.models.deepseek_v4.amd.model", "DeepseekV4ROCMAiterMLAAttention"),
            "cpu": ("vllm.models.deepseek_v4.cpu.model", "DeepseekV4CPUAttention"),
            "xpu": ("vllm.models.deepseek_v4.xpu.model", "DeepseekV4XPUAttention"),
        }[platform]
        return getattr(importlib.import_module(module), name)
    package = "amd" if platform == "rocm" else "nvidia"
    return importlib.import_module(f"vllm.models.deepseek_v41.{package}.model")._select_dsv4_attn_cls(cfg)


def decide(model: str, platform: str, capability: str, backend: str | None, kv: str, mega_attn: str,
           pcp: int = 1, flashinfer_sm120: str = "available", lora: str = "off") -> dict:
    """vLLM's whole decision for one input: its config classes, its selection function (or
    the class the platform's model module hard-codes), then the chosen layer built for real
    (:func:`layers.build`: its whole ``__init__``, its KV-cache spec, the platform block size).
    A config class refusing the value, or a ValueError from the selection or the layer, is vLLM
    rejecting the input; any other exception is no decision (``undecided``)."""
    import layers

    stubs.set_device(capability, platform)
    _MEGA["available"] = mega_attn == "available"
    stubs.set_flashinfer_sm120(flashinfer_sm120 == "available")
    try:
        cfg = vllm_config(backend, kv, pcp=pcp, model=model, lora=lora)
    except Exception as exc:  # noqa: BLE001 - pydantic ValidationError (a ValueError) or KeyError from the enum lookup
        return {"kind": "reject", "error": type(exc).__name__, "message": str(exc).splitlines()[0][:200],
                "at": "config"}
    try:
        cls = _layer_class(model, platform, cfg)
    except ValueError as exc:
        return {"kind": "reject", "error": type(exc).__name__, "message": str(exc)[:200], "at": "select"}
    except Exception as exc:  # noqa: BLE001 - any other failure of vLLM's selection is no decision
        return {"kind": "undecided", "error": type(exc).__name__, "message": str(exc)[:200], "at": "select"}
    built = layers.build(cls, platform, capability, backend, kv, mega_attn == "available",
                         flashinfer_sm120 == "available", pcp)
    return {**built, "chose": _cls_path(cls)}
