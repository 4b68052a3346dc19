"""ROCm (gfx942 / gfx950) sparse decode through AITER's MLA decode kernel.

AITER's ``aiter.mla.mla_decode_fwd`` is a paged MLA decode with the
DeepSeek-V3 ABI: query/key width 576 (512 latent + 64 RoPE), value = the first
512 key columns, fp32 log-sum-exp on request. DeepSeek-V4's row is 512 wide
and is key and value at once, so the mapping is exact with zero padding:

* the selected fp8_ds_mla rows (``indices`` then ``extra_indices``, skipped
  entries dropped) are dequantized by our layout into a bf16 gather buffer
  ``kv_buffer [n + 1, 1, 1, 576]`` whose columns 512..575 are zero (row ``n``
  is all zero, for tokens that select nothing);
* ``q`` goes as bf16 ``[b * s_q, h, 576]`` with zero columns 512..575, so
  ``q . k`` is unchanged and ``v`` is the whole 512-wide row;
* every query token is its own request: ``qo_indptr = arange(b * s_q + 1)``,
  ``max_seqlen_q = 1``, ``page_size = 1``, ``nhead_kv = 1``, ``kv_indptr`` the
  running count of each token's rows, ``kv_indices`` into the gather buffer,
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

from typing import Any, ClassVar

from .base import DecodeInputs, DecodeOutput, SparseMLAImpl, import_attr_module
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

    @classmethod
    def _target_reason(cls, platform: str, capability: Capability | None) -> str | None:
        if platform != "rocm":
            return f"AITER runs on AMD GPUs (platform rocm), not {platform}"
        if capability is None:
            return "no ROCm GPU architecture known; AITER's MLA decode needs gfx942 or gfx950"
        if capability not in AITER_CAPABILITIES:
            return (
                "AITER's MLA decode kernels are built for gfx942 and gfx950; "
                f"this GPU reports capability {capability[0]}.{capability[1]}"
            )
        return None

    @classmethod
    def _import_library(cls) -> Any:
        return import_attr_module("aiter.mla", attr="mla_decode_fwd")

    @classmethod
    def _library_missing_reason(cls, exc: BaseException) -> str:
        return f"aiter.mla.mla_decode_fwd is not importable ({type(exc).__name__}: {exc}): {AITER_INSTALL_HINT}"

    def _forward_library(self, lib: Any, capability: Capability | None, inputs: DecodeInputs) -> DecodeOutput:
        import torch

        q, device = inputs.q, inputs.q.device
        b, s, h = inputs.batch, inputs.seq_q, inputs.heads
        tokens = b * s

        def selection(indices: torch.Tensor, lengths: torch.Tensor | None) -> torch.Tensor:
            """[b*s, k] bool: which columns are selected."""
            k = indices.shape[-1]
            valid = indices.to(device) >= 0
            if lengths is not None:
                cols = torch.arange(k, device=device).view(1, 1, k)
                valid = valid & (cols < lengths.to(device).view(b, 1, 1))
            return valid.reshape(tokens, k)

        # Gather-buffer rows: every selected main row, then every selected extra row.
        sources = [(inputs.kv_cache, inputs.indices, inputs.topk_length)]
        if inputs.extra_kv_cache is not None:
            sources.append((inputs.extra_kv_cache, inputs.extra_indices, inputs.extra_topk_length))
        row_blocks, positions, masks, base = [], [], [], 0
        for cache, indices, lengths in sources:
            valid = selection(indices, lengths)
            slots = indices.to(device).reshape(tokens, -1)[valid].long()  # token-major order
            row_blocks.append(self.layout.read(cache, slots))
            # Position of each selected entry in the gather buffer.
            pos = torch.cumsum(valid.reshape(-1).to(torch.int64), 0).view(tokens, -1) - 1 + base
            positions.append(torch.where(valid, pos, torch.full_like(pos, -1)))
            masks.append(valid)
            base += int(slots.numel())
        zero_row = base
        rows = torch.cat(row_blocks + [torch.zeros((1, HEAD_DIM), dtype=torch.bfloat16, device=device)])
        kv_buffer = torch.nn.functional.pad(rows, (0, ROPE_DIM)).view(-1, 1, 1, _QK_WIDTH)

        empty = ~torch.cat(masks, dim=1).any(dim=1)  # [tokens]: selects nothing
        # Such a token reads the zero row instead, so no request is empty for the kernel.
        filler = torch.where(empty, zero_row, -1).view(tokens, 1)
        valid = torch.cat(masks + [empty.view(tokens, 1)], dim=1)
        pos = torch.cat(positions + [filler], dim=1)
        kv_indices = pos[valid].to(torch.int32)
        counts = valid.sum(dim=1).to(torch.int32)
        kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int32, device=device), torch.cumsum(counts, 0, dtype=torch.int32)])

        query = torch.nn.functional.pad(q.to(torch.bfloat16).reshape(tokens, h, HEAD_DIM), (0, ROPE_DIM)).contiguous()
        out = torch.empty((tokens, h, HEAD_DIM), dtype=torch.bfloat16, device=device)
        _, lse = lib.mla_decode_fwd(
            query,
            kv_buffer,
            out,
            torch.arange(tokens + 1, dtype=torch.int32, device=device),  # qo_indptr
            kv_indptr,
            kv_indices,
            torch.ones(tokens, dtype=torch.int32, device=device),  # kv_last_page_lens
            1,  # max_seqlen_q
            page_size=1,
            nhead_kv=1,
            sm_scale=float(inputs.softmax_scale),
            return_lse=True,
        )
        lse = lse.reshape(tokens, h).float()
        result = out.float()
        if inputs.attn_sink is not None:
            sink = inputs.attn_sink.to(device=device, dtype=torch.float32).view(1, h)
            result = result * torch.sigmoid(lse - sink).unsqueeze(-1)  # = exp(lse) / (exp(lse) + exp(sink))
        result = result.masked_fill(empty.view(tokens, 1, 1), 0.0)
        lse = lse.masked_fill(empty.view(tokens, 1), float("inf"))
        return DecodeOutput(result.to(torch.bfloat16).view(b, s, h, HEAD_DIM), lse.view(b, s, h))
