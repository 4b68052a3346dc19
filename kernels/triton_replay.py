"""The two copies around a replayed decode graph, one Triton launch each (CUDA only).

An eager ``run`` that replays a graph captured once (:mod:`~dsv4sel.kernels.flashmla_replay`) must put
the caller's tensors where the graph reads them and take the results out of where it wrote them:

* :func:`stage` copies ``q`` into the plan's (padded) query buffer, and ``indices`` and
  ``extra_indices`` into the plan's index buffers: one launch for the three;
* :func:`unstage` copies the graph's ``out`` ``[b, s, h_pad, 512]`` and ``lse`` ``[b, h_pad, s]``
  into fresh ``[b, s, h, 512]`` and ``[b, s, h]`` tensors (the live heads, lse transposed): one launch.

Both move bytes (no conversion): the results are the direct call's bit for bit. Launched through
:class:`~dsv4sel.kernels.triton_launch.Launcher` with the plan's buffers as the tail, bound once per
plan (:meth:`~dsv4sel.kernels.triton_launch.Launcher.bind`), the caller's pointers given per call.

Importing this module imports triton and torch.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from .triton_launch import Launcher, Tail

__all__ = ["bind_stage", "bind_unstage"]

_BLOCK = 512  # index entries (or lse values) per program


@triton.jit
def _stage_kernel(q, idx, eidx, q_token_stride, q_head_stride, heads, q_rows, n_idx, n_eidx,
                  q_dst, h_pad, idx_dst, eidx_dst, COLS: tl.constexpr, BLOCK: tl.constexpr):
    """Programs ``[0, q_rows)`` copy one head row of ``q`` each into its padded row; the next
    ``cdiv(n_idx, BLOCK)`` copy ``idx`` in blocks, the rest ``eidx``."""
    pid = tl.program_id(0).to(tl.int64)
    if pid < q_rows:
        token = pid // heads
        head = pid - token * heads
        cols = tl.arange(0, COLS)
        row = tl.load(q + token * q_token_stride + head * q_head_stride + cols)
        tl.store(q_dst + (token * h_pad + head) * COLS + cols, row)
    else:
        j = pid - q_rows
        idx_blocks = tl.cdiv(n_idx, BLOCK)
        if j < idx_blocks:
            offs = j * BLOCK + tl.arange(0, BLOCK)
            live = offs < n_idx
            tl.store(idx_dst + offs, tl.load(idx + offs, mask=live), mask=live)
        else:
            offs = (j - idx_blocks) * BLOCK + tl.arange(0, BLOCK)
            live = offs < n_eidx
            tl.store(eidx_dst + offs, tl.load(eidx + offs, mask=live), mask=live)


@triton.jit
def _unstage_kernel(out, lse, rows, heads, out_src, lse_src, h_pad, s_q, COLS: tl.constexpr, BLOCK: tl.constexpr):
    """Programs ``[0, rows)`` copy one live head row of ``out_src`` each; the rest gather ``lse``
    (``[b, s, h]`` from ``lse_src`` ``[b, h_pad, s]``) in blocks."""
    pid = tl.program_id(0).to(tl.int64)
    if pid < rows:
        token = pid // heads
        head = pid - token * heads
        cols = tl.arange(0, COLS)
        tl.store(out + pid * COLS + cols, tl.load(out_src + (token * h_pad + head) * COLS + cols))
    else:
        offs = (pid - rows) * BLOCK + tl.arange(0, BLOCK)
        live = offs < rows
        # vectors here: names of their own (Triton types a name once across an if / else)
        tokens = offs // heads
        heads_at = offs - tokens * heads
        batch_at = tokens // s_q
        query_at = tokens - batch_at * s_q
        tl.store(lse + offs, tl.load(lse_src + (batch_at * h_pad + heads_at) * s_q + query_at, mask=live), mask=live)


_stage = Launcher(_stage_kernel, head=9)
_unstage = Launcher(_unstage_kernel, head=4)


def bind_stage(q: torch.Tensor, indices: torch.Tensor, extra_indices: "torch.Tensor | None", q_dst: torch.Tensor,
               idx_dst: torch.Tensor, eidx_dst: "torch.Tensor | None") -> "Callable[[int, int, int], bool] | None":
    """``stage(q_ptr, indices_ptr, extra_indices_ptr)``: one launch copying tensors shaped and strided like
    ``q`` (bf16 ``[b, s, h, 512]``, token rows one stride apart), ``indices`` and ``extra_indices``
    (contiguous int32) into ``q_dst``'s live heads, ``idx_dst`` and ``eidx_dst``. False: nothing launched.
    None where the direct launch is off. The examples are launched twice now (Triton compiles), so they
    must be harmless to copy (the plan's own buffers are)."""
    b, s, h, cols = q.shape
    eidx = indices if extra_indices is None else extra_indices
    n_eidx = 0 if extra_indices is None else extra_indices.numel()
    head = (q, indices, eidx, q.stride(1), q.stride(2), h, b * s * h, indices.numel(), n_eidx)
    tail = Tail(q_dst, q_dst.shape[2], idx_dst, idx_dst if eidx_dst is None else eidx_dst)
    grid = b * s * h + triton.cdiv(indices.numel(), _BLOCK) + triton.cdiv(n_eidx, _BLOCK)
    return _stage.bind(grid, 2, head, tail, (cols, _BLOCK), 3)


def bind_unstage(out_src: torch.Tensor, lse_src: torch.Tensor, heads: int) -> "Callable[[int, int], bool] | None":
    """``unstage(out_ptr, lse_ptr)``: one launch copying ``out_src``'s first ``heads`` heads into a fresh
    contiguous ``[b, s, heads, 512]`` bf16 tensor and ``lse_src`` ``[b, h_pad, s]`` into a fresh ``[b, s,
    heads]`` float32 one. False: nothing launched. None where the direct launch is off."""
    b, s, h_pad, cols = out_src.shape
    rows = b * s * heads
    out = torch.empty((b, s, heads, cols), dtype=out_src.dtype, device=out_src.device)
    lse = torch.empty((b, s, heads), dtype=lse_src.dtype, device=lse_src.device)
    tail = Tail(out_src, lse_src, h_pad, s)
    return _unstage.bind(rows + triton.cdiv(rows, _BLOCK), 2, (out, lse, rows, heads), tail, (cols, _BLOCK), 2)
