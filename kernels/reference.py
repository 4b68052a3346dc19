"""The exact math of DeepSeek-V4 sparse MLA decode, in float32 torch ops.

:func:`sparse_mla_decode` is the definition the kernel adapters are checked
against, and :class:`DeepseekV4ReferenceSparseImpl` serves it as a real
backend (the rules pick it for ``cpu`` and ``xpu``; it runs wherever torch runs).

The math, per batch ``b``, query token ``s`` and head ``h``:
one latent KV head of 512 values is both key and value. Let ``T`` be the
selected tokens: ``indices[b, s, :]`` (cache slots ``block * block_size +
offset``; a negative entry, conventionally -1, is skipped; with
``topk_length`` only the first ``topk_length[b]`` columns count), plus the same
from ``extra_indices`` into ``extra_cache`` when given. With
``z_t = softmax_scale * <q[b,s,h], kv_t>`` (kv dequantized by the layout)::

    lse[b,s,h] = log(sum_{t in T} exp(z_t))
    out[b,s,h] = sum_t exp(z_t) * kv_t / (sum_t exp(z_t) + exp(attn_sink[h]))

i.e. the sink adds ``exp(sink)`` to the softmax denominator only, which equals
scaling the sink-free output by ``exp(lse) / (exp(lse) + exp(sink))``; ``lse``
never includes the sink. A row with no selected token (all skipped) has
``out = 0`` and ``lse = +inf`` (FlashMLA's convention: ``exp(-lse) = 0``
makes any later merge ignore it).
"""

from __future__ import annotations

from typing import Any, ClassVar

from .base import DecodeInputs, DecodeOutput, DecodePlan, SparseMLAImpl
from .decode import sparse_mla_decode

__all__ = ["sparse_mla_decode", "DeepseekV4ReferenceSparseImpl"]


class DeepseekV4ReferenceSparseImpl(SparseMLAImpl):
    """:func:`sparse_mla_decode` as an attention backend.

    Reads every layout. Available wherever torch imports; the rules select it
    for the ``cpu`` and ``xpu`` platforms, where no fused kernel exists here.
    ``forward_decode`` returns ``out`` in bf16 like the GPU kernels.
    """

    impl_name: ClassVar[str] = "DeepseekV4ReferenceSparseImpl"
    library_name: ClassVar[str] = "torch"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla", "bf16_row", "fp8_e4m3_row"})

    @classmethod
    def import_library(cls) -> Any:
        import torch

        return torch

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        return f"torch is not importable ({type(exc).__name__}: {exc}): pip install torch"

    def run_library(self, plan: DecodePlan, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                     extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        return self._forward_reference(DecodeInputs(
            q, kv_cache, indices, plan.softmax_scale, attn_sink, plan.topk_length,
            extra_kv_cache, extra_indices, plan.extra_topk_length, plan.seq_lens,
        ))

    def prefill_library(self, plan: DecodePlan, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                        extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        """The prefill hook: every prefill token is a decode row to the reference."""
        return self.run_library(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)
