"""Fused Triton write / read kernels for the three KV-cache codecs (CUDA only).

:mod:`dsv4sel.kernels.layouts` calls these for caches on a CUDA device when
Triton imports; the torch ops there stay the CPU path and the reference. Each
kernel is byte-exact with the torch codec: the same float32 operations in the
same order (IEEE division ``div_rn``; libdevice's ``log2f``, which torch's CUDA
``log2`` also calls; scales built from their exponent bits), then the same
round-to-nearest-even casts.

Write semantics (shared with the torch path):

* a negative slot is skipped (vLLM's padding convention); with ``check=False``
  so is a slot ``>= capacity`` (no device sync; graph-safe);
* duplicate slots: the row given *last* wins, whole. Without ``unique=True``
  the write first elects, per slot, the last row that names it: three small
  passes that use 4 bytes of the target token's own record as scratch (the
  fp8_ds_mla scale row, or the row's first 4 bytes), which the winning row
  then overwrites; ``unique=True`` (the caller promises no duplicates, as
  vLLM's slot mappings are) skips them;
* the fp8_ds_mla pad byte is written as 0; page padding is never touched.

Read: a negative (or, with ``check=False``, out-of-range) slot reads a zero row.

Importing this module imports triton; :mod:`~dsv4sel.kernels.layouts` imports it
only for CUDA caches.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.0
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    from triton.language.extra.cuda import libdevice  # type: ignore[no-redef]

__all__ = ["write_fp8_ds_mla", "read_fp8_ds_mla", "write_row", "read_row"]

_NOPE = 448
_TOKEN_DATA = 576
_SCALE_BYTES = 8
#: Row codecs: tokens per program (each 512 columns) and warps, from the tile sweep.
_WRITE_TOKENS = 4
_READ_TOKENS = 4
_WRITE_WARPS = 4
_READ_WARPS = 4
#: fp8_ds_mla (tokens per program, warps), from the tile sweep on an H200 (docs/kernels.md).
_DSMLA_WRITE = (8, 4)
_DSMLA_READ = (16, 8)
_CLAIM_BLOCK = 1024


# -- what every codec kernel starts with --------------------------------------
@triton.jit
def _token_slots(slots, n, capacity, TOKENS: tl.constexpr):
    """This program's TOKENS row numbers, which of them are rows of the batch,
    which address a slot inside the cache, and each row's slot. A skipped row
    addresses slot 0 (its accesses are masked), so every offset stays aligned."""
    rows = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    in_range = rows < n
    s = tl.load(slots + rows, mask=in_range, other=-1).to(tl.int64)
    ok = in_range & (s >= 0) & (s < capacity)
    return rows, in_range, ok, tl.where(ok, s, 0)


@triton.jit
def _ds_mla_offsets(s, block_size, page_bytes):
    """Byte offsets of slot ``s``'s 576-byte data row and its 8 scale bytes in an fp8_ds_mla page."""
    blk = s // block_size
    off = s - blk * block_size
    data = tl.multiple_of(blk * page_bytes + off * 576, 64)
    scale_at = tl.multiple_of(blk * page_bytes + block_size * 576 + off * 8, 8)
    return data, scale_at


# -- duplicate slots: elect the last row per slot ------------------------------
@triton.jit
def _scratch_index(s, block_size, page_i32, base_i32, stride_i32):
    blk = s // block_size
    off = s - blk * block_size
    return blk * page_i32 + base_i32 + off * stride_i32


@triton.jit
def _claim_reset(scratch, slots, n, capacity, block_size, page_i32, base_i32, stride_i32, BLOCK: tl.constexpr):
    i, _, ok, s = _token_slots(slots, n, capacity, BLOCK)
    idx = _scratch_index(s, block_size, page_i32, base_i32, stride_i32)
    tl.store(scratch + idx, tl.full((BLOCK,), -1, tl.int32), mask=ok)


@triton.jit
def _claim_max(scratch, slots, n, capacity, block_size, page_i32, base_i32, stride_i32, BLOCK: tl.constexpr):
    i, _, ok, s = _token_slots(slots, n, capacity, BLOCK)
    idx = _scratch_index(s, block_size, page_i32, base_i32, stride_i32)
    tl.atomic_max(scratch + idx, i.to(tl.int32), mask=ok, sem="relaxed")


@triton.jit
def _claim_won(won, scratch, slots, n, capacity, block_size, page_i32, base_i32, stride_i32, BLOCK: tl.constexpr):
    i, _, ok, s = _token_slots(slots, n, capacity, BLOCK)
    idx = _scratch_index(s, block_size, page_i32, base_i32, stride_i32)
    winner = tl.load(scratch + idx, mask=ok, other=-2)
    tl.store(won + i, (winner == i.to(tl.int32)).to(tl.int8), mask=i < n)


