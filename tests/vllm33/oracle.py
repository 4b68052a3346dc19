"""vLLM 0.33's own DeepSeek-V4 decision for one dsv4sel input (runs in .venv-vllm only).

For an input (model, platform, capability, backend, kv-cache dtype, mega_attn) this builds
vLLM's real config objects (``AttentionConfig``, ``CacheConfig``), asks vLLM's own
``_select_dsv4_attn_cls`` for the layer class where vLLM 0.33 has one (NVIDIA V4.0 and V4.1,
AMD V4.1; AMD/CPU/XPU V4.0 build the class their model module names), then calls vLLM's own
``_resolve_dsv4_kv_cache_dtype`` with that class's layout flag and packed record, as the
layer's ``__init__`` does. Nothing of vLLM's logic is copied; only hardware answers are
stubbed (:mod:`stubs`): the device capability / gfx arch and whether FlashMLA's mega-attention
kernels are built (``mega_attn``). The model topology is real config data: 64 heads in 8
``wo_a`` groups at TP 1, which mega-attention serves.

An outcome is a dict: ``{"kind": "select", "class", "cache_dtype", "torch_dtype", "cache_config",
"sizes"}`` (``cache_config`` = ``cache_dtype`` after the call; ``sizes``: see :func:`sizes`, None
where vLLM decides them from a CUDA capability the input does not give),
``{"kind": "reject", "error", "message"}``
for a ValueError (vLLM decided to refuse), ``{"kind": "refused", ...}`` when vLLM's config
classes refuse the value before any DeepSeek-V4 code runs, or ``{"kind": "undecided",
"error", "message"}`` for any other exception (an assert, NotImplementedError...).
"""
from __future__ import annotations

import importlib
import types

import stubs

_MEGA = {"available": False}
#: Does the (stubbed) FlashInfer build have the SM120 decode specialization? (flashinfer_sm120)
FLASHINFER_SM120 = {"available": True}
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
            # library build: FlashInfer is not installed here; whether its SM120 dispatch table has
            # the specialization is the input (vLLM's layer init and the plugin both ask this)
            fi = importlib.import_module("vllm.utils.flashinfer")
            fi.has_flashinfer_sparse_mla_sm120_config = lambda heads, top_k: FLASHINFER_SM120["available"]
        _patched.append(True)


def hf_config():
    return types.SimpleNamespace(num_attention_heads=64, o_groups=8, sliding_window=128, model_type="deepseek_v4")


def vllm_config(backend, kv, *, tp=1, pcp=1):
    """vLLM's config objects for one input; raises what vLLM's config classes raise."""
    from vllm.config import AttentionConfig, CacheConfig

    attention = AttentionConfig(backend=backend)
    cache = CacheConfig(cache_dtype=kv)
    parallel = types.SimpleNamespace(prefill_context_parallel_size=pcp, tensor_parallel_size=tp)
    model = types.SimpleNamespace(hf_config=hf_config())
    return types.SimpleNamespace(attention_config=attention, cache_config=cache, parallel_config=parallel,
                                 model_config=model)


def _layer_class(model: str, platform: str, cfg):
    if model == "deepseek_v4":
        if platform == "cuda":
            return importlib.import_module("vllm.models.deepseek_v4.nvidia.model")._select_dsv4_attn_cls(cfg)
        # vLLM 0.33 hard-codes these; read the name each model module builds
        module, name = {
            "rocm": ("vllm.models.deepseek_v4.amd.model", "DeepseekV4ROCMAiterMLAAttention"),
            "cpu": ("vllm.models.deepseek_v4.cpu.model", "DeepseekV4CPUAttention"),
            "xpu": ("vllm.models.deepseek_v4.xpu.model", "DeepseekV4XPUAttention"),
        }[platform]
        return getattr(importlib.import_module(module), name)
    package = "amd" if platform == "rocm" else "nvidia"
    return importlib.import_module(f"vllm.models.deepseek_v41.{package}.model")._select_dsv4_attn_cls(cfg)


def _packed_default(cls) -> str:
    prop = getattr(cls, "packed_kv_cache_dtype", None)
    return prop.fget(None) if isinstance(prop, property) else "fp8_ds_mla"


