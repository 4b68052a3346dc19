"""What the three codecs of :mod:`dsv4sel.kernels.layouts` share around their byte formats:
the argument checks (made cheap for a decode step's few-token calls: a cache is validated
once and remembered), the choice between the fused Triton kernels and the torch ops, the
slot range check, and the torch ops' last-writer election.

The slot range check (``check=True``, the default): on the CPU a slot past the cache is a
ValueError raised in the call; on a CUDA device it is recorded in the device's slot status
(:mod:`dsv4sel.kernels.slot_status`) by the kernels themselves, with no host sync, and the
slot is skipped (write) or read as zeros; :func:`~dsv4sel.kernels.slot_status.raise_slot_errors`
reports it. ``check=False`` skips such slots without recording them.

This module imports torch only inside its functions.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NamedTuple

from .platform import require_torch
from .record import HEAD_DIM

if TYPE_CHECKING:  # pragma: no cover
    import torch

BACKENDS = frozenset({"auto", "torch", "triton"})
#: Set to 1 to keep the torch codecs on CUDA too.
TORCH_CODECS_ENV = "DSV4SEL_TORCH_CODECS"
_fused_checked: dict[Any, "str | None"] = {}


def fused_unavailable(device: Any) -> "str | None":
    """Why the Triton codecs cannot run on ``device`` (None if they can); decided once per device
    (``$DSV4SEL_TORCH_CODECS`` included: set it before the first codec call on a device)."""
    if device.type != "cuda":
        return f"the fused codecs run on CUDA devices, this cache is on {device.type}"
    key = (device.type, device.index)
    if key not in _fused_checked:
        _fused_checked[key] = _why_not_fused(device)
    return _fused_checked[key]


def _why_not_fused(device: Any) -> "str | None":
    if os.environ.get(TORCH_CODECS_ENV, "").strip() not in ("", "0"):
        return f"${TORCH_CODECS_ENV} is set"
    torch = require_torch()
    if getattr(torch.version, "hip", None):
        return "the fused codecs target NVIDIA GPUs (ROCm fp8 is another format on gfx942)"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (8, 9):
        return f"the fused codecs need SM89 or newer for float8 conversion, this GPU is {major}.{minor}"
    try:
        from . import triton_codecs  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - Triton missing or broken: its import can raise anything
        return f"triton is not importable ({type(exc).__name__}: {exc})"
    return None


def fused_module(device: Any, backend: str) -> Any:
    """The Triton codec module when ``backend`` and ``device`` call for it, else None."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {backend!r}")
    if backend == "torch":
        return None
    why = fused_unavailable(device)
    if why is None:
        from . import triton_codecs

        return triton_codecs
    if backend == "triton":
        raise ValueError(f"backend='triton' cannot run here: {why}")
    return None


class CacheInfo(NamedTuple):
    """A validated cache: its block size, capacity in tokens, device, device index (-1: CPU), and the
    fused codec module that ``backend="auto"`` runs on it (None: the torch ops)."""

    block_size: int
    capacity: int
    device: Any
    device_index: int
    fused: Any


_infos: dict[int, tuple] = {}
_torch: Any = None  # torch, its Tensor class and the dtypes the checks compare with, once imported
_tensor: Any = None
_slot_dtypes: Any = ()
_kernel_dtypes: Any = ()


def _load_torch() -> None:
    global _torch, _tensor, _slot_dtypes, _kernel_dtypes
    torch = require_torch()
    _tensor, _slot_dtypes = torch.Tensor, (torch.int64, torch.int32)
    _kernel_dtypes = frozenset({torch.bfloat16, torch.float16, torch.float32})
    _torch = torch


