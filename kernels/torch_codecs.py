"""The torch-op codecs of the three DeepSeek-V4 layouts: the CPU path and the reference.

:mod:`dsv4sel.kernels.layouts` calls these where the fused Triton kernels
(:mod:`dsv4sel.kernels.triton_codecs`) do not run, and for ``backend="torch"``. The arguments
are checked by the caller (:mod:`dsv4sel.kernels.codec_support`); ``info`` is the cache's
:class:`~dsv4sel.kernels.codec_support.CacheInfo`. Same slot semantics as the kernels: negative
or out-of-range slots are skipped by writes and read as zero rows; with duplicate slots the row
given last wins. The operations are float32, in the order the layouts define (IEEE division by
a same-device tensor, float32 ``log2`` and ``ceil``), so the kernels can match them byte for byte.

This module imports torch only inside its functions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .codec_support import div, last_writers
from .record import (FP8_E4M3_MAX, NOPE_DIM, NUM_TILES, SCALE_BYTES, TILE_SIZE, TOKEN_DATA_BYTES, UE8M0_BIAS,
                     UE8M0_SCALE_FLOOR)
from .platform import require_torch

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["write_fp8_ds_mla", "read_fp8_ds_mla", "write_rows", "read_rows"]


def _ds_views(cache: "torch.Tensor", block_size: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """An fp8_ds_mla cache's token data ``[nb, bs, 576]`` and scale bytes ``[nb, bs, 8]``."""
    num_blocks = cache.shape[0]
    data = cache[:, : block_size * TOKEN_DATA_BYTES].view(num_blocks, block_size, TOKEN_DATA_BYTES)
    scale_end = block_size * (TOKEN_DATA_BYTES + SCALE_BYTES)
    scales = cache[:, block_size * TOKEN_DATA_BYTES : scale_end].view(num_blocks, block_size, SCALE_BYTES)
    return data, scales


def write_fp8_ds_mla(cache: "torch.Tensor", kv: "torch.Tensor", slots: "torch.Tensor", info: Any) -> None:
    """Quantize ``kv`` into the fp8_ds_mla pages of ``cache`` (the byte format: ``docs/kernels.md``)."""
    torch = require_torch()
    block_size = info.block_size
    data, scales = _ds_views(cache, block_size)
    rows = last_writers(slots.long(), info.capacity)
    kv, slots = kv[rows], slots.long()[rows]
    n = kv.shape[0]
    block, offset = slots // block_size, slots % block_size

    nope = kv[:, :NOPE_DIM].float().reshape(n, NUM_TILES, TILE_SIZE)
    amax = nope.abs().amax(dim=-1)  # [n, 7]
    # float32 log2/ceil, as FlashMLA's MODEL1 quantizer does: same bytes (domain.md §12).
    exponent = torch.clamp_min(div(amax, FP8_E4M3_MAX), UE8M0_SCALE_FLOOR).log2().ceil()
    scale = torch.exp2(exponent)  # exact: integer exponents
    # The clamp only matters where float32 log2 rounded a scale down a hair.
    quant = (nope / scale.unsqueeze(-1)).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    rope = kv[:, NOPE_DIM:].to(torch.bfloat16).contiguous()

    token_bytes = torch.cat([quant.view(torch.uint8).reshape(n, NOPE_DIM), rope.view(torch.uint8)], dim=1)
    scale_bytes = torch.zeros((n, SCALE_BYTES), dtype=torch.uint8, device=cache.device)
    scale_bytes[:, :NUM_TILES] = (exponent + UE8M0_BIAS).to(torch.uint8)
    data[block, offset] = token_bytes
    scales[block, offset] = scale_bytes


def read_fp8_ds_mla(cache: "torch.Tensor", slots: "torch.Tensor", info: Any) -> "torch.Tensor":
    """The fp8_ds_mla rows at ``slots``, dequantized to bf16 ``[n, 512]``."""
    torch = require_torch()
    block_size = info.block_size
    data, scales = _ds_views(cache, block_size)
    slots = slots.long()
    valid = (slots >= 0) & (slots < info.capacity)
    safe = torch.where(valid, slots, torch.zeros_like(slots))
    block, offset = safe // block_size, safe % block_size
    n = slots.numel()

    token_bytes = data[block, offset]  # [n, 576]
    exponent = scales[block, offset][:, :NUM_TILES].to(torch.int32) - UE8M0_BIAS
    nope = token_bytes[:, :NOPE_DIM].contiguous().view(torch.float8_e4m3fn).float()
    nope = nope.reshape(n, NUM_TILES, TILE_SIZE) * torch.exp2(exponent.float()).unsqueeze(-1)
    rope = token_bytes[:, NOPE_DIM:].contiguous().view(torch.bfloat16)
    rows = torch.cat([nope.reshape(n, NOPE_DIM).to(torch.bfloat16), rope], dim=1)
    return rows.masked_fill_(~valid.unsqueeze(1), 0.0)


def _byte_rows(cache: "torch.Tensor") -> "torch.Tensor":
    # Byte rows: index_put on float8 tensors is not implemented on every device.
    torch = require_torch()
    return cache.view(torch.uint8).view(cache.shape[0] * cache.shape[1], -1)


def _encode(kv: "torch.Tensor", scale: "float | None") -> "torch.Tensor":
    torch = require_torch()
    if scale is None:
        return kv.to(torch.bfloat16)
    # Saturate instead of relying on the cast's overflow behaviour (NaN on some builds).
    return div(kv.float(), scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)


def _decode(raw: "torch.Tensor", scale: "float | None") -> "torch.Tensor":
    torch = require_torch()
    if scale is None:
        return raw.view(torch.bfloat16)
    return (raw.view(torch.float8_e4m3fn).float() * scale).to(torch.bfloat16)


def write_rows(cache: "torch.Tensor", kv: "torch.Tensor", slots: "torch.Tensor", info: Any,
               scale: "float | None") -> None:
    """Store ``kv`` as bf16 rows (``scale`` None) or e4m3 rows of ``value / scale``."""
    torch = require_torch()
    keep = last_writers(slots.long(), info.capacity)
    _byte_rows(cache)[slots.long()[keep]] = _encode(kv[keep], scale).contiguous().view(torch.uint8)


def read_rows(cache: "torch.Tensor", slots: "torch.Tensor", info: Any, scale: "float | None") -> "torch.Tensor":
    """The rows at ``slots`` as bf16 ``[n, 512]`` (e4m3 rows times ``scale``)."""
    torch = require_torch()
    slots = slots.long()
    valid = (slots >= 0) & (slots < info.capacity)
    out = _decode(_byte_rows(cache)[torch.where(valid, slots, torch.zeros_like(slots))], scale)
    return out.masked_fill_(~valid.unsqueeze(1), 0.0)
