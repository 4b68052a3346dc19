"""The padded-head copy of FlashMLA's ``run`` as one small Triton kernel (CUDA only).

FlashMLA decodes 64 or 128 query heads; a plan for fewer keeps a zeroed ``[b, s_q, h_pad, 512]``
buffer, and ``run`` copies the caller's ``q`` into its live heads. torch's ``copy_`` into that
strided view is a general elementwise launch whose host setup and in-graph latency are a large
part of a small decode; this kernel moves each 1 KiB head row with one program, launched through
:class:`~dsv4sel.kernels.triton_launch.Launcher` (pointers as ints, the plan's buffer resolved
once). bf16 ``q`` with a contiguous last dimension only; the caller falls back to ``copy_``
otherwise. Exact: bytes are copied, not converted.

Importing this module imports triton and torch.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import triton
import triton.language as tl

from .triton_launch import Launcher, Tail

__all__ = ["bind_copy", "copy_heads"]


@triton.jit
def _copy_heads_kernel(q, s_stride, h_stride, heads, out, h_pad, COLS: tl.constexpr):
    """Program ``r`` copies head row ``r`` (token ``r // heads``, head ``r % heads``) of ``q`` (token rows
    ``s_stride`` apart: q's batch and sequence dimensions flattened) into ``out``'s padded rows."""
    r = tl.program_id(0).to(tl.int64)
    token = r // heads
    head = r - token * heads
    cols = tl.arange(0, COLS)
    row = tl.load(q + token * s_stride + head * h_stride + cols)
    tl.store(out + (token * h_pad + head) * COLS + cols, row)


_copy = Launcher(_copy_heads_kernel, head=4)
_tails: dict[int, tuple[Any, Tail]] = {}


def _tail(buf: torch.Tensor) -> Tail:
    """The copy's tail for ``buf`` (its pointer and head count), made once per buffer."""
    hit = _tails.get(id(buf))
    if hit is None or hit[0] is not buf:
        if len(_tails) >= 64:
            _tails.clear()
        hit = _tails[id(buf)] = (buf, Tail(buf, buf.shape[2]))
    return hit[1]


def bind_copy(q: torch.Tensor, buf: torch.Tensor) -> "Callable[[int], bool] | None":
    """The copy of a contiguous bf16 tensor shaped like ``q`` into ``buf``'s live heads, bound once:
    ``launch(q.data_ptr())`` (see :meth:`~dsv4sel.kernels.triton_launch.Launcher.bind`; False: nothing
    launched, copy with :func:`copy_heads`). ``q`` (contiguous bf16, on ``buf``'s device) is copied twice
    now, so it must hold what ``buf``'s live heads may hold (zeros, for a plan's fresh buffer)."""
    b, s, h, cols = q.shape
    return _copy.bind(b * s * h, 2, (q, q.stride(1), q.stride(2), h), _tail(buf), (cols,))


def copy_heads(q: torch.Tensor, buf: torch.Tensor) -> bool:
    """Copy bf16 ``q`` ``[b, s, h, 512]`` into the first ``h`` heads of ``buf`` ``[b, s, h_pad, 512]``
    (contiguous, bf16); False (nothing done) when ``q``'s strides do not let its token rows be
    addressed as one stride (then the caller copies with torch)."""
    b, s, h, cols = q.shape
    sb, ss, sh, sc = q.stride()
    if sc != 1 or (b > 1 and sb != s * ss):
        return False
    _copy(b * s * h, 2, (q, ss, sh, h), _tail(buf), (cols,))  # 2 warps: 64 threads x 16 bytes = one row
    return True
