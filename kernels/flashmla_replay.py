"""FlashMLA's eager ``run`` as the replay of a CUDA graph captured once per plan and cache (CUDA only).

In eager mode FlashMLA's op is host-bound at decode sizes: the op call alone costs about 31 µs of
host time on an H200's host (argument boxing, allocations, its launches) against 14 µs of GPU time
at batch 4, and a padded-head plan adds a copy launch to that. Replaying the same op from a CUDA
graph costs one graph launch. :class:`EagerReplay` does that for a plan's eager ``run``:

* per plan, static inputs the graphs read: the padded query buffer (or, without padding, a staging
  buffer), an index buffer for ``indices`` and one for ``extra_indices``; one output buffer, which
  every graph of the plan writes as the op's ``out``;
* per (window cache, extra cache, sink) one graph, captured on the plan's second eager call that has
  them (a capture costs milliseconds: a plan made per step and used once per layer never captures;
  at most :data:`MAX_GRAPHS` per plan, then they are dropped and captured again);
* per call: one launch copies ``q``, ``indices`` and ``extra_indices`` into the static inputs
  (:func:`~dsv4sel.kernels.triton_replay.bind_stage`), the graph replays, one launch copies ``out``'s
  live heads and ``lse`` (transposed) into fresh contiguous tensors
  (:func:`~dsv4sel.kernels.triton_replay.bind_unstage`).

Same op, same arguments, bytes moved unchanged: the outputs are the direct call's bit for bit. The
lengths and the schedule are the plan's own tensors, which ``replan`` updates in place, so the
graphs stay valid across ``replan``.

Not taken (``run`` then calls the op directly, the same bytes): while the current stream is being
captured (a caller's own CUDA graph records the op itself), on a stream other than the one the
plan's first replay ran on (the static buffers are shared, so replays stay on one stream), when a
launch is declined (a profiler's hooks, another current device), for plans whose op is not
host-bound (:func:`worth_replaying`), and with ``$DSV4SEL_FLASHMLA_REPLAY=off``.

This module imports neither torch nor a kernel library.
"""

from __future__ import annotations

import os
from typing import Any

from .plan import DecodeOutput, DecodePlan

__all__ = ["EagerReplay", "MAX_GRAPHS", "REPLAY_ENV", "worth_replaying"]

#: Set to "off" to call FlashMLA's op directly in eager mode too.
REPLAY_ENV = "DSV4SEL_FLASHMLA_REPLAY"
#: Graphs kept per plan (one per window cache, extra cache and sink: a model's layers).
MAX_GRAPHS = 256
#: Query rows (batch x query length x padded heads) up to which eager ``run`` replays a graph; above it
#: the op's GPU time exceeds its host time, and the two copies would only add to it (see docs/kernels.md).
MAX_REPLAY_ROWS = 2048

_new_output = tuple.__new__


def worth_replaying(plan: DecodePlan, h_pad: int) -> bool:
    """Whether eager ``run`` of ``plan`` replays graphs: a CUDA plan small enough to be host-bound,
    with the direct launches on and the replay not turned off."""
    if os.environ.get(REPLAY_ENV, "").strip().lower() == "off":
        return False
    if getattr(plan.device, "type", None) != "cuda" or plan.batch * plan.seq_q * h_pad > MAX_REPLAY_ROWS:
        return False
    from .codec_support import fused_unavailable

    return fused_unavailable(plan.device) is None


