"""The codecs' slot range check without a host sync: a status word per CUDA device.

``layout.write`` / ``layout.read`` with ``check=True`` (the default) on a CUDA
cache do not wait for the GPU to learn whether a slot is past the cache: the
kernels skip such a slot (a write stores nothing, a read returns zeros) and
record it in this device's status, three int64 values on the device: how many
slots were past their cache, the largest of them, and the smallest capacity of
a cache they were written to or read from. No host sync, so the default call is
as fast as ``check=False`` and can be captured in a CUDA graph (a replay records
too).

The caller reads the status when it synchronizes anyway (at the end of a step,
in a test): :func:`raise_slot_errors` raises :class:`SlotRangeError` (a
ValueError) when any slot was past its cache since the last check and clears the
status; :func:`slot_errors` returns the counts without raising. Both sync with
the device once. On the CPU there is nothing to save: ``check=True`` raises at
once, in the call.

This module imports torch only inside its functions.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple

__all__ = ["SlotErrors", "SlotRangeError", "raise_slot_errors", "slot_errors", "status_of"]

_NO_CAPACITY = 1 << 62  # the "smallest capacity" of a status that recorded nothing
_lock = threading.Lock()
_status: dict[int, Any] = {}


class SlotErrors(NamedTuple):
    """What the status recorded since the last check: ``count`` slots past their cache,
    the ``largest`` of them, and the smallest ``capacity`` (tokens) of a cache involved."""

    # A tuple (callers compare it with one), whose first field is named as the API names it, shadowing
    # tuple.count: that is the one thing mypy objects to here.
    count: int  # type: ignore[assignment]
    largest: int
    capacity: int

    def message(self, device: Any) -> str:
        return (
            f"slots must be below {self.capacity} for this cache (negative = skip): {self.count} slot(s) at or "
            f"past the end of their cache were skipped on {device} since the last check, the largest {self.largest}"
        )


class SlotRangeError(ValueError):
    """Slots past the cache were skipped by earlier unsynchronized writes or reads; ``errors`` says which."""

    def __init__(self, errors: SlotErrors, device: Any) -> None:
        self.errors = errors
        super().__init__(errors.message(device))


def _index(device: Any) -> int:
    import torch

    device = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    if device.type != "cuda":
        raise ValueError(f"the slot status lives on CUDA devices; got {device}")
    return torch.cuda.current_device() if device.index is None else device.index


def status_of(device: Any) -> Any:
    """The int64 ``[3]`` status tensor of ``device`` (a CUDA device or its index: count, largest
    slot, smallest capacity), made once; the first eager checked call makes it, so a CUDA graph
    captured later only reads its address."""
    status = _status.get(device) if device.__class__ is int else None
    if status is not None:
        return status
    index = device if device.__class__ is int else _index(device)
    status = _status.get(index)
    if status is None:
        import torch

        with _lock:
            status = _status.get(index)
            if status is None:
                status = torch.tensor([0, -1, _NO_CAPACITY], dtype=torch.int64, device=f"cuda:{index}")
                _status[index] = status
    return status


def record_torch(status: Any, slots: Any, capacity: int) -> None:
    """The torch codecs' check on a CUDA cache: record slots ``>= capacity`` in ``status``, no sync."""
    import torch

    bad = slots >= capacity
    status[0] += bad.sum()
    status[1] = torch.maximum(status[1], torch.where(bad, slots.long(), -1).max())
    status[2] = torch.where(bad.any(), torch.clamp_max(status[2], capacity), status[2])


def slot_errors(device: Any = None, *, clear: bool = True) -> SlotErrors:
    """What ``device``'s status recorded since the last check (one sync); cleared unless ``clear=False``.

    ``device``: a CUDA device (default: the current one)."""
    index = _index(device)
    status = _status.get(index)
    if status is None:
        return SlotErrors(0, -1, _NO_CAPACITY)
    count, largest, capacity = status.tolist()
    if clear and count:
        status.copy_(status.new_tensor([0, -1, _NO_CAPACITY]))
    return SlotErrors(count, largest, capacity)


def raise_slot_errors(device: Any = None) -> None:
    """Raise :class:`SlotRangeError` if a checked write or read on ``device`` skipped a slot past its
    cache since the last check (then cleared); one sync. ``device`` default: the current CUDA device."""
    errors = slot_errors(device)
    if errors.count:
        raise SlotRangeError(errors, f"cuda:{_index(device)}")
