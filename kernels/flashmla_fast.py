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
  views (one ``as_strided`` each), as the general path does.

The results are the general path's, bit for bit: the same op with the same arguments.

This module imports neither torch nor a kernel library.
"""

from __future__ import annotations

from typing import Any, Callable

from .plan import DecodeOutput, DecodePlan

__all__ = ["fast_run"]

_new_output = tuple.__new__


def _pages(views: dict, cache: Any, block_size: int) -> Any:
    """The memoized FlashMLA page view of ``cache`` (see ``DeepseekV4FlashMLASparseImpl._page_view``),
    or None when there is none yet, it is stale, or its block size is not the plan's."""
    hit = views.get(id(cache))
    if hit is None or hit[1] != cache.data_ptr() or hit[2] != cache.shape or hit[3].shape[1] != block_size:
        return None
    return hit[3]


def _indices_key(t: Any) -> tuple:
    return (t.shape, t.dtype, t.get_device(), t.is_contiguous())


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
    want = (plan.q_shape, torch.bfloat16, device, True, plan.indices_shape, torch.int32, device, True)
    want_extra = None if plan.extra_topk is None else (plan.extra_indices_shape, torch.int32, device, True)
    padded, q_buf, q_live, copy = st["padded"], st.get("q_buf"), st.get("q_live"), st.get("fast_copy")
    lse_view, out_view, sink_shape = st["lse_view"], st["out_view"], plan.sink_shape

    def extra_args(views: dict, extra_kv_cache: Any, extra_indices: Any) -> Any:
        """(extra pages, extra indices) as the plan has them, (None, None) without, or None: mismatch."""
        if want_extra is None:
            return (None, None) if extra_kv_cache is None and extra_indices is None else None
        if extra_indices is None or _indices_key(extra_indices) != want_extra:
            return None
        pages = _pages(views, extra_kv_cache, extra_block_size)
        return None if pages is None else (pages, extra_indices)

    def query(q: Any) -> Any:
        if not padded:
            return q
        if q is not q_live and (copy is None or not copy(q.data_ptr())):
            general_query(st, q)
        return q_buf

    def fast(impl: Any, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any, extra_indices: Any,
             attn_sink: Any) -> Any:
        if (q.shape, q.dtype, q.get_device(), q.is_contiguous() or q is q_live, *_indices_key(indices)) != want:
            return None
        views = impl._views
        pages = _pages(views, kv_cache, block_size)
        extra = extra_args(views, extra_kv_cache, extra_indices)
        if pages is None or extra is None or attn_sink is not None and attn_sink.shape != sink_shape:
            return None
        sink = None if attn_sink is None else impl._sink(st, attn_sink, plan.device)
        got = op(query(q), pages, indices, topk_length, sink, tsm, splits, extra[0], extra[1], extra_topk_length,
                 512, scale, None, False)
        out, lse = got[0], got[1]
        return _new_output(DecodeOutput, (out.as_strided(*out_view) if padded else out, lse.as_strided(*lse_view)))

    return fast