class EagerReplay:
    """``replay(q, pages, indices, extra_pages, extra_indices, sink, q_is_staged)`` for one plan: a
    :class:`DecodeOutput` from a replayed graph, or None (call the op directly). Arguments as the
    plan's bound path has checked them: ``q``, ``indices`` and ``extra_indices`` have the plan's
    shapes, are contiguous bf16 / int32 on the plan's device (``q`` may be the plan's query buffer:
    ``q_is_staged``), ``pages`` and ``extra_pages`` are the caches' page views, ``sink`` the sink as
    the op takes it."""

    def __init__(self, plan: DecodePlan, op: Any) -> None:
        import torch

        from .triton_launch import STATE
        from .triton_replay import bind_stage

        st, device = plan.state, plan.device
        b, s, h, h_pad = plan.batch, plan.seq_q, plan.heads, st["h_pad"]
        self.plan, self.op, self.heads = plan, op, h
        self.q_stage = st["q_buf"] if st["padded"] else torch.zeros((b, s, h, 512), dtype=torch.bfloat16,
                                                                     device=device)
        self.idx = torch.zeros(plan.indices_shape, dtype=torch.int32, device=device)
        extra_shape = plan.extra_indices_shape
        self.eidx = None if extra_shape is None else torch.zeros(extra_shape, dtype=torch.int32, device=device)
        self.out = torch.zeros((b, s, h_pad, 512), dtype=torch.bfloat16, device=device)
        self.out_like = torch.empty((b, s, h, 512), dtype=torch.bfloat16, device=device)
        self.lse_like = torch.empty((b, s, h), dtype=torch.float32, device=device)
        q_example = torch.zeros((b, s, h, 512), dtype=torch.bfloat16, device=device)
        # Examples are the plan's own zeroed buffers: binding launches the copy twice.
        self.stage: Any = bind_stage(q_example, self.idx, self.eidx, self.q_stage, self.idx, self.eidx)
        # q already in the plan's query buffer: only the indices move (no q rows).
        self.stage_indices: Any = bind_stage(q_example[:, :, :0], self.idx, self.eidx, self.q_stage, self.idx, self.eidx)
        self.graphs: dict[tuple[int, int, int], tuple] = {}
        self.seen: set[tuple[int, int, int]] = set()  # keys called once: the next call captures
        self.pool = torch.cuda.graph_pool_handle()
        self.side = torch.cuda.Stream(device)
        self.replays = 0  # graphs replayed (the tests and the benchmark read it)
        self.home: "int | None" = None  # the raw stream the plan's replays run on
        self.device_index = self.out.get_device()
        self.capturing = torch.cuda.is_current_stream_capturing
        self.raw_stream = torch._C._cuda_getCurrentRawStream
        self.empty_like = torch.empty_like
        self.why_not = ""  # why this plan stopped replaying (empty while it replays)
        self.usable = self.stage is not None and self.stage_indices is not None and bool(STATE[0])

    def __call__(self, q: Any, pages: Any, indices: Any, extra_pages: Any, extra_indices: Any, sink: Any,
                 q_is_staged: bool) -> Any:
        if not self.usable or self.capturing() or not self._on_home_stream():
            return None
        key = (id(pages), id(extra_pages), id(sink))
        entry: Any = self.graphs.get(key)
        fresh = entry is None or entry[3] is not pages or entry[4] is not extra_pages or entry[5] is not sink
        if fresh and key not in self.seen:
            # A capture costs milliseconds: only for a plan that runs these caches again (a plan kept
            # across steps), not for one made per step and used once per layer.
            self.seen.add(key)
            return None
        if not self._stage(q, indices, extra_indices, q_is_staged):
            return None
        if fresh:
            entry = self._capture(key, pages, extra_pages, sink)
            if entry is None:  # the static inputs hold this call's tensors: the direct call reads the caller's
                return None
        entry[0].replay()
        self.replays += 1
        out, lse = self.empty_like(self.out_like), self.empty_like(self.lse_like)
        if not entry[1](out.data_ptr(), lse.data_ptr()):
            out.copy_(self.out.narrow(2, 0, self.heads))
            lse.copy_(entry[2].transpose(1, 2).narrow(2, 0, self.heads))
        return _new_output(DecodeOutput, (out, lse))

    def _on_home_stream(self) -> bool:
        """Whether the current stream is the one this plan replays on (the first one it replayed on)."""
        stream = self.raw_stream(self.device_index)
        if stream != self.home:
            if self.home is not None:
                return False
            self.home = stream
        return True

    def _stage(self, q: Any, indices: Any, extra_indices: Any, q_is_staged: bool) -> bool:
        """Copy this call's ``q`` (unless staged already) and indices into the graphs' static inputs in
        one launch; False when the launch is declined (hooks, another current device): nothing moved."""
        eptr = indices.data_ptr() if extra_indices is None else extra_indices.data_ptr()
        if q_is_staged:
            return bool(self.stage_indices(0, indices.data_ptr(), eptr))
        return bool(self.stage(q.data_ptr(), indices.data_ptr(), eptr))

    def _capture(self, key: tuple, pages: Any, extra_pages: Any, sink: Any) -> "tuple | None":
        """The graph of the op over these caches and sink (and its bound unstage), or None (and the plan
        stops replaying) when the capture fails or the op does not write the given ``out``."""
        import torch

        from .triton_replay import bind_unstage

        plan, meta = self.plan, self.plan.state["meta"]
        graph, current = torch.cuda.CUDAGraph(), torch.cuda.current_stream(plan.device)
        self.side.wait_stream(current)
        try:
            with torch.cuda.stream(self.side):
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
                try:
                    got = self.op(self.q_stage, pages, self.idx, plan.topk_length, sink, meta.tile_scheduler_metadata,
                                  meta.num_splits, extra_pages, self.eidx, plan.extra_topk_length, 512,
                                  plan.softmax_scale, self.out, False)
                finally:
                    graph.capture_end()
            current.wait_stream(self.side)
            lse = got[1]
            if got[0].data_ptr() != self.out.data_ptr():
                raise RuntimeError("the op did not write the given out")
            unstage = bind_unstage(self.out, lse, self.heads)
        except Exception as exc:  # noqa: BLE001 - any failure to capture: this plan calls the op directly from now on
            current.wait_stream(self.side)
            self.usable, self.why_not = False, f"capture failed: {type(exc).__name__}: {exc}"
            return None
        if unstage is None:
            self.usable, self.why_not = False, "the unstage copy has no direct launch"
            return None
        if len(self.graphs) >= MAX_GRAPHS:
            self.graphs.clear()
            self.seen.clear()
        entry = self.graphs[key] = (graph, unstage, lse, pages, extra_pages, sink)
        return entry