def cache_info(layout: Any, cache: "torch.Tensor") -> CacheInfo:
    """``layout.block_size_of(cache)`` and the rest of :class:`CacheInfo`, validated once per cache tensor.

    The memo is keyed on the tensor's identity (it holds the tensor, so the id stays its own) and
    re-validates when the tensor's data pointer, shape, strides or dtype changed, or for another layout."""
    hit = _infos.get(id(cache))
    if hit is not None and hit[1] is layout and hit[2] == cache.data_ptr() and hit[3] == cache.shape \
            and hit[4] == cache.stride() and hit[5] is cache.dtype:
        return hit[6]
    if _torch is None:
        _load_torch()
    block_size = layout.block_size_of(cache)
    capacity = cache.shape[0] * block_size
    info = CacheInfo(block_size, capacity, cache.device, cache.get_device(), fused_module(cache.device, "auto"))
    if len(_infos) >= 256:
        _infos.clear()
    _infos[id(cache)] = (cache, layout, cache.data_ptr(), cache.shape, cache.stride(), cache.dtype, info)
    return info


def check_kv(kv: "torch.Tensor", info: CacheInfo) -> int:
    """``kv`` is a floating ``[n, 512]`` tensor on the cache's device; returns n (after :func:`cache_info`)."""
    shape = kv.shape if isinstance(kv, _tensor) else None
    if shape is None or len(shape) != 2 or shape[1] != HEAD_DIM:
        raise ValueError(f"kv must be a [n, {HEAD_DIM}] tensor, got {tuple(shape or ()) or type(kv).__name__}")
    if not kv.is_floating_point():
        raise ValueError(f"kv must be floating point, got {kv.dtype}")
    if kv.get_device() != info.device_index:
        raise ValueError(f"kv is on {kv.device}, the cache on {info.device}")
    return shape[0]


def check_slots(slots: "torch.Tensor", n: "int | None", info: CacheInfo, check: bool) -> None:
    """Dtype, shape and device of ``slots``; on the CPU with ``check``, the range (a ValueError now)."""
    if not isinstance(slots, _tensor) or slots.dtype not in _slot_dtypes:
        raise ValueError("slots must be an int64 (or int32) tensor")
    shape = slots.shape
    if len(shape) != 1 or (n is not None and shape[0] != n):
        raise ValueError(f"slots must have shape [{'n' if n is None else n}], got {tuple(shape)}")
    if slots.get_device() != info.device_index:
        raise ValueError(f"slots are on {slots.device}, the cache on {info.device}")
    if check and info.device_index < 0 and shape[0]:
        hi = int(slots.max())  # the CPU: no device to wait for
        if hi >= info.capacity:
            raise ValueError(f"slots must be below {info.capacity} for this cache (negative = skip), got {hi}")


def record_range(slots: "torch.Tensor", info: CacheInfo, check: bool) -> None:
    """The torch ops' check on a CUDA cache: record slots past it in the device's status, no sync."""
    if check and info.device_index >= 0 and slots.shape[0]:
        from .slot_status import record_torch, status_of

        record_torch(status_of(info.device_index), slots, info.capacity)


def kernel_dtype_ok(kv: "torch.Tensor") -> bool:
    """The fused kernels take bf16, fp16 and fp32 rows (others: the torch ops)."""
    return kv.dtype in _kernel_dtypes


def last_writers(slots: "torch.Tensor", capacity: int) -> "torch.Tensor":
    """Indices of the rows to store: valid slot, and the last row naming it."""
    torch = require_torch()
    key = torch.where((slots >= 0) & (slots < capacity), slots, torch.full_like(slots, -1))
    order = torch.argsort(key, stable=True)  # equal slots keep their order: the last is the winner
    sorted_key = key[order]
    last = torch.ones_like(sorted_key, dtype=torch.bool)
    last[:-1] = sorted_key[1:] != sorted_key[:-1]
    return order[last & (sorted_key >= 0)]


def div(x: "torch.Tensor", divisor: float) -> "torch.Tensor":
    """``x / divisor`` as IEEE float32 division on every device.

    torch's CUDA kernels turn division by a Python scalar into multiplication
    by its reciprocal, which can round differently; a same-device tensor divisor
    keeps the true quotient the layout is defined by (and the Triton kernels compute).
    """
    torch = require_torch()
    return torch.div(x, torch.tensor(divisor, dtype=x.dtype, device=x.device))
