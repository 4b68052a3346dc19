"""Real DeepSeek-V4 attention layers of vLLM, built once per distinct input (runs in a release's vLLM environment only).

:func:`build` constructs the layer class vLLM chose, exactly as vLLM's decoder layer does: a
real ``VllmConfig`` (``CacheConfig``, ``AttentionConfig``), vLLM's one-rank gloo process group,
``set_current_vllm_config``, then ``cls(vllm_config, prefix=..., topk_indices_buffer=None,
aux_stream_list=None)`` -- its whole ``__init__``, which calls the kv-cache resolver and checks
its kernels. It reads what vLLM will allocate: the layer's cache dtype and torch dtype, the cache
config after the call, the bytes per token of the KV cache spec vLLM builds for the layer's
sliding-window cache (``swa_cache_layer.get_kv_cache_spec(...).state_content_size_bytes``) and
the block size the platform sets for the layers built
(``current_platform.update_block_size_for_backend``, no ``--block-size``).

The result depends only on what the layer's ``__init__`` and those calls read: the model, the
(stubbed) device, the class, the kv-cache dtype and the hardware inputs (mega-attention ops,
FlashInfer's SM120 specialization). It does not depend on ``--attention-backend``: no DeepSeek-V4
layer module reads ``attention_config.backend`` (only ``_select_dsv4_attn_cls`` does, before the
layer is built), so one build serves every backend name that leads vLLM to the same class; the
backend the first such input named is the one in the config. The config carries the input's
prefill-context-parallel size (the one-rank process group stays: the layer's ``__init__`` reads the
size, it does not talk to the group). Nor does a layer read ``lora_config`` (0.34 reads it in its
selection function only): vLLM's own layers are built without it, while with the plugin installed,
whose patched resolver decides again from the layer's config, it carries the input's LoRA.
"""
from __future__ import annotations

import importlib
import tempfile
import types

import oracle
import stubs

_ready: list = []
_memo: dict = {}


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


def prepare() -> None:
    """vLLM's one-rank gloo process group (once per process) and the stream-event stand-ins."""
    if _ready:
        return
    import torch
    from vllm.config import AttentionConfig, CacheConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import init_distributed_environment, initialize_model_parallel

    torch.cuda.Event = _Event
    if hasattr(torch, "xpu"):
        torch.xpu.Event = _Event
    with set_current_vllm_config(VllmConfig(cache_config=CacheConfig(), attention_config=AttentionConfig())):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mktemp(prefix='dsv4sel-gloo-')}")
        initialize_model_parallel(1, 1)
    _ready.append(True)


#: The checkpoint quantization mega-attention serves: DeepSeek-V4.1's native MXFP8 (its hf
#: ``quantization_config``: linear layers in 32x32 blocks with UE8M0 scales, MXFP4 experts,
#: ``expert_dtype: fp4``), which vLLM reads into its own ``DeepseekV4FP8Config``. On CUDA the mega
#: layer's ``__init__`` permutes that checkpoint's weight scales (``wq_b.weight_scale``...), so it
#: is built with it there; every other layer reads no quantized parameter in ``__init__`` and is
#: built unquantized (as mega on CPU/XPU, where vLLM has no MXFP8 linear kernel to pick).
V41_QUANTIZATION = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [32, 32],
                    "fmt": "e4m3", "scale_fmt": "ue8m0"}
MEGA_CLASS = "vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn:DeepseekV4MegaAttnAttention"


def _quant_config(cls_path: str, platform: str):
    if cls_path != MEGA_CLASS or platform != "cuda":
        return None
    from vllm.models.deepseek_v41.quant_config import DeepseekV4FP8Config

    return DeepseekV4FP8Config.from_config(dict(V41_QUANTIZATION))


