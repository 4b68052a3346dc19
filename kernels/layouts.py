"""DeepSeek-V4 / V4.1 KV-cache layouts: the single source of truth for sizes.

Five layouts, by name (see ``docs/kernels.md`` for byte diagrams). Three are
byte-exact codecs:

``fp8_ds_mla`` (584 B/token, uint8 pages; FlashMLA calls it "MODEL1")
    A page of ``block_size`` tokens is block-major: first ``block_size x 576``
    bytes of token data (448 fp8-e4m3 NoPE values, then 64 bf16 RoPE values),
    then ``block_size x 8`` scale bytes (7 UE8M0 exponents, one per 64-wide
    NoPE tile, then one zero pad byte), then zero padding up to a multiple of
    576 bytes. Tile scale = ``2**ceil(log2(max(amax / 448, 1e-4)))``, stored as
    exponent + 127.
``bf16_row`` (1024 B/token)
    One contiguous row of 512 bfloat16 values per token.
``fp8_e4m3_row`` (512 B/token)
    One row of 512 float8_e4m3fn values per token, ``value / scale``; the
    per-tensor ``scale`` (default 1.0) is kept outside the cache, on the layout.

Two are DeepSeek-V4.1 records known by size only (:class:`OpaqueRecordLayout`,
``has_codec`` False): their byte encodings are written by the serving
engine's V4.1 kernels and are not verified here, so ``write`` and ``read``
raise :class:`UnsupportedLayoutError`:

``fp8_ds_mla_v41`` (528 B/token, uint8 pages of exactly ``block_size x 528``)
    V4.1's fp8 main / sliding-window record.
``nvfp4_ds_mla`` (288 B/token, uint8 pages of exactly ``block_size x 288``)
    V4.1's NVFP4 compressed-cache record (FlashMLA mega-attention).

Sizes (``bytes_per_token``, ``torch_dtype_name``, ``alignment``,
``page_bytes``) are plain ints and strings: reading them never imports torch.
The tensor methods (``allocate``, ``write``, ``read``, ``kernel_view``) import
torch on first use.

Slots address tokens as ``block * block_size + offset``. In the codecs'
``write`` a negative slot (vLLM pads slot mappings with -1) is skipped, and
with duplicate slots the row given last wins, whole; ``read`` returns a zero
row for a negative slot. A slot ``>= num_blocks * block_size`` is skipped /
read as zeros; with ``check=True`` (the default) it is also reported: on the
CPU as a ValueError raised in the call, on a CUDA device without a host sync,
through the device's slot status, which :func:`raise_slot_errors` turns into a
:class:`SlotRangeError` (a ValueError) when the caller checks it
(:mod:`dsv4sel.kernels.slot_status`). Every call on a CUDA cache is therefore
sync-free and can be captured in a CUDA graph; ``check=False`` only skips.

On an NVIDIA GPU (SM89 or newer) with Triton importable, ``write`` and ``read``
run fused Triton kernels (:mod:`dsv4sel.kernels.triton_codecs`), byte-exact
with the torch ops, which stay the path everywhere else and the reference:
``backend="torch"`` forces them, ``backend="triton"`` insists on the kernels,
and ``DSV4SEL_TORCH_CODECS=1`` (read once per device) turns the kernels off.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from . import torch_codecs
from .codec_support import (TORCH_CODECS_ENV, cache_info, check_kv, check_slots, div, fused_module,
                            fused_unavailable, kernel_dtype_ok, record_range)
from .errors import UnknownLayoutError, UnsupportedLayoutError
from .platform import require_torch
from .record import (FP8_E4M3_MAX, HEAD_DIM, NOPE_DIM, NUM_TILES, ROPE_DIM, SCALE_BYTES, TILE_SIZE,
                     TOKEN_DATA_BYTES, UE8M0_BIAS, UE8M0_SCALE_FLOOR)
from .slot_status import SlotErrors, SlotRangeError, raise_slot_errors, slot_errors

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "HEAD_DIM", "NOPE_DIM", "ROPE_DIM", "TILE_SIZE", "NUM_TILES", "FP8_E4M3_MAX", "UE8M0_SCALE_FLOOR", "UE8M0_BIAS",
    "KVCacheLayout", "Fp8DsMlaLayout", "Bf16RowLayout", "Fp8E4m3RowLayout", "OpaqueRecordLayout", "Fp8DsMlaV41Layout",
    "Nvfp4DsMlaLayout", "LAYOUTS", "get_layout", "resolve_layout", "TORCH_CODECS_ENV", "SlotErrors", "SlotRangeError",
    "raise_slot_errors", "slot_errors",
]


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _check_block_size(block_size: int) -> int:
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    return block_size


@dataclass(frozen=True)
class KVCacheLayout:
    """One KV-cache byte layout. Immutable; compare by value.

    Attributes:
        name: the layout id the rules use.
        bytes_per_token: content bytes per token (584, 1024, 512).
        torch_dtype_name: dtype of the cache tensor ``allocate`` returns, as the
            name of a ``torch`` attribute ("uint8", "bfloat16", "float8_e4m3fn").
        alignment: a page is padded to a multiple of this many bytes.
        has_codec: class-level; True when :meth:`write` and :meth:`read`
            encode and decode the bytes (False for :class:`OpaqueRecordLayout`).
    """

    name: str
    bytes_per_token: int
    torch_dtype_name: str
    alignment: int
    has_codec: ClassVar[bool] = True

    # -- sizes: no torch -------------------------------------------------
    def page_bytes(self, block_size: int) -> int:
        """Bytes of one page (block) of ``block_size`` tokens, padding included."""
        return _round_up(_check_block_size(block_size) * self.bytes_per_token, self.alignment)

    def cache_bytes(self, num_blocks: int, block_size: int) -> int:
        """Bytes of a cache of ``num_blocks`` pages."""
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ValueError(f"num_blocks must be a non-negative int, got {num_blocks!r}")
        return num_blocks * self.page_bytes(block_size)

    def kernel_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int]:
        """Shape of :meth:`kernel_view`: ``(num_blocks, block_size, per-token width)``.

        The width is bytes for uint8 layouts (584) and elements otherwise (512).
        """
        _check_block_size(block_size)
        return (num_blocks, block_size, self._kernel_width())

    def _kernel_width(self) -> int:
        return HEAD_DIM

    # -- tensors: torch, imported lazily ---------------------------------
    def torch_dtype(self) -> "torch.dtype":
        """The cache tensor's torch dtype."""
        return getattr(require_torch(), self.torch_dtype_name)

    def allocate(self, num_blocks: int, block_size: int, device: Any = "cpu") -> "torch.Tensor":
        """A zeroed cache whose storage is ``num_blocks`` pages back to back."""
        raise NotImplementedError  # pragma: no cover - every layout overrides

    def block_size_of(self, cache: "torch.Tensor") -> int:
        """The block size of a cache made by :meth:`allocate`; ValueError if not one."""
        raise NotImplementedError  # pragma: no cover

    def kernel_view(self, cache: "torch.Tensor") -> "torch.Tensor":
        """The ``(num_blocks, block_size, width)`` view kernels are handed (shares storage)."""
        raise NotImplementedError  # pragma: no cover

    def write(self, cache: "torch.Tensor", kv: "torch.Tensor", slots: "torch.Tensor", *, check: bool = True,
              unique: bool = False, backend: str = "auto") -> None:
        """Quantize ``kv`` ``[n, 512]`` and store row ``i`` at slot ``slots[i]`` (int64 or int32 ``[n]``).

        Negative slots are skipped; with duplicates the last row wins. A slot past
        the cache is skipped; ``check`` (default) also reports it: a ValueError now
        on the CPU, the device's slot status on CUDA (no sync; see
        :func:`raise_slot_errors`). ``unique=True`` promises no duplicate slots
        (the fused kernel then skips electing the last row). ``backend``: "auto",
        "torch" or "triton" (see the module docstring).
        """
        info = cache_info(self, cache)
        n = check_kv(kv, info)
        check_slots(slots, n, info, check)
        fused = info.fused if backend == "auto" else fused_module(info.device, backend)
        if not n:
            return
        if fused is not None and kernel_dtype_ok(kv):
            self._fused_write(fused, cache, kv, slots, info, unique, check)
            return
        record_range(slots, info, check)
        self._torch_write(cache, kv, slots, info)

    def read(self, cache: "torch.Tensor", slots: "torch.Tensor", *, check: bool = True,
             backend: str = "auto") -> "torch.Tensor":
        """Dequantize the rows at ``slots`` (int64 or int32 ``[n]``) to bf16 ``[n, 512]``; negative slots read zeros."""
        info = cache_info(self, cache)
        check_slots(slots, None, info, check)
        fused = info.fused if backend == "auto" else fused_module(info.device, backend)
        if fused is not None:
            return self._fused_read(fused, cache, slots, info, check)
        record_range(slots, info, check)
        return self._torch_read(cache, slots, info)

    # The codec of a layout, on either path: the fused kernels' module or torch_codecs.
    def _fused_write(self, fused: Any, cache: Any, kv: Any, slots: Any, info: Any, unique: bool, check: bool) -> None:
        raise NotImplementedError  # pragma: no cover - every codec layout overrides

    def _fused_read(self, fused: Any, cache: Any, slots: Any, info: Any, check: bool) -> Any:
        raise NotImplementedError  # pragma: no cover

    def _torch_write(self, cache: Any, kv: Any, slots: Any, info: Any) -> None:
        raise NotImplementedError  # pragma: no cover

    def _torch_read(self, cache: Any, slots: Any, info: Any) -> Any:
        raise NotImplementedError  # pragma: no cover

    # -- shared checks ---------------------------------------------------
    def _check_cache_dtype(self, cache: "torch.Tensor") -> None:
        if cache.dtype != self.torch_dtype():
            raise ValueError(f"{self.name} cache must have dtype {self.torch_dtype_name}, got {cache.dtype}")


