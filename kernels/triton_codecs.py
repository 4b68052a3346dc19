"""Fused Triton write / read kernels for the three KV-cache codecs (CUDA only).

:mod:`dsv4sel.kernels.layouts` calls these for caches on a CUDA device when
Triton imports; the torch ops there stay the CPU path and the reference. Each
kernel is byte-exact with the torch codec: the same float32 operations in the
same order (IEEE division ``div_rn``; libdevice's ``log2f``, which torch's CUDA
``log2`` also calls; scales built from their exponent bits), then the same
round-to-nearest-even casts.

Write semantics (shared with the torch path):

* a negative slot is skipped (vLLM's padding convention), and so is a slot
  ``>= capacity``; with ``check=True`` such a slot is also counted in the
  device's slot status (:mod:`dsv4sel.kernels.slot_status`; no host sync);
* duplicate slots: the row given *last* wins, whole. Unless ``unique=True``
  (the caller promises no duplicates, as vLLM's slot mappings are), the write
  elects, per slot, the last row naming it: for up to :data:`DEDUP_MAX` rows
  inside the write kernel itself (each program compares its rows' slots with
  every later row's: no extra launch), above that with two small extra launches
  around the write: an atomic max of the row index per slot in a scratch array
  of the cache (4 bytes per token, -1 between calls), and its reset to -1;
* the fp8_ds_mla pad byte is written as 0; page padding is never touched.

Read: a negative or out-of-range slot reads a zero row (out-of-range ones are
counted with ``check=True``).

Launches go through :class:`_Launcher`: the first launch of a kernel for a
specialization (argument dtypes, 16-byte alignment of pointers and ints, ints
equal to 1, int widths, constexprs) goes through Triton and keeps the compiled
kernel; later ones call its launcher directly, which skips Triton's per-call
argument binding (``DSV4SEL_TRITON_LAUNCHER=triton`` keeps Triton's path).

Importing this module imports triton; :mod:`~dsv4sel.kernels.layouts` imports it
only for CUDA caches.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.0
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    from triton.language.extra.cuda import libdevice  # type: ignore[no-redef]

from .slot_status import status_of

__all__ = ["write_fp8_ds_mla", "read_fp8_ds_mla", "write_row", "read_row", "DEDUP_MAX", "LAUNCHER_ENV"]

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
#: Writes of at most this many rows elect the last row per slot inside the write kernel.
DEDUP_MAX = 1024
#: Set to "triton" to launch every kernel through Triton's own launch path.
LAUNCHER_ENV = "DSV4SEL_TRITON_LAUNCHER"


# -- launching --------------------------------------------------------------
def _spec(v: Any) -> Any:
    """What Triton specializes a kernel argument on (a superset, so a key never merges two variants)."""
    cls = v.__class__
    if cls is int:
        return (v == 1, v % 16 == 0, -(1 << 31) <= v < (1 << 31))
    if cls is float or cls is bool or v is None:
        return cls
    return (v.dtype, v.data_ptr() % 16 == 0)


class _Launcher:
    """A Triton kernel with its compiled variants kept by specialization key.

    ``launcher(grid0, *args, num_warps=w)``: ``args`` are every parameter of the
    kernel in signature order, constexprs included (as Triton's own launch passes
    them). A key seen before launches the compiled kernel's launcher directly;
    otherwise (or with launch hooks installed, or ``$DSV4SEL_TRITON_LAUNCHER=triton``)
    Triton's path runs and its compiled kernel is kept.
    """

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.compiled: dict[Any, Any] = {}
        self.calls, self.hooks = 255, (None, None)  # the first call looks the hooks up
        self.fast = 0  # launches that took the cached path (the benchmark reports it)
        consts = set(getattr(fn, "constexprs", None) or [p.num for p in fn.params if p.is_constexpr])
        flags = [i in consts for i in range(len(fn.params))]
        # The constexprs are the kernel's last parameters: keyed by value, the others by _spec.
        self.cut = flags.index(True) if True in flags else len(flags)
        assert all(flags[self.cut:]), f"{fn}: constexpr parameters must come last"

    def __call__(self, grid0: int, *args: Any, num_warps: int) -> None:
        if not _FAST[0]:
            self.fn[(grid0,)](*args, num_warps=num_warps)
            return
        device = _current_device()
        cut = self.cut
        key = (device, num_warps, *map(_spec, args[:cut]), *args[cut:])
        kernel = self.compiled.get(key)
        self.calls += 1
        if not self.calls & 255:  # Triton's launch hooks, as its own launch passes them
            self.hooks = _hooks()
        if kernel is not None:
            enter, leave = self.hooks
            stream = _stream(device)
            meta = None if enter is None else kernel.launch_metadata((grid0, 1, 1), stream, *args)
            try:
                kernel.run(grid0, 1, 1, stream, kernel.function, kernel.packed_metadata, meta, enter, leave, *args)
                self.fast += 1
                return
            except TypeError as exc:  # this Triton's launcher takes other arguments: Triton's path from now on
                _FAST[0] = False
                _FAST.append(f"disabled: {exc}")
        kernel = self.fn[(grid0,)](*args, num_warps=num_warps)
        if kernel is not None and all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")):
            self.compiled[key] = kernel


def _fast_launch_setup() -> list:
    """[enabled], plus the device / stream / hook lookups the fast path uses."""
    global _current_device, _stream, _hooks
    try:
        from triton import knobs
        from triton.runtime import driver

        active = driver.active
        _current_device, _stream = active.get_current_device, active.get_current_stream
        runtime = knobs.runtime

        def _hooks() -> tuple:
            return runtime.launch_enter_hook, runtime.launch_exit_hook

        enabled = os.environ.get(LAUNCHER_ENV, "").strip().lower() != "triton"
    except Exception:  # an older Triton: its own launch path only
        enabled = False
    return [enabled]


_current_device = _stream = _hooks = None  # set by _fast_launch_setup
_FAST = _fast_launch_setup()


# -- what every codec kernel starts with --------------------------------------
@triton.jit
def _token_slots(slots, n, capacity, status, TOKENS: tl.constexpr, CHECK: tl.constexpr):
    """This program's TOKENS row numbers, which of them are rows of the batch, which
    address a slot inside the cache, each row's slot as given (int64) and the slot used
    (a skipped row addresses slot 0, its accesses masked, so every offset stays aligned).
    With CHECK, rows past the cache are counted in the device status (masked atomics:
    nothing is issued when every slot is in range)."""
    rows = tl.program_id(0).to(tl.int64) * TOKENS + tl.arange(0, TOKENS)
    in_range = rows < n
    raw = tl.load(slots + rows, mask=in_range, other=-1).to(tl.int64)
    if CHECK:
        bad = in_range & (raw >= capacity)
        at = tl.zeros_like(rows)
        tl.atomic_add(status + at, tl.full((TOKENS,), 1, tl.int64), mask=bad, sem="relaxed")
        tl.atomic_max(status + 1 + at, raw, mask=bad, sem="relaxed")
        tl.atomic_min(status + 2 + at, tl.full((TOKENS,), 0, tl.int64) + capacity, mask=bad, sem="relaxed")
    ok = in_range & (raw >= 0) & (raw < capacity)
    return rows, in_range, ok, raw, tl.where(ok, raw, 0)


@triton.jit
def _elect(rows, ok, raw, s, slots, n, scratch, ELECT: tl.constexpr, DEDUP_N: tl.constexpr):
    """``ok`` narrowed to the rows that are the last to name their slot.

    ELECT 0: the caller promised unique slots. 1: compare with every later row's slot
    (n <= DEDUP_N, the slots fit one block). 2: the scratch array holds, per slot, the
    largest row index naming it (``_claim``, launched before); ``_unclaim``, launched
    after, puts -1 back."""
    if ELECT == 1:
        cols = tl.arange(0, DEDUP_N)
        others = tl.load(slots + cols, mask=cols < n, other=-1).to(tl.int64)
        later = (cols[None, :] > rows[:, None]) & (others[None, :] == raw[:, None])
        ok = ok & (tl.max(later.to(tl.int32), axis=1) == 0)
    elif ELECT == 2:
        winner = tl.load(scratch + s, mask=ok, other=-1)
        ok = ok & (winner == rows.to(tl.int32))
    return ok


@triton.jit
def _claim(scratch, slots, n, capacity, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    raw = tl.load(slots + rows, mask=rows < n, other=-1).to(tl.int64)
    ok = (rows < n) & (raw >= 0) & (raw < capacity)
    tl.atomic_max(scratch + tl.where(ok, raw, 0), rows.to(tl.int32), mask=ok, sem="relaxed")


@triton.jit
def _unclaim(scratch, slots, n, capacity, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    raw = tl.load(slots + rows, mask=rows < n, other=-1).to(tl.int64)
    ok = (rows < n) & (raw >= 0) & (raw < capacity)
    tl.store(scratch + tl.where(ok, raw, 0), tl.full((BLOCK,), -1, tl.int32), mask=ok)


@triton.jit
def _ds_mla_offsets(s, block_size, page_bytes):
    """Byte offsets of slot ``s``'s 576-byte data row and its 8 scale bytes in an fp8_ds_mla page."""
    blk = s // block_size
    off = s - blk * block_size
    data = tl.multiple_of(blk * page_bytes + off * 576, 64)
    scale_at = tl.multiple_of(blk * page_bytes + block_size * 576 + off * 8, 8)
    return data, scale_at


