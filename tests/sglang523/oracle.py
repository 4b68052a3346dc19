"""SGLang 0.5.23's own DeepSeek-V4 selection, asked on a CPU machine (one platform per process).

For one input of the host space (:data:`SPACE`) this builds a real ``ServerArgs`` from the
values a user would pass, runs SGLang's resolution pipeline (``ServerArgs.resolve_once``, the
config-time decision in the launcher), and, when that resolves, what the scheduler does after the
weights load: ``publish`` the record, SGLang's ``select_dsv4_kv_layout()``, the pool class the
DeepSeek-V4 token pool picks (SGLang's own tests: unified KV, trtllm's uniform FP8, else the
single pool), the torch dtype from ``configure_kv_cache_dtype``, the single main-cache pool itself
built on CPU (one 256-token page; its ``create_buffer`` asserts the store dtype), and its ``dsv4``
attention-backend factory (``ATTENTION_BACKENDS["dsv4"]``). The factory's product is observed by
the type of what it returns: the DeepSeek-V4 backend classes' ``__init__`` is replaced by one that
allocates nothing (the constructors allocate GPU buffers; the choice of class is SGLang's). The
layout function and the pool module are looked up at each call, so hooks a plugin puts on them
(SGLang's ``HookRegistry``) run. Nothing of SGLang's decision is reimplemented here.

:func:`decide` returns an :class:`Outcome`: ``stage`` is ``config`` (refused by the resolution
pipeline: the launcher never starts), ``late`` (resolved, then refused by the layout function or
the factory, i.e. after the weights load) or ``ok``.
"""
from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import stubs

#: The SGLang host space, as tests/sglang523 enumerates it. Devices: (platform, capability
#: string of dsv4sel's vocabulary, torch capability tuple, gfx arch, SGLANG_HACK_FLASHMLA_BACKEND).
CUDA = (("8.0", (8, 0)), ("8.9", (8, 9)), ("9.0", (9, 0)), ("10.0", (10, 0)), ("10.3", (10, 3)),
        ("11.0", (11, 0)), ("12.0", (12, 0)), ("12.1", (12, 1)))
ROCM = (("gfx90a", (9, 0)), ("gfx942", (9, 4)), ("gfx950", (9, 5)))
HIP_KERNELS = ("auto", "aiter_sparse", "unified_kv_triton")
MODELS = {"deepseek_v4": "deepseek_v4", "deepseek_v4_1": "deepseek_v41"}
DSV4_ATTN_BACKENDS = ("auto", "flashmla", "flashmla_mega", "trtllm")
KV_CACHE_DTYPES = ("auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16")
KV_LAYOUT_ENV = ("unset", "v4", "auto", "v41", "v41_new")
#: The deployment around the attention decision, each a deviation from one GPU with no
#: speculative decoding and no backend flags: (name, ServerArgs keywords). One input, not a product
#: of parallelism x speculative x backend flags, so the whole space stays small enough to ask
#: SGLang about every input in the suite's time; combinations of two deviations are not in it.
DEPLOYMENTS = {
    "single": {},
    "attention_tp": {"tp_size": 8},
    "pd": {"tp_size": 8, "disaggregation_mode": "prefill"},
    "prefill_cp": {"tp_size": 8, "enable_prefill_cp": True, "cp_strategy": "interleave"},
    "eagle": {"speculative_algorithm": "EAGLE", "speculative_eagle_topk": 1,
              "speculative_num_steps": 1, "speculative_num_draft_tokens": 2},
    "dspark": {"speculative_algorithm": "DSPARK"},
    "attention_backend_other": {"attention_backend": "triton"},
    "prefill_backend_other": {"prefill_attention_backend": "fa3"},
}

_BACKEND_CLASSES = (
    ("sglang.srt.layers.attention.deepseek_v4_backend", "DeepseekV4AttnBackend"),
    ("sglang.srt.layers.attention.deepseek_v4_mega_backend", "DeepseekV4MegaAttnBackend"),
    ("sglang.srt.layers.attention.deepseek_v4_trtllm_backend", "DeepseekV4TrtllmAttnBackend"),
    ("sglang.srt.layers.attention.deepseek_v4_backend_hip_radix", "DeepseekV4HipRadixBackend"),
)


