"""What the plugin reads and replaces in vLLM 0.33: the versions, the functions it wraps, the modules a
host class may come from and the classes vLLM hard-codes (data only; nothing here imports vLLM)."""

from __future__ import annotations

#: vLLM versions this plugin's targets and config reading are written for.
SUPPORTED = ">=0.33.0,<0.34"
HOST = "vllm"

# (module, attribute, model family, expected parameters): what register() replaces.
_SELECT = ("vllm_config",)
_RESOLVE_V4 = ("use_fp8_ds_mla_layout", "kv_cache_dtype", "cache_config")
_RESOLVE_V41 = ("use_fp8_ds_mla_layout", "kv_cache_dtype", "cache_config", "packed_kv_cache_dtype")
_TARGETS = {
    "cuda": (
        ("vllm.models.deepseek_v4.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4", _RESOLVE_V4),
        ("vllm.models.deepseek_v41.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4_1", _RESOLVE_V41),
        ("vllm.models.deepseek_v4.nvidia.model", "_select_dsv4_attn_cls", "deepseek_v4", _SELECT),
        ("vllm.models.deepseek_v41.nvidia.model", "_select_dsv4_attn_cls", "deepseek_v4_1", _SELECT),
    ),
    "rocm": (
        ("vllm.models.deepseek_v4.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4", _RESOLVE_V4),
        ("vllm.models.deepseek_v41.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4_1", _RESOLVE_V41),
        ("vllm.models.deepseek_v41.amd.model", "_select_dsv4_attn_cls", "deepseek_v4_1", _SELECT),
    ),
    # vLLM 0.33 sends DeepSeek-V4.1 on every non-ROCm platform to its NVIDIA code.
    "cpu": (
        ("vllm.models.deepseek_v4.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4", _RESOLVE_V4),
        ("vllm.models.deepseek_v41.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4_1", _RESOLVE_V41),
        ("vllm.models.deepseek_v41.nvidia.model", "_select_dsv4_attn_cls", "deepseek_v4_1", _SELECT),
    ),
}
_TARGETS["xpu"] = _TARGETS["cpu"]

#: The only modules a vLLM host class may come from: vLLM 0.33's DeepSeek-V4 / V4.1 attention
#: layer modules. A rule (or a cache entry) naming any other module, ``vllm.evil`` included, is
#: refused before anything is imported: a prefix check would import whatever ``vllm.*`` names.
HOST_MODULES = frozenset({
    "vllm.models.deepseek_v4.nvidia.flashmla", "vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
    "vllm.models.deepseek_v4.amd.rocm", "vllm.models.deepseek_v4.cpu.cpu_sparse",
    "vllm.models.deepseek_v4.xpu.xpu_sparse", "vllm.models.deepseek_v41.nvidia.flashmla",
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse", "vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn",
    "vllm.models.deepseek_v41.amd.rocm",
})
#: The class vLLM 0.33 hard-codes where it has no selection function (AMD, CPU, XPU V4.0):
#: the rules must name exactly it, checked when vLLM validates its configuration.
HARDCODED = {
    ("deepseek_v4", "rocm"): "vllm.models.deepseek_v4.amd.rocm:DeepseekV4ROCMAiterMLAAttention",
    ("deepseek_v4", "cpu"): "vllm.models.deepseek_v4.cpu.cpu_sparse:DeepseekV4CPUAttention",
    ("deepseek_v4", "xpu"): "vllm.models.deepseek_v4.xpu.xpu_sparse:DeepseekV4XPUAttention",
}
#: vLLM's model packages (``ModelRegistry``'s module of an architecture) and the rules' model.
MODEL_PACKAGES = {"vllm.models.deepseek_v4": "deepseek_v4", "vllm.models.deepseek_v41": "deepseek_v4_1"}
#: Attribute the patched ``AttentionConfig.__post_init__`` leaves on the config: the backend the
#: user named, before vLLM erases ``CUTLASS_MSA`` / ``TRITON_MSA`` (MiniMax aliases) to None.
REQUESTED = "_dsv4sel_requested_backend"
