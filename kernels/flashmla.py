"""FlashMLA sparse FP8 decode (SM90, SM100 family) over the fp8_ds_mla layout.

The call, as verified on an H200 against FlashMLA built from source
(``docs/kernels.md``)::

    sched_meta = flash_mla.get_mla_metadata()[0]
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, sched_meta,
        num_splits=None, softmax_scale=..., causal=False, is_fp8_kvcache=True,
        indices=..., attn_sink=..., [extra_k_cache=..., extra_indices_in_kvcache=...,
        topk_length=..., extra_topk_length=...])

* ``q``: bf16 ``[b, s_q, h_q, 512]``, ``h_q`` padded with zero heads to 64 or 128
  (the kernel's only head counts); more than 128 heads is a ValueError.
* ``k_cache``: the fp8_ds_mla pages as float8_e4m3fn ``(num_blocks, block_size, 1, 584)``
  with strides ``(page_bytes, 584, 584, 1)``, sharing storage with the uint8 cache.
* ``indices`` / ``topk_length``: int32 slots and int32 ``[b]`` lengths.
* ``attn_sink``: float32 ``[h_q]`` (padded heads get 0; their output is dropped).
* ``lse`` comes back ``[b, h_q, s_q]`` and is returned as ``[b, s_q, h]``.
* ``sched_meta`` is taken fresh for every call: FlashMLA allows reuse only when
  shapes *and* the values of ``topk_length`` stay the same, which a caller
  cannot promise here.

FlashMLA's PyPI name ``flash-mla`` is a broken placeholder; install from
https://github.com/deepseek-ai/FlashMLA (see ``docs/kernels.md``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from .base import DecodeInputs, DecodeOutput, SparseMLAImpl, pad_heads, padded_heads
from .platform import Capability, format_capability

__all__ = ["DeepseekV4FlashMLASparseImpl", "FLASHMLA_INSTALL_HINT"]

FLASHMLA_INSTALL_HINT = (
    "install FlashMLA from https://github.com/deepseek-ai/FlashMLA "
    "(git clone --recursive, then pip install --no-build-isolation . with a CUDA build of torch); "
    "PyPI's flash-mla is a broken placeholder"
)

#: FlashMLA's sparse FP8 decode kernels exist for these head counts only.
FLASHMLA_HEADS: tuple[int, ...] = (64, 128)


class DeepseekV4FlashMLASparseImpl(SparseMLAImpl):
    """DeepSeek-V4 sparse decode through ``flash_mla.flash_mla_with_kvcache``."""

    impl_name: ClassVar[str] = "DeepseekV4FlashMLASparseImpl"
    library_name: ClassVar[str] = "flash_mla"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla"})
    supported_majors: ClassVar[frozenset[int]] = frozenset({9, 10})

    @classmethod
    def _target_reason(cls, platform: str, capability: Capability | None) -> str | None:
        if platform != "cuda":
            return f"FlashMLA sparse decode runs on NVIDIA GPUs (platform cuda), not {platform}"
        if capability is None:
            return "no CUDA compute capability known; FlashMLA sparse decode needs SM90 or SM100"
        if capability[0] not in cls.supported_majors:
            return (
                f"FlashMLA sparse FP8 decode is built for SM90 and the SM100 family; "
                f"this GPU is {format_capability(capability)}"
            )
        return None

    @classmethod
    def _import_library(cls) -> Any:
        import importlib

        module = importlib.import_module("flash_mla")
        fn = getattr(module, "flash_mla_with_kvcache", None)
        if fn is None or not hasattr(module, "get_mla_metadata"):
            raise ImportError("flash_mla has no flash_mla_with_kvcache / get_mla_metadata")
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # a C function: trust it
            return module
        missing = {"indices", "is_fp8_kvcache", "attn_sink"} - set(params)
        if missing:
            raise ImportError(
                f"flash_mla is too old for sparse decode (flash_mla_with_kvcache lacks {', '.join(sorted(missing))})"
            )
        return module

    @classmethod
    def _library_missing_reason(cls, exc: BaseException) -> str:
        return f"flash_mla is not importable ({type(exc).__name__}: {exc}): {FLASHMLA_INSTALL_HINT}"

    def _forward_library(self, lib: Any, capability: Capability | None, inputs: DecodeInputs) -> DecodeOutput:
        import torch

        h = inputs.heads
        h_pad = padded_heads(h, FLASHMLA_HEADS, self.impl_name)
        q = pad_heads(inputs.q.to(torch.bfloat16), 2, h_pad).contiguous()

        def pages(cache: torch.Tensor) -> torch.Tensor:
            view = self.layout.kernel_view(cache)  # uint8 (nb, bs, 584), strides (page, 584, 1)
            nb, bs, width = view.shape
            return view.view(torch.float8_e4m3fn).as_strided(
                (nb, bs, 1, width), (view.stride(0), width, width, 1), view.storage_offset()
            )

        def i32(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device=q.device, dtype=torch.int32).contiguous()

        kwargs: dict[str, Any] = {
            "num_splits": None,
            "softmax_scale": float(inputs.softmax_scale),
            "causal": False,
            "is_fp8_kvcache": True,
            "indices": i32(inputs.indices),
            "attn_sink": None
            if inputs.attn_sink is None
            else pad_heads(inputs.attn_sink.to(device=q.device, dtype=torch.float32), 0, h_pad).contiguous(),
        }
        # Optional arguments go only when used, so builds that predate them still work.
        if inputs.extra_kv_cache is not None:
            kwargs["extra_k_cache"] = pages(inputs.extra_kv_cache)
            kwargs["extra_indices_in_kvcache"] = i32(inputs.extra_indices)
        if inputs.topk_length is not None:
            kwargs["topk_length"] = i32(inputs.topk_length)
        if inputs.extra_topk_length is not None:
            kwargs["extra_topk_length"] = i32(inputs.extra_topk_length)

        sched_meta = lib.get_mla_metadata()[0]
        out, lse = lib.flash_mla_with_kvcache(q, pages(inputs.kv_cache), None, None, 512, sched_meta, **kwargs)
        return DecodeOutput(out[:, :, :h], lse.transpose(1, 2)[:, :, :h])