def vllm_config(backend, kv, quant_config=None):
    import torch
    from vllm.config import AttentionConfig, CacheConfig, VllmConfig

    cfg = VllmConfig(cache_config=CacheConfig(cache_dtype=kv), attention_config=AttentionConfig(backend=backend))
    hf = hf_config()
    if quant_config is not None:
        hf.expert_dtype = "fp4"
    # is_hybrid: read by update_block_size_for_backend (DeepSeek-V4 has no mamba layers)
    object.__setattr__(cfg, "model_config", types.SimpleNamespace(
        hf_config=hf, max_model_len=4096, dtype=torch.bfloat16, is_hybrid=False,
        architectures=["DeepseekV4ForCausalLM"], architecture="DeepseekV4ForCausalLM"))
    object.__setattr__(cfg, "quant_config", quant_config)
    return cfg


def build(cls, platform, capability, backend, kv, mega: bool, fi_sm120: bool, pcp: int = 1, *,
          lora: str = "off", key_extra=()) -> dict:
    """The built layer's outcome (memoized per class, device, kv dtype, hardware inputs and
    ``key_extra``): ``{"kind": "select", "class", "cache_dtype", "torch_dtype", "cache_config",
    "bytes_per_token", "block_size"}``,
    ``{"kind": "reject", ...}`` when its ``__init__`` raises ValueError or RuntimeError (vLLM
    refuses the input there: a kv dtype, a missing kernel specialization), or
    ``{"kind": "undecided", ...}`` for any other exception (an assert, NotImplementedError, a
    stubbed kernel called)."""
    key = (oracle._cls_path(cls), platform, capability, kv, mega, fi_sm120, pcp, *key_extra)
    if key in _memo:
        return _memo[key]
    prepare()
    from dsv4sel import SelectionError
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform

    stubs.set_device(capability, platform)
    oracle._MEGA["available"] = mega
    stubs.set_flashinfer_sm120(fi_sm120)
    cfg = vllm_config(backend, kv, _quant_config(oracle._cls_path(cls), platform))
    cfg.parallel_config.prefill_context_parallel_size = pcp
    object.__setattr__(cfg, "lora_config", oracle.lora_config(lora))
    with set_current_vllm_config(cfg):
        try:
            layer = cls(cfg, prefix="model.layers.0.attn", topk_indices_buffer=None, aux_stream_list=None)
            spec = layer.swa_cache_layer.get_kv_cache_spec(cfg)
            current_platform.update_block_size_for_backend(cfg)
        except SelectionError as exc:
            out = {"kind": "dsv4sel_reject", "untouched": cfg.cache_config.cache_dtype == kv,
                   "message": str(exc).splitlines()[0][:200]}
        except (stubs.NeedsHardware, NotImplementedError) as exc:
            # a stubbed kernel was called (no GPU here), or vLLM has no code path: no decision of vLLM's
            out = {"kind": "undecided", "error": type(exc).__name__, "message": str(exc)[:200], "at": "layer"}
        except (ValueError, RuntimeError) as exc:
            # vLLM refuses the input: a ValueError, or the RuntimeError of a layer whose kernel library
            # lacks what it needs (the SM120 layer without FlashInfer's specialization)
            out = {"kind": "reject", "error": type(exc).__name__, "message": str(exc)[:200], "at": "layer"}
        except Exception as exc:  # noqa: BLE001 - any other failure of vLLM's layer is no decision
            out = {"kind": "undecided", "error": type(exc).__name__, "message": str(exc)[:200], "at": "layer"}
        else:
            out = {"kind": "select", "class": f"{type(layer).__module__}:{type(layer).__qualname__}",
                   "cache_dtype": str(layer.kv_cache_dtype),
                   "torch_dtype": str(layer.kv_cache_torch_dtype).removeprefix("torch."),
                   "cache_config": str(cfg.cache_config.cache_dtype),
                   "bytes_per_token": spec.state_content_size_bytes, "block_size": cfg.cache_config.block_size}
    _memo[key] = out
    return out


def layer_class(model, platform, cfg):
    """The class vLLM's decoder layer builds (its ``_select_dsv4_attn_cls`` or the hard-coded one)."""
    return oracle._layer_class(model, platform, cfg)


def builds() -> int:
    return len(_memo)


__all__ = ["build", "builds", "layer_class", "prepare", "importlib"]