# The names earlier releases exported from here.
_fused_unavailable = fused_unavailable
_div = div


@dataclass(frozen=True)
class _BytePagesLayout(KVCacheLayout):
    """Pages of raw bytes: cache uint8 ``[num_blocks, page_bytes]``.

    The kernel view is uint8 ``(num_blocks, block_size, bytes_per_token)``
    with strides ``(page_bytes, bytes_per_token, 1)``. Requires
    ``alignment <= bytes_per_token`` so that a page size names one block size.
    """

    def _kernel_width(self) -> int:
        return self.bytes_per_token

    def allocate(self, num_blocks: int, block_size: int, device: Any = "cpu") -> "torch.Tensor":
        torch = require_torch()
        self.cache_bytes(num_blocks, block_size)  # validates both
        return torch.zeros((num_blocks, self.page_bytes(block_size)), dtype=torch.uint8, device=device)

    def block_size_of(self, cache: "torch.Tensor") -> int:
        self._check_cache_dtype(cache)
        if cache.dim() != 2:
            raise ValueError(
                f"{self.name} cache must be [num_blocks, page_bytes] uint8, got shape {tuple(cache.shape)}"
            )
        page = cache.shape[1]
        # page_bytes - bytes_per_token * block_size is padding in [0, alignment - 1]
        # and alignment <= bytes_per_token, so the quotient is exact.
        block_size = page // self.bytes_per_token
        if block_size == 0 or self.page_bytes(block_size) != page:
            raise ValueError(f"{page} bytes is not a page size of the {self.name} layout")
        if cache.stride(1) != 1 or cache.stride(0) != page:
            raise ValueError(f"{self.name} cache pages must be contiguous")
        return block_size

    def kernel_view(self, cache: "torch.Tensor") -> "torch.Tensor":
        """uint8 ``(num_blocks, block_size, bytes_per_token)`` with strides ``(page_bytes, bytes_per_token, 1)``.

        Kernels use it for the page base pointer and page stride only; how
        they address bytes inside a page is the record format's business.
        """
        block_size = self.block_size_of(cache)
        num_blocks, page = cache.shape
        return cache.as_strided(
            (num_blocks, block_size, self.bytes_per_token),
            (page, self.bytes_per_token, 1),
            cache.storage_offset(),
        )


