"""ROCm (gfx942 / gfx950) sparse decode through AITER's MLA decode kernel.

AITER's ``aiter.mla.mla_decode_fwd`` is a paged MLA decode with the
DeepSeek-V3 ABI: query/key width 576 (512 latent + 64 RoPE), value = the first
512 key columns, fp32 log-sum-exp on request. DeepSeek-V4's row is 512 wide
and is key and value at once, so the mapping is exact with zero padding:

* every column of ``indices`` then ``extra_indices`` is dequantized by our
  layout into its own row of a bf16 gather buffer ``kv_buffer [T * (k + k_extra) + 1,
  1, 1, 576]`` (``T = b * s_q``; skipped columns read as zeros) whose columns
  512..575 are zero; the last row is all zero, for tokens that select nothing;
  ``kv_indices`` lists, token after token, only the selected rows (fixed-size
  buffers and a scatter: no host sync, so ``run`` can be captured in a CUDA graph);
* ``q`` goes as bf16 ``[b * s_q, h, 576]`` with zero columns 512..575, so
  ``q . k`` is unchanged and ``v`` is the whole 512-wide row;
* every query token is its own request: ``qo_indptr = arange(b * s_q + 1)``,
  ``max_seqlen_q = 1``, ``page_size = 1``, ``nhead_kv = 1``, ``kv_indptr`` the
  running count of each token's listed rows,
  ``kv_last_page_lens`` all ones, ``sm_scale = softmax_scale``,
  ``return_lse=True``;
* AITER has no sink argument: the sink is applied afterwards as
  ``out * exp(lse) / (exp(lse) + exp(sink))``, the identity FlashMLA documents;
* tokens that select nothing get ``out = 0``, ``lse = +inf``.

Because our torch code does the dequantization, a cache written by this
package's fp8_ds_mla writer (OCP e4m3) reads correctly on gfx942 too; vLLM's
own gfx942 writer stores FNUZ bytes, which this layout does not decode.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from .base import DecodeOutput, DecodePlan, SparseMLAImpl, import_attr_module
from .decode import length_mask
from .layouts import HEAD_DIM, ROPE_DIM
from .platform import Capability

__all__ = ["DeepseekV4ROCMAiterMLASparseImpl", "AITER_INSTALL_HINT"]

AITER_INSTALL_HINT = (
    "pip install 'dsv4sel[rocm]' (AMD's amd-aiter, a pre-release: pip install --pre amd-aiter, "
    "or build https://github.com/ROCm/aiter) with a ROCm build of torch; PyPI's 'aiter' is an unrelated package"
)
#: gfx942 (MI300) and gfx950 (MI355) as torch reports them.
AITER_CAPABILITIES: dict[Capability, str] = {(9, 4): "gfx942", (9, 5): "gfx950"}
_QK_WIDTH = HEAD_DIM + ROPE_DIM  # 576: the DeepSeek-V3 MLA ABI AITER's kernels take


class DeepseekV4ROCMAiterMLASparseImpl(SparseMLAImpl):
    """DeepSeek-V4 sparse decode on AMD Instinct GPUs through ``aiter.mla.mla_decode_fwd``."""

    impl_name: ClassVar[str] = "DeepseekV4ROCMAiterMLASparseImpl"
    library_name: ClassVar[str] = "aiter"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla"})
    targets: ClassVar[Mapping[str, frozenset]] = {"rocm": frozenset(AITER_CAPABILITIES)}
    kernel_label: ClassVar[str] = "AITER's MLA decode"
    built_for: ClassVar[str] = "is built for gfx942 and gfx950"

    @classmethod
    def import_library(cls) -> Any:
        return import_attr_module("aiter.mla", attr="mla_decode_fwd")

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        return f"aiter.mla.mla_decode_fwd is not importable ({type(exc).__name__}: {exc}): {AITER_INSTALL_HINT}"

    # -- plan / run ---------------------------------------------------------
    def plan_library(self, plan: DecodePlan) -> None:
        import torch

        st, device = plan.state, plan.device
        tokens = plan.batch * plan.seq_q
        width = plan.topk + (plan.extra_topk or 0)  # gather rows per token
        st["tokens"], st["width"] = tokens, width
        st["qo_indptr"] = torch.arange(tokens + 1, dtype=torch.int32, device=device)
        st["kv_last_page_lens"] = torch.ones(tokens, dtype=torch.int32, device=device)
        # Query: bf16 [tokens, h, 576] with zero RoPE columns; only columns :512 are written per run.
        st["q_buf"] = torch.zeros((tokens, plan.heads, _QK_WIDTH), dtype=torch.bfloat16, device=device)
        # Gather buffer: every column of every token, then one zero row for tokens that select nothing.
        st["kv_buffer"] = torch.zeros((tokens * width + 1, 1, 1, _QK_WIDTH), dtype=torch.bfloat16, device=device)
        # Gather row of each (token, column), the filler column pointing at the zero row.
        rows = torch.arange(tokens * width, dtype=torch.int64, device=device).view(tokens, width)
        st["row_ids"] = torch.cat([rows, torch.full((tokens, 1), tokens * width, dtype=torch.int64, device=device)], 1)
        # kv_indices has room for every column plus a dump slot for the masked ones.
        st["kv_indices"] = torch.zeros(tokens * (width + 1) + 1, dtype=torch.int32, device=device)
        st["zero_ptr"] = torch.zeros(1, dtype=torch.int32, device=device)
        self.replan_library(plan)

    def replan_library(self, plan: DecodePlan) -> None:

        st, device, b = plan.state, plan.device, plan.batch

        def keep(name: str, lengths: Any, k: int) -> None:
            mask = length_mask(lengths, b, k, device)
            if mask is None:
                st[name] = None
            elif st.get(name) is None:
                st[name] = mask
            else:  # in place: a graph captured over run() reads this buffer
                st[name].copy_(mask)

        keep("keep", plan.topk_length, plan.topk)
        if plan.extra_topk is not None:
            keep("extra_keep", plan.extra_topk_length, plan.extra_topk)

    def run_library(self, plan: DecodePlan, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                     extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        import torch

        st, device = plan.state, plan.device
        b, s, h = plan.batch, plan.seq_q, plan.heads
        tokens, width = st["tokens"], st["width"]
        kv_rows = st["kv_buffer"].view(-1, _QK_WIDTH)

        # Every column is dequantized into its own gather row (skipped ones read as zeros);
        # only the selected ones are listed in kv_indices. Fixed sizes: no host sync.
        sources: list[tuple[Any, Any, Any, int, Any]] = [(kv_cache, indices, st["keep"], plan.block_size, plan.topk)]
        if extra_kv_cache is not None:
            sources.append((extra_kv_cache, extra_indices, st.get("extra_keep"), plan.extra_block_size, plan.extra_topk))
        masks, start = [], 0
        for cache, idx, keep, block_size, k in sources:
            if self.layout.block_size_of(cache) != block_size:
                raise ValueError(f"cache has block size {self.layout.block_size_of(cache)}, the plan was made for {block_size}")
            idx = idx.to(device)
            valid = idx >= 0
            if keep is not None:
                valid = valid & keep
            slots = torch.where(valid, idx, -1).reshape(-1)
            rows = self.layout.read(cache, slots, check=False).view(tokens, k, HEAD_DIM)
            kv_rows[: tokens * width].view(tokens, width, _QK_WIDTH)[:, start : start + k, :HEAD_DIM].copy_(rows)
            masks.append(valid.reshape(tokens, k))
            start += k
        selected = torch.cat(masks, dim=1)
        empty = ~selected.any(dim=1)  # such a token reads the zero row, so no request is empty for the kernel
        listed = torch.cat([selected, empty.view(tokens, 1)], dim=1)  # [tokens, width + 1]
        flat = listed.reshape(-1)
        position = torch.cumsum(flat, 0) - 1
        dump = st["kv_indices"].numel() - 1
        kv_indices = st["kv_indices"]
        kv_indices.scatter_(0, torch.where(flat, position, dump), st["row_ids"].reshape(-1).to(torch.int32))
        counts = listed.sum(dim=1, dtype=torch.int32)
        kv_indptr = torch.cat([st["zero_ptr"], torch.cumsum(counts, 0, dtype=torch.int32)])

        query = st["q_buf"]
        query[:, :, :HEAD_DIM].copy_(q.reshape(tokens, h, HEAD_DIM))
        out = torch.empty((tokens, h, HEAD_DIM), dtype=torch.bfloat16, device=device)
        _, lse = plan.library.mla_decode_fwd(
            query,
            st["kv_buffer"],
            out,
            st["qo_indptr"],
            kv_indptr,
            kv_indices,
            st["kv_last_page_lens"],
            1,  # max_seqlen_q
            page_size=1,
            nhead_kv=1,
            sm_scale=float(plan.softmax_scale),
            return_lse=True,
        )
        lse = lse.reshape(tokens, h).float()
        result = out.float()
        if attn_sink is not None:
            sink = attn_sink.to(device=device, dtype=torch.float32).view(1, h)
            result = result * torch.sigmoid(lse - sink).unsqueeze(-1)  # = exp(lse) / (exp(lse) + exp(sink))
        result = result.masked_fill(empty.view(tokens, 1, 1), 0.0)
        lse = lse.masked_fill(empty.view(tokens, 1), float("inf"))
        return DecodeOutput(result.to(torch.bfloat16).view(b, s, h, HEAD_DIM), lse.view(b, s, h))
