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

Launches go through :class:`~dsv4sel.kernels.triton_launch.Launcher`: per-call arguments
first, then a cache's arguments resolved once per cache tensor, then the constexprs; after the
first launch of a specialization the compiled kernel's C launcher is called directly
(``DSV4SEL_TRITON_LAUNCHER=triton`` keeps Triton's path).

Importing this module imports triton; :mod:`~dsv4sel.kernels.layouts` imports it
only for CUDA caches.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

try:  # Triton >= 3.0
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - older Triton
    from triton.language.extra.cuda import libdevice  # type: ignore[no-redef]

from .slot_status import status_of
from .triton_launch import LAUNCHER_ENV, STATE, Launcher, Tail

__all__ = ["write_fp8_ds_mla", "read_fp8_ds_mla", "write_row", "read_row", "DEDUP_MAX", "LAUNCHER_ENV", "STATE"]

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
def _claim(slots, n, scratch, capacity, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    raw = tl.load(slots + rows, mask=rows < n, other=-1).to(tl.int64)
    ok = (rows < n) & (raw >= 0) & (raw < capacity)
    tl.atomic_max(scratch + tl.where(ok, raw, 0), rows.to(tl.int32), mask=ok, sem="relaxed")


@triton.jit
def _unclaim(slots, n, scratch, capacity, BLOCK: tl.constexpr):
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
    kv, kv_stride, slots, n, scratch, status, cache_u8, cache_f8, cache_bf16, capacity, block_size, page_bytes,
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
    out, slots, n, status, cache_u8, cache_f8, cache_bf16, capacity, block_size, page_bytes,
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
    kv, kv_stride, slots, n, scratch, status, rows_out, capacity, scale,
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
def _read_row_kernel(out, slots, n, status, rows_in, capacity, scale, FP8: tl.constexpr, SCALED: tl.constexpr,
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


# The per-call arguments (the head) of each kernel; the rest but the constexprs is a cache's Tail.
_write_ds = Launcher(_write_fp8_ds_mla_kernel, head=4)
_read_ds = Launcher(_read_fp8_ds_mla_kernel, head=3)
_write_rows = Launcher(_write_row_kernel, head=4)
_read_rows = Launcher(_read_row_kernel, head=3)
_claims = Launcher(_claim, head=2)
_unclaims = Launcher(_unclaim, head=2)


# -- host side ----------------------------------------------------------------
class _CacheArgs:
    """What the kernels take from one cache tensor, made once per tensor: its flat views (fp8_ds_mla:
    uint8, float8 and bf16 views of the same bytes), capacity, and the launch tails (the tensor's
    pointers as ints) per check / election / scale; the last-row scratch array when a large write
    needs one (4 bytes per token, all -1 between calls: the write's winners put -1 back)."""

    __slots__ = ("cache", "ptr", "shape", "pages", "capacity", "index", "device", "tails", "scratch", "bound")

    def __init__(self, cache: torch.Tensor, capacity: int) -> None:
        self.cache, self.ptr, self.shape = cache, cache.data_ptr(), cache.shape
        flat = cache.view(-1)
        self.pages = (flat, flat.view(torch.float8_e4m3fn), flat.view(torch.bfloat16)) if cache.dim() == 2 \
            else (cache,)
        self.capacity, self.index, self.device = capacity, cache.get_device(), cache.device
        self.tails: dict[Any, Tail] = {}
        self.scratch: "torch.Tensor | None" = None
        self.bound: dict[Any, Any] = {}  # _reader / _writer closures, per constants

    def tail(self, key: Any, *rest: Any, check: bool, scratch: "bool | None") -> Tail:
        """The Tail ``([scratch,] status, *pages, capacity, *rest)``: a write's (``scratch`` not None) has the
        claim array first (True) or a stand-in (False: unused, like the status when not ``check``)."""
        tail = self.tails.get(key)
        if tail is None:
            status = status_of(self.index) if check else self.pages[0]
            head = () if scratch is None else (self.claim_array() if scratch else self.pages[0],)
            tail = self.tails[key] = Tail(*head, status, *self.pages, self.capacity, *rest)
        return tail

    def claim_tail(self) -> Tail:
        """The Tail ``(claim array, capacity)`` of the claim / unclaim kernels."""
        tail = self.tails.get("claim")
        if tail is None:
            tail = self.tails["claim"] = Tail(self.claim_array(), self.capacity)
        return tail

    def claim_array(self) -> torch.Tensor:
        if self.scratch is None:
            self.scratch = torch.full((self.capacity,), -1, dtype=torch.int32, device=self.device)
        return self.scratch


_caches: dict[int, _CacheArgs] = {}


def _args(cache: torch.Tensor, capacity: int) -> _CacheArgs:
    """The cache's :class:`_CacheArgs` (kept by identity: the entry holds the tensor, so its id stays its
    own; re-made when the tensor was re-pointed or reshaped)."""
    hit = _caches.get(id(cache))
    if hit is not None and hit.ptr == cache.data_ptr() and hit.shape == cache.shape:
        return hit
    if len(_caches) >= 64:
        _caches.clear()
    hit = _caches[id(cache)] = _CacheArgs(cache, capacity)
    return hit


def _write(launcher: Launcher, tokens: int, warps: int, c: _CacheArgs, kv: torch.Tensor, slots: torch.Tensor,
           unique: bool, check: bool, rest: tuple, flags: tuple) -> None:
    """One write: elect the last row per slot (in the kernel for <= DEDUP_MAX rows, else through the
    cache's claim array: claim, write, unclaim), then launch ``launcher`` over ``kv``'s rows."""
    n = kv.shape[0]
    if kv.stride(1) != 1:
        kv = kv.contiguous()
    if unique:
        elect, dedup_n = 0, 1
    elif n <= DEDUP_MAX:
        elect, dedup_n = 1, max(16, 1 << (n - 1).bit_length())
    else:
        elect, dedup_n = 2, 1
    key = (launcher, check, elect == 2, rest)
    tail = c.tails.get(key) or c.tail(key, *rest, check=check, scratch=elect == 2)
    claim_tail = c.claim_tail() if elect == 2 else None
    if claim_tail is not None:
        _claims(-(-n // _CLAIM_BLOCK), 4, (slots, n), claim_tail, (_CLAIM_BLOCK,))
    launcher(-(-n // tokens), warps, (kv, kv.stride(0), slots, n), tail, (*flags, check, elect, dedup_n, tokens))
    if claim_tail is not None:
        _unclaims(-(-n // _CLAIM_BLOCK), 4, (slots, n), claim_tail, (_CLAIM_BLOCK,))


def write_fp8_ds_mla(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, block_size: int,
                     unique: bool = False, check: bool = True) -> None:
    """Quantize ``kv`` ``[n, 512]`` into fp8_ds_mla pages ``cache`` (uint8 ``[num_blocks, page_bytes]``)."""
    c = _args(cache, cache.shape[0] * block_size)
    key = ("w", check, unique, block_size, _DSMLA_WRITE)
    write = c.bound.get(key)
    if write is None:
        tokens, warps = _DSMLA_WRITE
        write = c.bound[key] = _writer(_write_ds, tokens, warps, c, unique, check, (block_size, cache.shape[1]), ())
    write(kv, slots)


def read_fp8_ds_mla(cache: torch.Tensor, slots: torch.Tensor, block_size: int, check: bool = True) -> torch.Tensor:
    """Dequantize the fp8_ds_mla rows at ``slots`` to bf16 ``[n, 512]``."""
    c = _args(cache, cache.shape[0] * block_size)
    key = ("r", check, block_size, _DSMLA_READ)
    read = c.bound.get(key)
    if read is None:
        read = c.bound[key] = _reader(_read_ds, _DSMLA_READ, c, check, (block_size, cache.shape[1]), ())
    return read(slots)


def write_row(cache: torch.Tensor, kv: torch.Tensor, slots: torch.Tensor, scale: float | None,
              unique: bool = False, check: bool = True) -> None:
    """Store ``kv`` into a row cache ``[num_blocks, block_size, 512]`` (bf16, or float8 when ``scale`` is given)."""
    c = _args(cache, cache.shape[0] * cache.shape[1])
    key = ("w", check, unique, scale, _WRITE_TOKENS, _WRITE_WARPS)
    write = c.bound.get(key)
    if write is None:
        write = c.bound[key] = _writer(_write_rows, _WRITE_TOKENS, _WRITE_WARPS, c, unique, check,
                                       (float(scale or 1.0),), _row_flags(scale))
    write(kv, slots)


def read_row(cache: torch.Tensor, slots: torch.Tensor, scale: float | None, check: bool = True) -> torch.Tensor:
    """Rows at ``slots`` of a row cache as bf16 ``[n, 512]`` (dequantized with ``scale`` when float8)."""
    c = _args(cache, cache.shape[0] * cache.shape[1])
    key = ("r", check, scale, _READ_TOKENS, _READ_WARPS)
    read = c.bound.get(key)
    if read is None:
        read = c.bound[key] = _reader(_read_rows, (_READ_TOKENS, _READ_WARPS), c, check, (float(scale or 1.0),),
                                      _row_flags(scale))
    return read(slots)


def _row_flags(scale: "float | None") -> tuple[bool, bool]:
    """The row kernels' FP8 and SCALED constexprs."""
    return (scale is not None, scale is not None and float(scale) != 1.0)


#: Reads of at most this many rows allocate their output as ``torch.empty_like`` of a kept tensor of
#: that shape (1 KiB per row, at most :data:`_PROTOS_KEPT` per device): about half the host time
#: of ``torch.empty``, which parses a size, a dtype and a device on every call.
_PROTO_ROWS = 512
_PROTOS_KEPT = 16
_protos: dict[int, dict[int, torch.Tensor]] = {}  # device index -> rows -> kept tensor


def _new_rows(protos: dict, n: int, device: Any) -> torch.Tensor:
    """A new bf16 ``[n, 512]`` on ``device``; keeps a tensor of that shape in ``protos`` for the next."""
    if n > _PROTO_ROWS:
        return torch.empty((n, 512), dtype=torch.bfloat16, device=device)
    if len(protos) >= _PROTOS_KEPT:
        protos.clear()
    proto = protos[n] = torch.empty((n, 512), dtype=torch.bfloat16, device=device)
    return torch.empty_like(proto)


# A decode step reads and writes a few dozen rows per layer, so host time is the whole cost: the
# per-cache constants (tail, constexprs, launch configuration) are bound once into a closure.
def _reader(launcher: Launcher, config: tuple[int, int], c: _CacheArgs, check: bool, rest: tuple,
            flags: tuple) -> Any:
    """``read(slots)``: the rows at ``slots`` into a new bf16 ``[n, 512]``."""
    tokens, warps = config
    tail = c.tail((launcher, check, rest), *rest, check=check, scratch=None)
    consts = (*flags, check, tokens)
    protos, device, empty_like = _protos.setdefault(c.index, {}), c.device, torch.empty_like

    def read(slots: torch.Tensor) -> torch.Tensor:
        n = slots.shape[0]
        proto = protos.get(n)
        out = empty_like(proto) if proto is not None else _new_rows(protos, n, device)
        if n:
            launcher(-(-n // tokens), warps, (out, slots, n), tail, consts)
        return out

    return read


def _writer(launcher: Launcher, tokens: int, warps: int, c: _CacheArgs, unique: bool, check: bool, rest: tuple,
            flags: tuple) -> Any:
    """``write(kv, slots)``: one launch for unique slots or up to :data:`DEDUP_MAX` rows (the last row per
    slot elected in the kernel); larger elections and non-unit column strides go through :func:`_write`."""
    tail = c.tail((launcher, check, False, rest), *rest, check=check, scratch=False)
    elect = 0 if unique else 1

    def write(kv: torch.Tensor, slots: torch.Tensor) -> None:
        n = kv.shape[0]
        if not n:
            return
        if n > DEDUP_MAX and not unique or kv.stride(1) != 1:
            _write(launcher, tokens, warps, c, kv, slots, unique, check, rest, flags)
            return
        dedup_n = 1 if unique else max(16, 1 << (n - 1).bit_length())
        launcher(-(-n // tokens), warps, (kv, kv.stride(0), slots, n), tail, (*flags, check, elect, dedup_n, tokens))

    return write