def resolve(model: str, cls, kv: str, cache_config):
    module = "vllm.models.deepseek_v4.attention" if model == "deepseek_v4" else "vllm.models.deepseek_v41.attention"
    fn = importlib.import_module(module)._resolve_dsv4_kv_cache_dtype
    if model == "deepseek_v4":
        return fn(cls.use_fp8_ds_mla_layout, kv, cache_config)
    return fn(cls.use_fp8_ds_mla_layout, kv, cache_config, _packed_default(cls))


def sizes(model: str, cls) -> dict:
    """vLLM 0.33's KV-cache format for a layer class on the (stubbed) device, from vLLM's own code:

    ``record``: ``"rows"`` when the class's layout flag (``use_fp8_ds_mla_layout``, the flag its
    ``__init__`` hands the resolver) says plain rows; else which packed record the layer writes:
    a V4.1 layer asks ``deepseek_v41.attention._use_v41_mxfp8_kv_record()`` (its ``__init__`` takes
    the record width from it: V4.1's own ``"v41"`` record or V4's ``"v4"``), a V4.0 layer has only
    ``"v4"`` (``deepseek_v4/attention.py`` knows no other). Their byte sizes are checked on real
    layers by construct.py.
    ``block_size``: the kernel block size vLLM takes for the class's attention backend when no
    ``--block-size`` is given, ``backend_cls.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)``
    (what ``Platform.update_block_size_for_backend`` asks a lone backend).
    """
    from vllm.config import CacheConfig

    if not cls.use_fp8_ds_mla_layout:
        record = "rows"
    elif model == "deepseek_v4":
        record = "v4"
    else:
        v41 = importlib.import_module("vllm.models.deepseek_v41.attention")
        record = "v41" if v41._use_v41_mxfp8_kv_record() else "v4"
    return {"record": record, "block_size": cls.backend_cls.get_preferred_block_size(CacheConfig.DEFAULT_BLOCK_SIZE)}


def sizes_decided(platform: str, capability: str | None) -> bool:
    """Whether vLLM decides the sizes for this input. Its V4.1 record and FlashMLA block size
    follow the CUDA capability family; with none (the input's ``unknown``, which a CUDA machine
    never reports to vLLM) its family checks answer False for every family, which is no decision
    for any GPU. CPU and XPU have no capability: there vLLM's answer is its real one."""
    return not (platform == "cuda" and capability in (None, "unknown"))


def decide(model: str, platform: str, capability: str, backend: str | None, kv: str, mega_attn: str,
           pcp: int = 1) -> dict:
    stubs.set_device(capability, platform)
    _MEGA["available"] = mega_attn == "available"
    try:
        cfg = vllm_config(backend, kv, pcp=pcp)
    except Exception as exc:  # pydantic ValidationError (a ValueError) or KeyError from the enum lookup
        return {"kind": "refused", "error": type(exc).__name__, "message": str(exc).splitlines()[0][:200]}
    if backend is not None and getattr(cfg.attention_config.backend, "name", None) != backend:
        # AttentionConfig rewrote it (CUTLASS_MSA / TRITON_MSA pick MiniMax's decode kernel and
        # leave no backend): the DeepSeek-V4 code never sees the name
        return {"kind": "refused", "error": "rewritten by AttentionConfig",
                "message": f"{backend} -> {cfg.attention_config.backend}"}
    try:
        cls = _layer_class(model, platform, cfg)
        cache_dtype, torch_dtype = resolve(model, cls, kv, cfg.cache_config)
    except ValueError as exc:
        return {"kind": "reject", "error": type(exc).__name__, "message": str(exc)[:200]}
    except Exception as exc:
        return {"kind": "undecided", "error": type(exc).__name__, "message": str(exc)[:200]}
    return {"kind": "select", "class": _cls_path(cls), "cache_dtype": str(cache_dtype),
            "torch_dtype": str(torch_dtype).removeprefix("torch."),
            "cache_config": str(cfg.cache_config.cache_dtype),
            "sizes": sizes(model, cls) if sizes_decided(platform, capability) else None}