# -- fp8_ds_mla ---------------------------------------------------------------
@triton.jit
def _write_fp8_ds_mla_kernel(
    kv, kv_stride, slots, scratch, status, cache_u8, cache_f8, cache_bf16, n, capacity, block_size, page_bytes,
    CHECK: tl.constexpr, ELECT: tl.constexpr, DEDUP_N: tl.constexpr, TOKENS: tl.constexpr,
):
    """Quantize TOKENS rows into their slots' data and scale rows; blocks are [tokens, 8 tiles, 64]."""
    rows, in_range, ok, raw, s = _token_slots(slots, n, capacity, status, TOKENS, CHECK)
    ok = _elect(rows, ok, raw, s, slots, n, scratch, ELECT, DEDUP_N)
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
    out, cache_u8, cache_f8, cache_bf16, slots, status, n, capacity, block_size, page_bytes,
    CHECK: tl.constexpr, TOKENS: tl.constexpr,
):
    """Dequantize TOKENS slots' rows to bf16; blocks are [tokens, 8 tiles, 64]."""
    rows, in_range, ok, raw, s = _token_slots(slots, n, capacity, status, TOKENS, CHECK)
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


# -- plain rows (bf16_row, fp8_e4m3_row) --------------------------------------
@triton.jit
def _write_row_kernel(
    kv, kv_stride, slots, scratch, status, rows_out, n, capacity, scale,
    FP8: tl.constexpr, SCALED: tl.constexpr, CHECK: tl.constexpr, ELECT: tl.constexpr, DEDUP_N: tl.constexpr,
    TOKENS: tl.constexpr,
):
    rows, in_range, ok, raw, s = _token_slots(slots, n, capacity, status, TOKENS, CHECK)
    ok = _elect(rows, ok, raw, s, slots, n, scratch, ELECT, DEDUP_N)
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
def _read_row_kernel(out, rows_in, slots, status, n, capacity, scale, FP8: tl.constexpr, SCALED: tl.constexpr,
                     CHECK: tl.constexpr, TOKENS: tl.constexpr):
    rows, in_range, ok, raw, s = _token_slots(slots, n, capacity, status, TOKENS, CHECK)
    cols = tl.arange(0, 512)
    row = tl.multiple_of(s * 512, 512)
    x = tl.load(rows_in + row[:, None] + cols[None, :], mask=ok[:, None], other=0.0)
    if FP8:
        x = x.to(tl.float32)
        if SCALED:
            x = x * scale
    y = tl.where(ok[:, None], x.to(tl.bfloat16), 0.0).to(tl.bfloat16)
    tl.store(out + rows[:, None] * 512 + cols[None, :], y, mask=in_range[:, None])


