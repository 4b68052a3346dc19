"""The impl class the pack's rules name: the B12X fork's SM120 sparse decode.

It reads dsv4sel's fp8_ds_mla pages (584 B/token), so cache allocation and
writes come from :class:`dsv4sel.kernels.base.SparseMLAImpl`; decode calls
the fork's extension module ``b12x``. Without it, ``forward_decode`` raises
dsv4sel's KernelUnavailableError naming what to install, or runs the torch
reference when constructed with ``fallback="reference"``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from dsv4sel.kernels.base import DecodeOutput, SparseMLAImpl


class B12XMLASparseImpl(SparseMLAImpl):
    impl_name: ClassVar[str] = "B12XMLASparseImpl"
    library_name: ClassVar[str] = "b12x"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla"})
    # where it runs, read by SparseMLAImpl._target_reason: CUDA SM12x (SM120/SM121)
    targets: ClassVar[dict[str, frozenset]] = {"cuda": frozenset({12})}
    kernel_label: ClassVar[str] = "B12X"
    built_for: ClassVar[str] = "has kernels for SM120/SM121 only"

    @classmethod
    def _import_library(cls) -> Any:
        import b12x  # the fork's extension module

        return b12x

    @classmethod
    def _library_missing_reason(cls, exc: BaseException) -> str:
        return f"the B12X fork's module `b12x` is not importable ({exc}); install the fork's wheel"

    def _forward_library(self, lib: Any, capability: Any, inputs) -> DecodeOutput:
        # the fork's decode takes the same page view FlashMLA does: (blocks, block_size, 1, 584)
        out, lse = lib.sparse_mla_decode(
            inputs.q, self.layout.kernel_view(inputs.kv_cache), inputs.indices,
            softmax_scale=inputs.softmax_scale, attn_sink=inputs.attn_sink, topk_length=inputs.topk_length)
        return DecodeOutput(out, lse)
