"""FlashMLA's ``run`` with its per-call work bound once per plan (the eager path of a decode step).

In eager mode a layer's ``run`` at a small batch is bound by host time: FlashMLA's op itself costs
tens of microseconds of it, and everything ``run`` adds shows in the ratio to the raw call. What
:func:`fast_run` returns is ``run`` for the common case, with the plan's constants bound in a closure:

* the arguments are checked against the plan in one tuple comparison (shapes, dtypes, device,
  contiguity of ``q`` and ``indices``), then the extra arguments and the sink's shape; anything else (a non-contiguous ``q``, int64 indices, a cache
  seen for the first time, an error) returns None and takes the general path, which converts,
  memoizes or raises;
* the page views come from the impl's memo (made by the general path on a cache's first ``run``);
* padded heads: ``q`` goes into the plan's buffer by one direct launch of the copy kernel
  (:meth:`~dsv4sel.kernels.triton_launch.Launcher.bind`: the plan's buffer and sizes bound, ``q``'s
  pointer given per call), the sink is the impl's padded copy;
* the op (probed by the plan) is called with the planned schedule, and its outputs are returned as
  views (one ``as_strided`` each), as the general path does; or, for a plan small enough to be
  host-bound, a graph of that call is replayed (:mod:`~dsv4sel.kernels.flashmla_replay`).

The results are the general path's, bit for bit: the same op with the same arguments.

This module imports neither torch nor a kernel library.
"""

from __future__ import annotations

from typing import Any, Callable

from .plan import DecodeOutput, DecodePlan

__all__ = ["fast_run"]

_new_output = tuple.__new__


def fast_run(plan: DecodePlan, general_query: Callable[[dict, Any], Any]) -> Any:
    """``fast(impl, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)`` for ``plan``
    (a :class:`DecodeOutput`, or None: take the general path), or None where the plan has no direct op.

    ``general_query(state, q)`` is the general path's copy of ``q`` into the padded buffer, for a
    launch the bound copy declines (a hook installed, another current device)."""
    import torch

    st = plan.state
    op = st.get("op")
    if op is None:
        return None
    meta = st["meta"]
    tsm, splits = meta.tile_scheduler_metadata, meta.num_splits
    device = tsm.get_device()
    topk_length, extra_topk_length, scale = plan.topk_length, plan.extra_topk_length, plan.softmax_scale
    block_size, extra_block_size = plan.block_size, plan.extra_block_size
    want: tuple = (plan.q_shape, torch.bfloat16, device, True, plan.indices_shape, torch.int32, device, True)
    if plan.extra_topk is not None:
        want += (plan.extra_indices_shape, torch.int32, device, True)
    padded, q_buf, q_live, copy = st["padded"], st.get("q_buf"), st.get("q_live"), st.get("fast_copy")
    lse_view, out_view, sink_shape = st["lse_view"], st["out_view"], plan.sink_shape
    replay = st.get("replay")

    def finish(impl: Any, q: Any, pages: Any, indices: Any, extra_pages: Any, extra_indices: Any,
               attn_sink: Any) -> Any:
        """The sink, ``q`` into the padded buffer, the op, the outputs' views (arguments checked)."""
        if attn_sink is None:
            sink = None
        elif attn_sink.shape != sink_shape:
            return None
        else:
            sink = impl._sink(st, attn_sink, plan.device)
        if replay is not None:
            got = replay(q, pages, indices, extra_pages, extra_indices, sink, q is q_live)
            if got is not None:
                return got
        if padded:
            if q is not q_live and (copy is None or not copy(q.data_ptr())):
                general_query(st, q)
            q = q_buf
        got = op(q, pages, indices, topk_length, sink, tsm, splits, extra_pages, extra_indices, extra_topk_length,
                 512, scale, None, False)
        out, lse = got[0], got[1]
        return _new_output(DecodeOutput, (out.as_strided(*out_view) if padded else out, lse.as_strided(*lse_view)))

    def fast_extra(impl: Any, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any, extra_indices: Any,
                   attn_sink: Any) -> Any:
        """A plan with an extra cache (DeepSeek-V4's window + compressed caches)."""
        if extra_indices is None or (
                q.shape, q.dtype, q.get_device(), q.is_contiguous() or q is q_live,
                indices.shape, indices.dtype, indices.get_device(), indices.is_contiguous(),
                extra_indices.shape, extra_indices.dtype, extra_indices.get_device(), extra_indices.is_contiguous(),
        ) != want:
            return None
        views = impl._views  # entries (cache, data_ptr, shape, page view): see _page_view
        hit, extra = views.get(id(kv_cache)), views.get(id(extra_kv_cache))
        if hit is None or extra is None or (hit[1], hit[2], hit[3].shape[1], extra[1], extra[2], extra[3].shape[1]) \
                != (kv_cache.data_ptr(), kv_cache.shape, block_size, extra_kv_cache.data_ptr(), extra_kv_cache.shape,
                    extra_block_size):
            return None
        return finish(impl, q, hit[3], indices, extra[3], extra_indices, attn_sink)

    def fast_plain(impl: Any, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any, extra_indices: Any,
                   attn_sink: Any) -> Any:
        """A plan without an extra cache."""
        if extra_kv_cache is not None or extra_indices is not None or (
                q.shape, q.dtype, q.get_device(), q.is_contiguous() or q is q_live,
                indices.shape, indices.dtype, indices.get_device(), indices.is_contiguous(),
        ) != want:
            return None
        hit = impl._views.get(id(kv_cache))
        if hit is None or (hit[1], hit[2], hit[3].shape[1]) != (kv_cache.data_ptr(), kv_cache.shape, block_size):
            return None
        return finish(impl, q, hit[3], indices, None, None, attn_sink)

    return fast_plain if plan.extra_topk is None else fast_extra
