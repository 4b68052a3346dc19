"""Real layer construction with the dsv4sel plugin installed, for a sample of inputs (one platform).

    .venv-vllm/bin/python tests/vllm33/construct.py PLATFORM [--out FILE]

For each sampled input this builds a real ``VllmConfig`` (``CacheConfig``, ``AttentionConfig``,
vLLM's one-rank gloo process group, ``set_current_vllm_config``) with a small DeepSeek-V4
model config, then does what vLLM's decoder layer does: asks the model module for the layer
class (``_select_dsv4_attn_cls``, or the class AMD/CPU/XPU V4.0 hard-code) and constructs it
with ``prefix=``. With the plugin installed the class must be the one the shipped rules name,
the layer's ``kv_cache_dtype`` / ``kv_cache_torch_dtype`` the Selection's, the cache config
rewritten as the rules say, the bytes per token of the KV cache spec vLLM builds for the layer's
sliding-window cache (``swa_cache_layer.get_kv_cache_spec(...).state_content_size_bytes``: the
packed record, or the plain row) the Selection's ``bytes_per_token``, and the block size vLLM's
engine sets for the layers built (``current_platform.update_block_size_for_backend``, no
``--block-size``) the Selection's ``block_size``; or SelectionError is raised with the cache
config untouched.
Hardware stand-ins beyond :mod:`stubs`: ``torch.cuda.Event`` / ``torch.xpu.Event`` objects.
"""
from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import sys
import tempfile
import time
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oracle  # noqa: E402
import stubs  # noqa: E402

SAMPLE = {
    "cuda": {"caps": ["9.0", "10.0", "12.0", "8.0"],
             "backends": [None, "FLASHMLA_SPARSE_DSV4", "FLASHINFER_MLA_SPARSE_DSV4", "TRITON_MLA"]},
    "rocm": {"caps": ["gfx942", "gfx90a"], "backends": [None, "ROCM_FLASHMLA_SPARSE_DSV4", "TRITON_MLA"]},
    "cpu": {"caps": ["unknown"], "backends": [None, "FLASHMLA_SPARSE_DSV4"]},
    "xpu": {"caps": ["unknown"], "backends": [None, "FLASHMLA_SPARSE_DSV4"]},
}
KVS = ["auto", "fp8", "fp8_ds_mla", "bfloat16", "fp8_e5m2"]
MODELS = ["deepseek_v4", "deepseek_v4_1"]


class _Event:
    """A stream event that is never recorded at construction."""

    def __init__(self, *args, **kwargs):
        pass


def hf_config():
    return types.SimpleNamespace(
        hidden_size=256, num_attention_heads=64, q_lora_rank=64, o_lora_rank=64, head_dim=512, qk_rope_head_dim=64,
        o_groups=8, sliding_window=128, num_hidden_layers=2, layer_types=["sliding_attention"] * 2,
        compress_rates={}, rms_norm_eps=1e-6, max_position_embeddings=4096, rope_theta=10000.0, rope_scaling=None,
        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, index_n_heads=64, index_head_dim=128,
        index_topk=512, model_type="deepseek_v4")