def _winners(cache_i32: torch.Tensor, slots: torch.Tensor, capacity: int, block_size: int,
             page_i32: int, base_i32: int, stride_i32: int) -> torch.Tensor:
    """int8 ``[n]``: 1 where row i is the last one naming its (valid) slot."""
    n = slots.numel()
    won = torch.empty(n, dtype=torch.int8, device=slots.device)
    grid = (triton.cdiv(n, _CLAIM_BLOCK),)
    args = (cache_i32, slots, n, capacity, block_size, page_i32, base_i32, stride_i32)
    _claim_reset[grid](*args, BLOCK=_CLAIM_BLOCK)
    _claim_max[grid](*args, BLOCK=_CLAIM_BLOCK)
    _claim_won[grid](won, *args, BLOCK=_CLAIM_BLOCK)
    return won


# -- fp8_ds_mla ---------------------------------------------------------------
@triton.jit
def _write_fp8_ds_mla_kernel(
    kv, kv_stride, slots, won, cache_u8, cache_f8, cache_bf16, n, capacity, block_size, page_bytes,
    HAS_WON: tl.constexpr, TOKENS: tl.constexpr,
):
    """Quantize TOKENS rows into their slots' data and scale rows; blocks are [tokens, 8 tiles, 64]."""
    rows, in_range, ok, s = _token_slots(slots, n, capacity, TOKENS)
    if HAS_WON:
        ok = ok & (tl.load(won + rows, mask=in_range, other=0) != 0)
    data, scale_at = _ds_mla_offsets(s, block_size, page_bytes)

    tiles = tl.arange(0, 8)
    lanes = tl.arange(0, 64)
    ok3 = ok[:, None, None]
    col = tiles[None, :, None] * 64 + lanes[None, None, :]  # [1, 8, 64]
    x = tl.load(kv + rows[:, None, None] * kv_stride + col, mask=ok3, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=2)  # [T, 8]; tile 7 is RoPE, unused
    ratio = tl.maximum(tl.div_rn(amax, 448.0), 1e-4)
    exponent = tl.ceil(libdevice.log2(ratio)).to(tl.int32)
    inv_scale = ((127 - exponent) << 23).to(tl.float32, bitcast=True)  # 2**-exponent, exact
    quant = tl.minimum(tl.maximum(x * inv_scale[:, :, None], -448.0), 448.0).to(tl.float8e4nv)
    is_nope = tiles[None, :, None] < 7
    tl.store(cache_f8 + data[:, None, None] + col, quant, mask=ok3 & is_nope)
    rope_at = tl.multiple_of((data + 448) // 2 - 448, 32)
    tl.store(cache_bf16 + rope_at[:, None, None] + col, x.to(tl.bfloat16), mask=ok3 & ~is_nope)
    scale_bytes = tl.where(tiles[None, :] < 7, exponent + 127, 0).to(tl.uint8)
    tl.store(cache_u8 + scale_at[:, None] + tiles[None, :], scale_bytes, mask=ok[:, None])


@triton.jit
def _read_fp8_ds_mla_kernel(
    out, cache_u8, cache_f8, cache_bf16, slots, n, capacity, block_size, page_bytes, TOKENS: tl.constexpr,
):
    """Dequantize TOKENS slots' rows to bf16; blocks are [tokens, 8 tiles, 64]."""
    rows, in_range, ok, s = _token_slots(slots, n, capacity, TOKENS)
    data, scale_at = _ds_mla_offsets(s, block_size, page_bytes)

    tiles = tl.arange(0, 8)
    lanes = tl.arange(0, 64)
    ok3 = ok[:, None, None]
    col = tiles[None, :, None] * 64 + lanes[None, None, :]
    is_nope = tiles[None, :, None] < 7
    e = tl.load(cache_u8 + scale_at[:, None] + tiles[None, :], mask=ok[:, None], other=127).to(tl.int32)
    scale = tl.where(e == 0, 0x400000, e << 23).to(tl.float32, bitcast=True)  # 2**(e - 127)
    nope = tl.load(cache_f8 + data[:, None, None] + col, mask=ok3 & is_nope, other=0.0)
    nope = (nope.to(tl.float32) * scale[:, :, None]).to(tl.bfloat16)
    rope_at = tl.multiple_of((data + 448) // 2 - 448, 32)
    rope = tl.load(cache_bf16 + rope_at[:, None, None] + col, mask=ok3 & ~is_nope, other=0.0)
    value = tl.where(is_nope, nope, rope)
    value = tl.where(ok3, value, 0.0).to(tl.bfloat16)
    tl.store(out + rows[:, None, None] * 512 + col, value, mask=in_range[:, None, None])


def _views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    flat = cache.view(torch.uint8).reshape(-1)
    return flat, flat.view(torch.float8_e4m3fn), flat.view(torch.bfloat16), flat.view(torch.int32)


def write_fp8_ds_mla(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, block_size: int,
                     unique: bool = False) -> None:
    """Quantize ``kv`` ``[n, 512]`` into fp8_ds_mla pages ``cache`` (uint8 ``[num_blocks, page_bytes]``)."""
    n = kv.shape[0]
    if n == 0:
        return
    if kv.stride(1) != 1:
        kv = kv.contiguous()
    page_bytes = cache.shape[1]
    capacity = cache.shape[0] * block_size
    u8, f8, bf16, i32 = _views(cache)
    won = None
    if not unique:
        won = _winners(i32, slots, capacity, block_size, page_bytes // 4, block_size * _TOKEN_DATA // 4, _SCALE_BYTES // 4)
    tokens, warps = _DSMLA_WRITE
    _write_fp8_ds_mla_kernel[(triton.cdiv(n, tokens),)](
        kv, kv.stride(0), slots, won if won is not None else slots, u8, f8, bf16, n, capacity, block_size, page_bytes,
        HAS_WON=won is not None, TOKENS=tokens, num_warps=warps,
    )


def read_fp8_ds_mla(cache: torch.Tensor, slots: torch.Tensor, block_size: int) -> torch.Tensor:
    """Dequantize the fp8_ds_mla rows at ``slots`` to bf16 ``[n, 512]``."""
    n = slots.numel()
    out = torch.empty((n, 512), dtype=torch.bfloat16, device=cache.device)
    if n == 0:
        return out
    u8, f8, bf16, _ = _views(cache)
    tokens, warps = _DSMLA_READ
    _read_fp8_ds_mla_kernel[(triton.cdiv(n, tokens),)](
        out, u8, f8, bf16, slots, n, cache.shape[0] * block_size, block_size, cache.shape[1],
        TOKENS=tokens, num_warps=warps,
    )
    return out


# -- plain rows (bf16_row, fp8_e4m3_row) --------------------------------------
@triton.jit
def _write_row_kernel(
    kv, kv_stride, slots, won, rows_out, n, capacity, scale,
    FP8: tl.constexpr, SCALED: tl.constexpr, HAS_WON: tl.constexpr, TOKENS: tl.constexpr,
):
    rows, in_range, ok, s = _token_slots(slots, n, capacity, TOKENS)
    if HAS_WON:
        ok = ok & (tl.load(won + rows, mask=in_range, other=0) != 0)
    cols = tl.arange(0, 512)
    x = tl.load(kv + rows[:, None] * kv_stride + cols[None, :], mask=ok[:, None], other=0.0)
    if FP8:
        x = x.to(tl.float32)
        if SCALED:
            x = tl.div_rn(x, scale)
        y = tl.minimum(tl.maximum(x, -448.0), 448.0).to(tl.float8e4nv)
    else:
        y = x.to(tl.bfloat16)
    row = tl.multiple_of(s * 512, 512)
    tl.store(rows_out + row[:, None] + cols[None, :], y, mask=ok[:, None])


@triton.jit
def _read_row_kernel(out, rows_in, slots, n, capacity, scale, FP8: tl.constexpr, SCALED: tl.constexpr,
                     TOKENS: tl.constexpr):
    rows, in_range, ok, s = _token_slots(slots, n, capacity, TOKENS)
    cols = tl.arange(0, 512)
    row = tl.multiple_of(s * 512, 512)
    x = tl.load(rows_in + row[:, None] + cols[None, :], mask=ok[:, None], other=0.0)
    if FP8:
        x = x.to(tl.float32)
        if SCALED:
            x = x * scale
    y = tl.where(ok[:, None], x.to(tl.bfloat16), 0.0).to(tl.bfloat16)
    tl.store(out + rows[:, None] * 512 + cols[None, :], y, mask=in_range[:, None])


def write_row(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, scale: float | None,
              unique: bool = False) -> None:
    """Store ``kv`` into a row cache ``[num_blocks, block_size, 512]`` (bf16, or float8 when ``scale`` is given)."""
    n = kv.shape[0]
    if n == 0:
        return
    if kv.stride(1) != 1:
        kv = kv.contiguous()
    fp8 = scale is not None
    num_blocks, block_size, width = cache.shape
    capacity = num_blocks * block_size
    row_bytes = width * cache.element_size()
    won = None
    if not unique:
        i32 = cache.view(torch.uint8).reshape(-1).view(torch.int32)
        won = _winners(i32, slots, capacity, block_size, block_size * row_bytes // 4, 0, row_bytes // 4)
    grid = (triton.cdiv(n, _WRITE_TOKENS),)
    _write_row_kernel[grid](
        kv, kv.stride(0), slots, won if won is not None else slots, cache, n, capacity, float(scale or 1.0),
        FP8=fp8, SCALED=fp8 and float(scale) != 1.0, HAS_WON=won is not None, TOKENS=_WRITE_TOKENS, num_warps=_WRITE_WARPS,
    )


def read_row(cache: torch.Tensor, slots: torch.Tensor, scale: float | None) -> torch.Tensor:
    """Rows at ``slots`` of a row cache as bf16 ``[n, 512]`` (dequantized with ``scale`` when float8)."""
    n = slots.numel()
    out = torch.empty((n, 512), dtype=torch.bfloat16, device=cache.device)
    if n == 0:
        return out
    fp8 = scale is not None
    capacity = cache.shape[0] * cache.shape[1]
    grid = (triton.cdiv(n, _READ_TOKENS),)
    _read_row_kernel[grid](
        out, cache, slots, n, capacity, float(scale or 1.0),
        FP8=fp8, SCALED=fp8 and float(scale) != 1.0, TOKENS=_READ_TOKENS, num_warps=_READ_WARPS,
    )
    return out