@dataclass(frozen=True)
class Fp8DsMlaLayout(_BytePagesLayout):
    """``fp8_ds_mla``: block-major fp8 NoPE + bf16 RoPE + UE8M0 tile scales.

    The cache tensor is uint8 ``[num_blocks, page_bytes]``. Byte offsets inside
    page ``p`` for the token at offset ``t``: data at ``t * 576`` (NoPE fp8 at
    ``+0..447``, RoPE bf16 at ``+448..575``), scales at
    ``block_size * 576 + t * 8`` (7 exponents, then a zero pad byte).
    The kernel view is uint8 ``(num_blocks, block_size, 584)``; inside a page
    kernels address data and scales block-major, not at ``t * 584``.
    """

    name: str = "fp8_ds_mla"
    bytes_per_token: int = TOKEN_DATA_BYTES + SCALE_BYTES  # 584
    torch_dtype_name: str = "uint8"
    alignment: int = TOKEN_DATA_BYTES  # 576

    def _fused_write(self, fused: Any, cache: Any, kv: Any, slots: Any, info: Any, unique: bool, check: bool) -> None:
        fused.write_fp8_ds_mla(cache, kv, slots, info.block_size, unique=unique, check=check)

    def _fused_read(self, fused: Any, cache: Any, slots: Any, info: Any, check: bool) -> Any:
        return fused.read_fp8_ds_mla(cache, slots, info.block_size, check=check)

    def _torch_write(self, cache: Any, kv: Any, slots: Any, info: Any) -> None:
        torch_codecs.write_fp8_ds_mla(cache, kv, slots, info)

    def _torch_read(self, cache: Any, slots: Any, info: Any) -> Any:
        return torch_codecs.read_fp8_ds_mla(cache, slots, info)