def layer_class_source(model: str, platform: str):
    """Where vLLM's decoder layer gets its attention class: (module, attribute)."""
    if model == "deepseek_v4":
        return {"cuda": ("vllm.models.deepseek_v4.nvidia.model", "_select_dsv4_attn_cls"),
                "rocm": ("vllm.models.deepseek_v4.amd.model", "DeepseekV4ROCMAiterMLAAttention"),
                "cpu": ("vllm.models.deepseek_v4.cpu.model", "DeepseekV4CPUAttention"),
                "xpu": ("vllm.models.deepseek_v4.xpu.model", "DeepseekV4XPUAttention")}[platform]
    return (f"vllm.models.deepseek_v41.{'amd' if platform == 'rocm' else 'nvidia'}.model", "_select_dsv4_attn_cls")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("platform")
    ap.add_argument("--out")
    args = ap.parse_args()
    t0 = time.perf_counter()
    platform = args.platform
    oracle.prepare(platform)
    import torch

    torch.cuda.Event = _Event
    if hasattr(torch, "xpu"):
        torch.xpu.Event = _Event
    from vllm.config import AttentionConfig, CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel
    from vllm.platforms import current_platform  # the platform object stubs.setup() installed

    import dsv4sel
    import dsv4sel.vllm_plugin as plugin
    from dsv4sel import SelectionError

    base = VllmConfig(cache_config=CacheConfig(), attention_config=AttentionConfig())
    with set_current_vllm_config(base):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp()}")
        initialize_model_parallel(1, 1)
    rules = dsv4sel.default_rules()
    plugin.install(rules)
    sample = SAMPLE[platform]
    rows, counts = [], {"built": 0, "rejected": 0, "mismatch": 0}
    fi_values = ["available", "missing"] if platform == "cuda" else ["available"]
    for model, cap, backend, kv, fi in itertools.product(MODELS, sample["caps"], sample["backends"], KVS, fi_values):
        if fi == "missing" and cap != "12.0":
            continue
        stubs.set_device(cap, platform)
        oracle.FLASHINFER_SM120["available"] = fi == "available"
        cfg = VllmConfig(cache_config=CacheConfig(cache_dtype=kv), attention_config=AttentionConfig(backend=backend))
        # is_hybrid: read by update_block_size_for_backend (DeepSeek-V4 has no mamba layers)
        object.__setattr__(cfg, "model_config", types.SimpleNamespace(
            hf_config=hf_config(), max_model_len=4096, dtype=torch.bfloat16, is_hybrid=False))
        try:
            expected = rules.select(platform=platform, capability=None if cap == "unknown" else cap,
                                    backend=backend, kv_cache_dtype=kv, model=model,
                                    extra={"mega_attn": "unavailable", "prefill_context_parallel": "off",
                                           "flashinfer_sm120": fi})
        except SelectionError as exc:
            expected = exc
        module, attr = layer_class_source(model, platform)
        row = {"model": model, "capability": cap, "backend": backend, "kv": kv, "flashinfer_sm120": fi}
        with set_current_vllm_config(cfg):
            try:
                source = getattr(importlib.import_module(module), attr)
                cls = source(cfg) if attr.startswith("_select") else source
                layer = cls(cfg, prefix="model.layers.0.attn", topk_indices_buffer=None, aux_stream_list=None)
                bytes_per_token = layer.swa_cache_layer.get_kv_cache_spec(cfg).state_content_size_bytes
                # the engine's choice over every attention layer this config holds (this layer's and
                # its sliding-window cache's backends), as vLLM makes it before allocating the cache
                current_platform.update_block_size_for_backend(cfg)
                block_size = cfg.cache_config.block_size
            except SelectionError as exc:
                ok = isinstance(expected, SelectionError) and cfg.cache_config.cache_dtype == kv
                row.update(result="SelectionError", message=str(exc).splitlines()[0][:200], ok=ok)
            except Exception as exc:  # vLLM failed on its own: never acceptable here
                row.update(result=type(exc).__name__, message=str(exc)[:300], ok=False)
            else:
                got = (f"{type(layer).__module__}:{type(layer).__qualname__}", layer.kv_cache_dtype,
                       str(layer.kv_cache_torch_dtype).removeprefix("torch."), cfg.cache_config.cache_dtype,
                       bytes_per_token, block_size)
                want = None if isinstance(expected, SelectionError) else (
                    expected.host_class("vllm")[0], expected.cache_dtype, expected.torch_dtype_name,
                    expected.rewrites.get("cache_dtype", kv), expected.bytes_per_token, expected.block_size)
                row.update(result="built", got=list(got), want=want and list(want), ok=got == want)
        counts["mismatch" if not row["ok"] else ("built" if row["result"] == "built" else "rejected")] += 1
        rows.append(row)
    report = {"platform": platform, "counts": counts, "rows": rows, "seconds": round(time.perf_counter() - t0, 1)}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)
    print(json.dumps({"platform": platform, "counts": counts, "seconds": report["seconds"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