_write_ds = _Launcher(_write_fp8_ds_mla_kernel)
_read_ds = _Launcher(_read_fp8_ds_mla_kernel)
_write_rows = _Launcher(_write_row_kernel)
_read_rows = _Launcher(_read_row_kernel)
_claims = _Launcher(_claim)
_unclaims = _Launcher(_unclaim)


# -- host side ----------------------------------------------------------------
_scratch: dict[Any, Any] = {}
_byte_views: dict[int, Any] = {}


def _views(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fp8_ds_mla pages as flat uint8, float8 and bf16 views, made once per cache tensor
    (the memo holds the tensor, so its id stays its own; re-pointed tensors are re-made)."""
    hit = _byte_views.get(id(cache))
    if hit is not None and hit[1] == cache.data_ptr() and hit[2] == cache.shape:
        return hit[3]
    u8 = cache.view(-1)
    views = (u8, u8.view(torch.float8_e4m3fn), u8.view(torch.bfloat16))
    if len(_byte_views) >= 64:
        _byte_views.clear()
    _byte_views[id(cache)] = (cache, cache.data_ptr(), cache.shape, views)
    return views


def _election(slots: torch.Tensor, n: int, capacity: int, cache: torch.Tensor, unique: bool) -> tuple[int, int, Any]:
    """(ELECT, DEDUP_N, scratch) for a write of ``n`` rows; runs the claim pass when ELECT is 2."""
    if unique:
        return 0, 1, slots
    if n <= DEDUP_MAX:
        return 1, max(16, triton.next_power_of_2(n)), slots
    key = (cache.device.index, cache.data_ptr(), capacity)
    scratch = _scratch.get(key)
    if scratch is None:  # per cache; all -1 between calls (the winners put -1 back)
        if len(_scratch) >= 32:
            _scratch.clear()
        scratch = _scratch[key] = torch.full((capacity,), -1, dtype=torch.int32, device=cache.device)
    _claims(triton.cdiv(n, _CLAIM_BLOCK), scratch, slots, n, capacity, _CLAIM_BLOCK, num_warps=4)
    return 2, 1, scratch


def write_fp8_ds_mla(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, block_size: int,
                     unique: bool = False, check: bool = True) -> None:
    """Quantize ``kv`` ``[n, 512]`` into fp8_ds_mla pages ``cache`` (uint8 ``[num_blocks, page_bytes]``)."""
    n = kv.shape[0]
    if n == 0:
        return
    if kv.stride(1) != 1:
        kv = kv.contiguous()
    page_bytes = cache.shape[1]
    capacity = cache.shape[0] * block_size
    u8, f8, bf16 = _views(cache)
    status = status_of(cache.get_device()) if check else slots
    elect, dedup_n, scratch = _election(slots, n, capacity, cache, unique)
    tokens, warps = _DSMLA_WRITE
    _write_ds(triton.cdiv(n, tokens), kv, kv.stride(0), slots, scratch, status, u8, f8, bf16, n, capacity,
              block_size, page_bytes, check, elect, dedup_n, tokens, num_warps=warps)
    if elect == 2:
        _unclaims(triton.cdiv(n, _CLAIM_BLOCK), scratch, slots, n, capacity, _CLAIM_BLOCK, num_warps=4)


def read_fp8_ds_mla(cache: torch.Tensor, slots: torch.Tensor, block_size: int, check: bool = True) -> torch.Tensor:
    """Dequantize the fp8_ds_mla rows at ``slots`` to bf16 ``[n, 512]``."""
    n = slots.shape[0]
    out = torch.empty((n, 512), dtype=torch.bfloat16, device=cache.device)
    if n == 0:
        return out
    u8, f8, bf16 = _views(cache)
    status = status_of(cache.get_device()) if check else slots
    tokens, warps = _DSMLA_READ
    _read_ds(triton.cdiv(n, tokens), out, u8, f8, bf16, slots, status, n, cache.shape[0] * block_size, block_size,
             cache.shape[1], check, tokens, num_warps=warps)
    return out


def write_row(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, scale: float | None,
              unique: bool = False, check: bool = True) -> None:
    """Store ``kv`` into a row cache ``[num_blocks, block_size, 512]`` (bf16, or float8 when ``scale`` is given)."""
    n = kv.shape[0]
    if n == 0:
        return
    if kv.stride(1) != 1:
        kv = kv.contiguous()
    fp8 = scale is not None
    capacity = cache.shape[0] * cache.shape[1]
    status = status_of(cache.get_device()) if check else slots
    elect, dedup_n, scratch = _election(slots, n, capacity, cache, unique)
    _write_rows(triton.cdiv(n, _WRITE_TOKENS), kv, kv.stride(0), slots, scratch, status, cache, n, capacity,
                float(scale or 1.0), fp8, fp8 and float(scale) != 1.0, check, elect, dedup_n, _WRITE_TOKENS,
                num_warps=_WRITE_WARPS)
    if elect == 2:
        _unclaims(triton.cdiv(n, _CLAIM_BLOCK), scratch, slots, n, capacity, _CLAIM_BLOCK, num_warps=4)


def read_row(cache: torch.Tensor, slots: torch.Tensor, scale: float | None, check: bool = True) -> torch.Tensor:
    """Rows at ``slots`` of a row cache as bf16 ``[n, 512]`` (dequantized with ``scale`` when float8)."""
    n = slots.shape[0]
    out = torch.empty((n, 512), dtype=torch.bfloat16, device=cache.device)
    if n == 0:
        return out
    fp8 = scale is not None
    status = status_of(cache.get_device()) if check else slots
    _read_rows(triton.cdiv(n, _READ_TOKENS), out, cache, slots, status, n, cache.shape[0] * cache.shape[1],
               float(scale or 1.0), fp8, fp8 and float(scale) != 1.0, check, _READ_TOKENS, num_warps=_READ_WARPS)
    return out