@dataclass(frozen=True)
class _RowLayout(KVCacheLayout):
    """A plain row per token: cache ``[num_blocks, block_size, 512]``."""

    def allocate(self, num_blocks: int, block_size: int, device: Any = "cpu") -> "torch.Tensor":
        torch = require_torch()
        self.cache_bytes(num_blocks, block_size)
        return torch.zeros((num_blocks, block_size, HEAD_DIM), dtype=self.torch_dtype(), device=device)

    def block_size_of(self, cache: "torch.Tensor") -> int:
        self._check_cache_dtype(cache)
        if cache.dim() != 3 or cache.shape[2] != HEAD_DIM:
            raise ValueError(
                f"{self.name} cache must be [num_blocks, block_size, {HEAD_DIM}], got {tuple(cache.shape)}"
            )
        if not cache.is_contiguous():
            raise ValueError(f"{self.name} cache must be contiguous")
        return int(cache.shape[1])

    def kernel_view(self, cache: "torch.Tensor") -> "torch.Tensor":
        self.block_size_of(cache)
        return cache

    def _fused_scale(self) -> "float | None":
        """The row codecs' scale: None for bf16 rows, the per-tensor scale for fp8 rows."""
        return None

    def _fused_write(self, fused: Any, cache: Any, kv: Any, slots: Any, info: Any, unique: bool, check: bool) -> None:
        fused.write_row(cache, kv, slots, self._fused_scale(), unique=unique, check=check)

    def _fused_read(self, fused: Any, cache: Any, slots: Any, info: Any, check: bool) -> Any:
        return fused.read_row(cache, slots, self._fused_scale(), check=check)

    def _torch_write(self, cache: Any, kv: Any, slots: Any, info: Any) -> None:
        torch_codecs.write_rows(cache, kv, slots, info, self._fused_scale())

    def _torch_read(self, cache: Any, slots: Any, info: Any) -> Any:
        return torch_codecs.read_rows(cache, slots, info, self._fused_scale())


@dataclass(frozen=True)
class Bf16RowLayout(_RowLayout):
    """``bf16_row``: 512 bfloat16 per token; lossless for bf16 input."""

    name: str = "bf16_row"
    bytes_per_token: int = 2 * HEAD_DIM
    torch_dtype_name: str = "bfloat16"
    alignment: int = HEAD_DIM


@dataclass(frozen=True)
class Fp8E4m3RowLayout(_RowLayout):
    """``fp8_e4m3_row``: 512 float8_e4m3fn per token, stored as ``value / scale``.

    ``scale`` is per tensor and lives here, not in the cache (vLLM keeps it in a
    layer buffer fixed at 1.0). Use :meth:`with_scale` for another value.
    """

    name: str = "fp8_e4m3_row"
    bytes_per_token: int = HEAD_DIM
    torch_dtype_name: str = "float8_e4m3fn"
    alignment: int = HEAD_DIM
    scale: float = 1.0

    def __post_init__(self) -> None:
        if not (isinstance(self.scale, (int, float)) and self.scale > 0 and self.scale != float("inf")):
            raise ValueError(f"fp8_e4m3_row scale must be a positive finite number, got {self.scale!r}")

    def with_scale(self, scale: float) -> "Fp8E4m3RowLayout":
        """The same layout with another per-tensor scale."""
        return dataclasses.replace(self, scale=float(scale))

    def _fused_scale(self) -> "float | None":
        return float(self.scale)


