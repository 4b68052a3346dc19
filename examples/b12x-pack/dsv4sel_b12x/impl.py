"""The impl class the pack's rules name: the B12X fork's SM120 sparse decode.

It reads dsv4sel's fp8_ds_mla pages (584 B/token), so cache allocation and
writes come from :class:`dsv4sel.kernels.base.SparseMLAImpl`. The class writes
exactly the extension API the base class calls (``docs/kernels.md``, "Writing an
impl"): ``import_library`` and ``library_missing_reason`` (which module, what to
install), and ``run_library`` (the kernel call for one layer). Without the fork's
module ``b12x``, ``is_available()`` says what to install and ``forward_decode``
raises dsv4sel's KernelUnavailableError with that reason, or runs the torch
reference when the impl is constructed with ``fallback="reference"``.

The fork's call (illustrative: the fork is not public)::

    out, lse = b12x.sparse_mla_decode(
        q,              # bf16 [b, s_q, h, 512]
        pages,          # uint8 (num_blocks, block_size, 584), strides (page_bytes, 584, 1): kv_cache_view(cache)
        indices,        # int32 [b, s_q, topk] slots (block * block_size + offset), -1 = skip
        softmax_scale=..., attn_sink=None | float32 [h], topk_length=None | int32 [b],
        extra_pages=None | uint8 pages, extra_indices=None | int32 [b, s_q, extra_topk],
        extra_topk_length=None | int32 [b])
    # out bf16 [b, s_q, h, 512], lse float32 [b, s_q, h]
"""

from __future__ import annotations

from typing import Any, ClassVar

from dsv4sel.kernels.base import DecodeOutput, DecodePlan, SparseMLAImpl


def _i32(t: Any) -> Any:
    import torch

    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


class B12XMLASparseImpl(SparseMLAImpl):
    """DeepSeek-V4 sparse decode through the B12X fork's ``b12x.sparse_mla_decode`` (SM120/SM121)."""

    impl_name: ClassVar[str] = "B12XMLASparseImpl"
    library_name: ClassVar[str] = "b12x"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla"})
    # where it runs, read by SparseMLAImpl.target_reason: CUDA SM12x (SM120/SM121)
    targets: ClassVar[dict[str, frozenset]] = {"cuda": frozenset({12})}
    kernel_label: ClassVar[str] = "B12X"
    built_for: ClassVar[str] = "has kernels for SM120/SM121 only"

    @classmethod
    def import_library(cls) -> Any:
        import b12x  # the fork's extension module

        return b12x

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        return f"the B12X fork's module `b12x` is not importable ({exc}); install the fork's wheel"

    def run_library(self, plan: DecodePlan, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                    extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        # plan.library is the imported b12x module; the plan holds the int32 lengths and the scale.
        extra_pages = None if extra_kv_cache is None else self.kv_cache_view(extra_kv_cache)
        out, lse = plan.library.sparse_mla_decode(
            q, self.kv_cache_view(kv_cache), _i32(indices),
            softmax_scale=plan.softmax_scale, attn_sink=attn_sink, topk_length=plan.topk_length,
            extra_pages=extra_pages, extra_indices=None if extra_indices is None else _i32(extra_indices),
            extra_topk_length=plan.extra_topk_length,
        )
        return DecodeOutput(out, lse)