def devices(platform: str):
    """(capability, torch capability, arch, hip kernel) of ``platform``'s part of the space."""
    if platform == "cuda":
        return [(cap, t, None, None) for cap, t in CUDA]
    return [(arch, t, arch, k) for arch, t in ROCM for k in HIP_KERNELS]


def points(platform: str):
    """Every input of ``platform``'s part of the space, as dicts of the host's input names."""
    for cap, _t, _arch, hip in devices(platform):
        for model in MODELS:
            for backend in DSV4_ATTN_BACKENDS:
                for kv in KV_CACHE_DTYPES:
                    for layout in KV_LAYOUT_ENV:
                        for deployment in DEPLOYMENTS:
                            p = {"model": model, "platform": platform, "capability": cap,
                                 "dsv4_attn_backend": backend, "kv_cache_dtype": kv,
                                 "kv_layout_env": layout, "deployment": deployment}
                            if hip is not None:
                                p["hip_kernel"] = hip
                            yield p


@dataclass(frozen=True)
class Outcome:
    """What SGLang did with one input. ``stage``: config / late / ok; ``error``: the exception
    type and the SGLang ``file:line`` that raised it; ``resolved``: the resolved fields."""

    stage: str
    error: str | None = None
    where: str | None = None
    message: str | None = None
    resolved: dict = field(default_factory=dict)
    layout: str | None = None
    compressed: str | None = None
    cls: str | None = None
    pool: str | None = None
    torch_dtype: str | None = None

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if v not in (None, {})}


def _model_dir(model_type: str) -> str:
    """A real-shaped DeepSeek-V4 config.json (no weights: the selection reads the config only)."""
    d = Path(tempfile.mkdtemp(prefix=f"sglang-{model_type}-"))
    arch = "DeepseekV41ForCausalLM" if model_type == "deepseek_v41" else "DeepseekV4ForCausalLM"
    cfg = {"architectures": [arch], "model_type": model_type, "num_attention_heads": 64,
           "num_hidden_layers": 4, "hidden_size": 1024, "vocab_size": 1000, "max_position_embeddings": 4096,
           "o_groups": 8, "o_lora_rank": 1024, "compress_ratios": [0, 4, 128, 4], "head_dim": 512,
           "qk_rope_head_dim": 64, "sliding_window": 128, "index_head_dim": 128, "index_n_heads": 64,
           "index_topk": 512, "num_key_value_heads": 1, "q_lora_rank": 1024, "kv_lora_rank": 512,
           "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 256,
           "intermediate_size": 512, "compress_rope_theta": 40000, "rope_theta": 10000,
           "torch_dtype": "bfloat16",
           "quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128], "fmt": "e4m3",
                                   "scale_fmt": "ue8m0", "activation_scheme": "dynamic"}}
    (d / "config.json").write_text(json.dumps(cfg))
    return str(d)


def _memoize_struct_fields() -> None:
    """Remember ``msgspec.structs.fields`` per Struct class. SGLang's resolution asks it for the
    same few classes thousands of times per input (``arg_utils.record_fields``), and it re-evaluates
    every type annotation each time: 40% of the suite's time. The answer is a function of the class
    alone (a tuple of frozen FieldInfo), so remembering it changes no decision."""
    import functools

    import msgspec.structs

    fields = msgspec.structs.fields
    per_class = functools.lru_cache(maxsize=None)(fields)

    def remembered(type_or_instance):
        if isinstance(type_or_instance, type):
            return per_class(type_or_instance)
        return fields(type_or_instance)
    msgspec.structs.fields = remembered