@dataclass(frozen=True)
class OpaqueRecordLayout(_BytePagesLayout):
    """A DeepSeek-V4.1 record whose size is known but whose bytes are not.

    Sizes, allocation and the kernel view work as for any uint8 page layout,
    so caches can be sized, allocated and handed to a kernel. The byte-level
    encoding is written by the serving engine's V4.1 kernels and is not part
    of dsv4sel's verified facts, so :meth:`write` and :meth:`read` raise
    :class:`UnsupportedLayoutError` instead of guessing a codec, and the torch
    reference decode cannot read these caches.

    Page padding is not documented either: ``alignment`` equals
    ``bytes_per_token``, i.e. a page is exactly ``block_size * bytes_per_token``
    bytes with no padding.
    """

    has_codec: ClassVar[bool] = False
    #: What the record is, for error messages.
    record: ClassVar[str] = "record"

    def write(self, cache: "torch.Tensor", kv: "torch.Tensor", slots: "torch.Tensor", **_: Any) -> None:
        """Always raises :class:`UnsupportedLayoutError`: no verified encoder."""
        raise UnsupportedLayoutError(self._no_codec("write"))

    def read(self, cache: "torch.Tensor", slots: "torch.Tensor", **_: Any) -> "torch.Tensor":
        """Always raises :class:`UnsupportedLayoutError`: no verified decoder."""
        raise UnsupportedLayoutError(self._no_codec("read"))

    def _no_codec(self, op: str) -> str:
        return (
            f"cannot {op} {self.name} rows: its {self.bytes_per_token}-byte {self.record} is written by "
            "the serving engine's DeepSeek-V4.1 kernels and dsv4sel has no verified codec for it "
            "(sizes, allocate and kernel_view work)"
        )


@dataclass(frozen=True)
class Fp8DsMlaV41Layout(OpaqueRecordLayout):
    """``fp8_ds_mla_v41``: DeepSeek-V4.1's fp8 main / sliding-window record, 528 B/token.

    vLLM 0.33's V4.1 layers store it for kv-cache dtype ``fp8_ds_mla`` on SM100 only
    (FlashMLA decodes it in its SM100 kernels); on SM90, SM12x and ROCm they keep V4's
    584-byte ``fp8_ds_mla`` record. Pages: ``block_size * 528`` bytes.
    """

    name: str = "fp8_ds_mla_v41"
    bytes_per_token: int = 528
    torch_dtype_name: str = "uint8"
    alignment: int = 528
    record: ClassVar[str] = "DeepSeek-V4.1 fp8 record"


@dataclass(frozen=True)
class Nvfp4DsMlaLayout(OpaqueRecordLayout):
    """``nvfp4_ds_mla``: DeepSeek-V4.1's NVFP4 compressed-cache record, 288 B/token.

    Read only by FlashMLA's V4.1 mega-attention on SM10x (vLLM's
    ``FLASHMLA_MEGA_ATTN_DSV41``). Pages: ``block_size * 288`` bytes.
    """

    name: str = "nvfp4_ds_mla"
    bytes_per_token: int = 288
    torch_dtype_name: str = "uint8"
    alignment: int = 288
    record: ClassVar[str] = "DeepSeek-V4.1 NVFP4 compressed-cache record"


LAYOUTS: Mapping[str, KVCacheLayout] = MappingProxyType(
    {
        layout.name: layout
        for layout in (
            Fp8DsMlaLayout(), Bf16RowLayout(), Fp8E4m3RowLayout(), Fp8DsMlaV41Layout(), Nvfp4DsMlaLayout(),
        )
    }
)
"""Every layout by name; read-only."""


def get_layout(name: str) -> KVCacheLayout:
    """The layout called ``name``; :class:`UnknownLayoutError` (a ValueError) lists valid names."""
    if isinstance(name, str) and name in LAYOUTS:
        return LAYOUTS[name]
    raise UnknownLayoutError(name, tuple(LAYOUTS))


def resolve_layout(layout: "KVCacheLayout | str") -> KVCacheLayout:
    """Accept a layout object or its name."""
    if isinstance(layout, KVCacheLayout):
        return layout
    return get_layout(layout)
