"""vLLM 0.33's release folder: what the plugin reads and replaces in vLLM 0.33.x (data only; nothing
here imports vLLM). Every release folder of the vLLM plugin defines the same names (the release
contract, checked by ``tests/hosts/vllm/test_vllm_plugin.py``):

* ``TARGETS``: per platform, ``(module, attribute, model family, expected parameters)`` of each
  function the plugin replaces; ``install()`` checks each signature before it patches anything;
* ``HOST_MODULES``: the only modules a vLLM host class may come from;
* ``HARDCODED``: the class vLLM builds where it has no selection function;
* ``MODEL_PACKAGES``: vLLM's model packages and the rules' model;
* ``SM120_TOPK``: the name of the SM120 layer module's top-k helper (asked for ``flashinfer_sm120``);
* ``LATER``: ``(module, attribute path, expected parameters, what dsv4sel puts there)`` of the
  functions replaced when vLLM imports their module (:mod:`dsv4sel.vllm_plugin.later`; the plugin
  never imports them: NIXL is optional, the engine core is the engine core's).

Its host translation ``vllm-0.33.yaml`` (vLLM's inputs in the rules' words) sits beside it.
"""

from __future__ import annotations

# (module, attribute, model family, expected parameters): what register() replaces.
_SELECT = ("vllm_config",)
_RESOLVE_V4 = ("use_fp8_ds_mla_layout", "kv_cache_dtype", "cache_config")
_RESOLVE_V41 = ("use_fp8_ds_mla_layout", "kv_cache_dtype", "cache_config", "packed_kv_cache_dtype")
TARGETS = {
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
TARGETS["xpu"] = TARGETS["cpu"]

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
#: ``deepseek_v4{,1}/nvidia/flashinfer_sparse.py``'s helper giving the top-k the SM120 layer asks
#: FlashInfer's specialization for (private in 0.33)
SM120_TOPK = "_required_sm120_sparse_topk"

#: Replaced when vLLM imports their module. ``base_worker`` imports the NIXL hash by name, so its
#: global is the one replaced (``nixl/base_worker.py:48``); ``engine/core.py`` imports the specs'
#: merge by name too (``:57``) and calls it from ``EngineCore._initialize_kv_caches`` (``:292``).
LATER = (
    ("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker", "compute_nixl_compatibility_hash",
     ("vllm_config", "attn_backend_name", "transfer_mode"), "nixl_hash"),
    ("vllm.v1.engine.core", "EngineCore._initialize_kv_caches", ("self", "vllm_config"), "rank_contracts"),
    ("vllm.v1.engine.core", "get_global_kv_cache_groups", ("vllm_config", "kv_cache_specs"), "rank_specs"),
)