class Oracle:
    """SGLang 0.5.23 in this process, stubbed as ``platform``'s GPU."""

    def __init__(self, platform: str):
        self.platform = platform
        first = devices(platform)[0]
        stubs.install(platform, first[1], first[2])
        _memoize_struct_fields()
        logging.disable(logging.CRITICAL)
        from sglang.srt.arg_groups.overrides import resolution_result
        from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
        from sglang.srt.mem_cache import deepseek_v4_memory_pool as pool
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import ServerArgs
        import importlib

        self.ServerArgs, self.result, self.publish = ServerArgs, resolution_result, publish
        self.pool = pool
        from sglang.srt.layers.attention.dsv4.unified_kv_gate import is_unified_kv_triton
        from sglang.srt.mem_cache.kv_cache_dtype import configure_kv_cache_dtype

        self.unified, self.torch_dtype_of = is_unified_kv_triton, configure_kv_cache_dtype
        self.factory = ATTENTION_BACKENDS["dsv4"]
        for module, name in _BACKEND_CLASSES:
            cls = getattr(importlib.import_module(module), name)

            def allocate_nothing(self_, *a, **k):
                return None
            cls.__init__ = allocate_nothing
        self.models = {m: _model_dir(t) for m, t in MODELS.items()}
        self._device = None
        #: SGLang's ModelConfig of each (model, speculative algorithm, device), see :meth:`_server_args`
        self.model_configs: dict | None = {}

    def _set_device(self, point: dict) -> None:
        for cap, t, arch, hip in devices(self.platform):
            if cap == point["capability"] and hip == point.get("hip_kernel"):
                if (cap, t, arch, hip) != self._device:
                    # the HIP kernel is an environment variable that SGLang's lru_cached gates
                    # (is_unified_kv_triton) read once per process: forget them with the device
                    if hip not in (None, "auto"):
                        os.environ["SGLANG_HACK_FLASHMLA_BACKEND"] = hip
                    else:
                        os.environ.pop("SGLANG_HACK_FLASHMLA_BACKEND", None)
                    stubs.set_capability(t, arch)
                    self._device = (cap, t, arch, hip)
                return
        raise KeyError(point["capability"])

    def decide(self, point: dict) -> Outcome:
        self._set_device(point)
        os.environ.pop("SGLANG_DSV4_KV_LAYOUT", None)
        if point["kv_layout_env"] != "unset":
            os.environ["SGLANG_DSV4_KV_LAYOUT"] = point["kv_layout_env"]
        kwargs = dict(model_path=self.models[point["model"]], skip_tokenizer_init=True,
                      dsv4_attn_backend=point["dsv4_attn_backend"], kv_cache_dtype=point["kv_cache_dtype"],
                      **DEPLOYMENTS[point["deployment"]])
        if point["deployment"] == "dspark":  # DSpark drafts with the target's own checkpoint
            kwargs["speculative_draft_model_path"] = kwargs["model_path"]
        sa = self.last_args = self._server_args(point, kwargs)
        try:
            sa.resolve_once()
        except Exception as exc:  # noqa: BLE001 - SGLang's refusal is the observation
            return Outcome("config", **_error(exc))
        finally:
            self._remember_model_config(point, sa)
        resolved = {f: self.result(sa, f) for f in ("attention_backend", "prefill_attention_backend",
                                                     "decode_attention_backend", "page_size",
                                                     "kv_cache_dtype", "dsv4_attn_backend")}
        try:
            self.publish(sa, role="scheduler")
            layout, compressed = self.pool.select_dsv4_kv_layout()
        except Exception as exc:  # noqa: BLE001 - SGLang failing after the config is the observation
            return Outcome("late", resolved=resolved, **_error(exc))
        pool_cls = ("DeepSeekV4UnifiedKVPool" if self.unified() else "DeepSeekV4UniformFP8KVPool"
                    if resolved["dsv4_attn_backend"] == "trtllm" else "DeepSeekV4SingleKVPool")
        torch_dtype = None
        try:
            _, dtype = self.torch_dtype_of(
                server_args_kv_cache_dtype=resolved["kv_cache_dtype"], model=None, model_dtype=_bf16(),
                is_draft_worker=False, is_dflash=False, speculative_draft_attention_backend=None)
            torch_dtype = str(dtype).replace("torch.", "")
            if pool_cls == "DeepSeekV4SingleKVPool":
                # the main cache pool, built for real on CPU: one layer of one 256-token page
                self.pool.DeepSeekV4SingleKVPool(
                    size=resolved["page_size"], page_size=resolved["page_size"], dtype=dtype,
                    qk_nope_head_dim=448, qk_rope_head_dim=64, layer_num=1, device="cpu",
                    enable_memory_saver=False, kv_layout=layout)
        except Exception as exc:  # noqa: BLE001 - SGLang failing to build the pool is the observation
            return Outcome("late", resolved=resolved, layout=layout.name, pool=pool_cls, **_error(exc))
        try:
            built = self.factory(_Runner(sa))
        except Exception as exc:  # noqa: BLE001 - SGLang's factory failing is the observation
            return Outcome("late", resolved=resolved, layout=layout.name, pool=pool_cls, **_error(exc))
        cls = f"{type(built).__module__}:{type(built).__qualname__}"
        return Outcome("ok", resolved=resolved, layout=layout.name, compressed=compressed, cls=cls,
                       pool=pool_cls, torch_dtype=torch_dtype)


    def decide_fresh(self, point: dict) -> Outcome:
        """:meth:`decide` with SGLang building its ModelConfig anew (what the suite compares
        :meth:`decide` with, on a sample covering every key of :meth:`_server_args`)."""
        saved, self.model_configs = self.model_configs, None
        try:
            return self.decide(point)
        finally:
            self.model_configs = saved

    @staticmethod
    def model_config_key(point: dict) -> tuple:
        """The inputs SGLang's ModelConfig can depend on (the HIP kernel too, to be conservative)."""
        return (point["model"], DEPLOYMENTS[point["deployment"]].get("speculative_algorithm"),
                point["capability"], point.get("hip_kernel"))

    def _server_args(self, point: dict, kwargs: dict):
        """``ServerArgs(**kwargs)``, handed the ModelConfig SGLang built for an earlier input of the
        same key (:meth:`model_config_key`) through SGLang's own seam: ``model_config_of()`` returns
        a ``_model_config`` a record carries without a ``_model_config_built_from`` "as it is" (as
        its tests supply one). Building it is a tenth of an input's time, and its result is the
        same for every input of a key: ``ModelConfig.from_server_args`` reads the config.json, the
        device's facts (``is_hip``, SM100, Blackwell), a few environment variables
        (``SGLANG_DSV4_FP4_*``, ModelScope, the context-length override, an external multimodal
        architecture) and these arguments: model path, trust_remote_code, revision,
        context_length, json_model_override_args, is_embedding, enable_multimodal, dtype,
        quantization, model_impl, sampling_defaults, quantize_and_serve, the decrypted config
        file, enable_multi_layer_eagle, language_only, language_model_only, encoder_only,
        disable_hybrid_swa_memory, model_config_parser and speculative_algorithm. Of the space's
        inputs only the model, the device and a deployment's speculative algorithm are among
        them (the kv dtype, ``--dsv4-attn-backend``, parallelism, backend flags,
        ``SGLANG_DSV4_KV_LAYOUT`` and ``SGLANG_HACK_FLASHMLA_BACKEND`` are not), and the
        resolution never assigns to the ModelConfig or its HF config. The suite checks it: every
        key's first input and every 32nd input run both ways (:meth:`decide_fresh`) and must give
        the same outcome."""
        sa = self.ServerArgs(**kwargs)
        if self.model_configs is not None and self.model_config_key(point) in self.model_configs:
            sa._model_config = self.model_configs[self.model_config_key(point)]
        return sa

    def _remember_model_config(self, point: dict, sa) -> None:
        built = getattr(sa, "_model_config", None)
        if self.model_configs is None or built is None or getattr(sa, "_model_config_built_from", None) is None:
            return
        self.model_configs.setdefault(self.model_config_key(point), built)


class _Runner:
    """What the backend factory reads of a model runner before it picks a class."""

    def __init__(self, server_args):
        self.server_args = server_args


def _bf16():
    import torch

    return torch.bfloat16


def _error(exc: BaseException) -> dict:
    """The exception's type, the last SGLang frame that raised it (``srt/...py:line``, the line of
    that frame being executed: what ``traceback.extract_tb`` reports, without reading any source
    file) and its message."""
    where = None
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if "site-packages/sglang/" in filename:
            where = f"{filename.split('site-packages/sglang/', 1)[1]}:{tb.tb_lineno}"
        tb = tb.tb_next
    return {"error": type(exc).__name__, "where": where, "message": str(exc)[:300]}
