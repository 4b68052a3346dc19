"""FlashMLA sparse FP8 decode (SM90, SM100 family) over the fp8_ds_mla layout.

Which FlashMLA
--------------
:func:`flashmla_build` finds the build the adapter calls, in this order:

1. the ``flash_mla`` package (a source build of https://github.com/deepseek-ai/FlashMLA);
2. the folder named by the environment variable ``DSV4SEL_VLLM_FLASHMLA_DIR``
   (:data:`VLLM_FLASHMLA_DIR_ENV`): a copy of the FlashMLA build that vLLM's
   wheel bundles, laid out as in the wheel, ``<dir>/vllm/_flashmla_C.abi3.so`` and
   ``<dir>/vllm/third_party/flashmla/flash_mla_interface.py`` (``<dir>`` may also be
   the ``vllm`` folder itself);
3. the installed ``vllm`` package's bundled build (``vllm/_flashmla_C.abi3.so`` +
   ``vllm.third_party.flashmla.flash_mla_interface``; vLLM 0.33.0's wheel has it,
   built against PyTorch's stable ABI).

For 2 and 3 only the extension and the interface module are loaded, by path:
vLLM's top-level package (which imports most of vLLM) is not imported, unless
it already is, in which case its own modules are used. ``flashmla_build()``
returns a :class:`FlashMLABuild` that names the build (``doctor`` prints its
``describe()``); ``is_available()``'s reason names it too.

The call, as verified on an H200 against FlashMLA built from source and
vLLM 0.33.0's bundled build (``docs/kernels.md``)::

    sched_meta = flash_mla.get_mla_metadata()[0]
    out, lse = flash_mla.flash_mla_with_kvcache(
        q, k_cache, None, None, 512, sched_meta,
        num_splits=None, softmax_scale=..., causal=False, is_fp8_kvcache=True,
        indices=..., attn_sink=..., [extra_k_cache=..., extra_indices_in_kvcache=...,
        topk_length=..., extra_topk_length=...])

* ``q``: bf16 ``[b, s_q, h_q, 512]``, ``h_q`` padded with zero heads to 64 or 128
  (the kernel's only head counts); more than 128 heads is a ValueError.
* ``k_cache``: the fp8_ds_mla pages as float8_e4m3fn ``(num_blocks, block_size, 1, 584)``
  with strides ``(page_bytes, 584, 584, 1)``, sharing storage with the uint8 cache.
* ``indices`` / ``topk_length``: int32 slots and int32 ``[b]`` lengths.
* ``attn_sink``: float32 ``[h_q]`` (padded heads get 0; their output is dropped).
* ``lse`` comes back ``[b, h_q, s_q]`` and is returned as ``[b, s_q, h]``.

Plan and run
------------
``sched_meta`` may be reused only while the shapes *and* the values of
``topk_length`` / ``extra_topk_length`` stay the same: that is exactly one
plan. :meth:`~DeepseekV4FlashMLASparseImpl.plan` makes a fresh ``sched_meta``
and fills it by one call on a dummy batch of the planned shapes (all indices
-1, a one-page dummy cache): FlashMLA computes its tile schedule on the first
call of a ``sched_meta`` and has no separate planning entry point.
:meth:`~DeepseekV4FlashMLASparseImpl.run` then only calls the kernel with the
planned ``sched_meta``, so it launches no planning kernel and allocates
nothing but the output: safe to capture in a CUDA graph. Where the build's
interface module exposes its kernel op (``flash_mla_cuda.sparse_decode_fwd``,
as vLLM's and FlashMLA's do) and the op accepts the planned schedule on the
dummy batch (probed once per process and build), ``run`` calls the op
directly: the interface's per-call Python checks are the plan's, done once.
With padded heads (fewer than 64, or 65..127) ``run``'s one extra launch is
the copy of ``q`` into the planned buffer (:mod:`~dsv4sel.kernels.triton_heads`, or
torch's ``copy_``); the padded sink is made once per sink tensor.
:meth:`~DeepseekV4FlashMLASparseImpl.replan` recomputes the schedule for new
lengths and copies it into the planned tensors, so a captured graph stays valid.
``forward_decode`` is plan + run, reusing its plan for the same shapes and
length tensors (see :meth:`~dsv4sel.kernels.base.SparseMLAImpl.forward_decode`).

FlashMLA's PyPI name ``flash-mla`` is a broken placeholder; install from
https://github.com/deepseek-ai/FlashMLA or use vLLM's build (see ``docs/kernels.md``).
"""

from __future__ import annotations

import functools
import threading
from typing import Any, ClassVar, Mapping

from .availability import library_label
from .flashmla_fast import fast_run
from .flashmla_replay import EagerReplay, worth_replaying
from .base import DecodeOutput, DecodePlan, SparseMLAImpl, padded_heads
from .flashmla_build import (FLASHMLA_INSTALL_HINT, VLLM_FLASHMLA_DIR_ENV, FlashMLABuild, flashmla_build,
                             load_flashmla, load_vllm_flashmla)

__all__ = [
    "DeepseekV4FlashMLASparseImpl",
    "FLASHMLA_INSTALL_HINT",
    "FLASHMLA_HEADS",
    "FlashMLABuild",
    "VLLM_FLASHMLA_DIR_ENV",
    "flashmla_build",
    "load_flashmla",
    "load_vllm_flashmla",
]

#: FlashMLA's sparse FP8 decode kernels exist for these head counts only.
FLASHMLA_HEADS: tuple[int, ...] = (64, 128)

_lock = threading.Lock()
#: The direct-op probe's verdict per (interface module, op), once per process and build.
_probed: dict[tuple[int, int], tuple[Any, Any, Any]] = {}


def _i32(t: Any, device: Any) -> Any:
    """``t`` as contiguous int32 on ``device`` (itself when it already is one on a CUDA device)."""
    if t.dtype is _I32 and t.is_contiguous() and t.is_cuda:
        return t
    import torch

    if t.dtype is torch.int32 and t.is_contiguous() and t.device == device:
        return t
    return t.to(device=device, dtype=torch.int32).contiguous()


def _query(st: dict, q: Any) -> Any:
    """``q`` as the op takes it: bf16, contiguous, padded heads in the plan's buffer (the one copy,
    none when ``q`` is the plan's ``query_buffer``)."""
    if not st["padded"]:
        return q if q.dtype is _BF16 and q.is_contiguous() else q.to(_BF16).contiguous()
    if q is not st["q_live"]:
        copy = st["copy_heads"]
        if copy is None or q.dtype is not _BF16 or q.get_device() != st["device_index"] or not copy(q, st["q_buf"]):
            st["q_live"].copy_(q)
    return st["q_buf"]


def _outputs(st: dict, out: Any, lse: Any, heads: int) -> DecodeOutput:
    """The op's ``out`` ``[b, s, h_pad, 512]`` and ``lse`` ``[b, h_pad, s]`` as ``[b, s, h, 512]`` and
    ``[b, s, h]`` views (one ``as_strided`` each: lse's transpose and the head cut included)."""
    lse = lse.as_strided(*st["lse_view"]) if lse.is_contiguous() else lse.transpose(1, 2).narrow(2, 0, heads)
    if st["padded"]:
        out = out.as_strided(*st["out_view"]) if out.is_contiguous() else out.narrow(2, 0, heads)
    return DecodeOutput(out, lse)


_BF16 = _I32 = _F32 = None  # torch dtypes, set on first use (this module must import without torch)


def _dtypes() -> None:
    global _BF16, _I32, _F32
    import torch

    _BF16, _I32, _F32 = torch.bfloat16, torch.int32, torch.float32


def _bound_copier(copier: Any, q_buf: Any, heads: int) -> Any:
    """The padded-head copy bound to the plan's buffer (:func:`~dsv4sel.kernels.triton_heads.bind_copy`),
    for ``run``'s fast path; None where the Triton copy cannot run or the direct launch is off."""
    if copier is None:
        return None
    import torch

    from .triton_heads import bind_copy

    b, s, _, cols = q_buf.shape
    return bind_copy(torch.zeros((b, s, heads, cols), dtype=q_buf.dtype, device=q_buf.device), q_buf)


def _head_copier(device: Any) -> Any:
    """:func:`~dsv4sel.kernels.triton_heads.copy_heads` where it can run (a CUDA device and Triton
    importable, as for the fused codecs), else None (``run`` copies with torch)."""
    from .codec_support import fused_unavailable

    if fused_unavailable(device) is not None:
        return None
    from .triton_heads import copy_heads

    return copy_heads


class UsesFlashMLABuild:
    """For impls that run on FlashMLA: the library is :func:`flashmla_build`'s
    (the ``flash_mla`` package, else vLLM's bundled build), and availability
    messages name which build, or what is missing and how to install one."""

    library_name: ClassVar[str] = "flash_mla"

    @classmethod
    def import_library(cls) -> Any:
        return load_flashmla()

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        return f"no usable FlashMLA build ({exc}): {FLASHMLA_INSTALL_HINT}"

    @classmethod
    def library_label(cls, module: Any) -> str:
        build = flashmla_build()
        if build.source.startswith("vllm") and build.module is module:
            return build.describe()
        return library_label(cls.library_name, module)


class DeepseekV4FlashMLASparseImpl(UsesFlashMLABuild, SparseMLAImpl):
    """DeepSeek-V4 sparse decode through FlashMLA's ``flash_mla_with_kvcache``.

    The build is :func:`flashmla_build`'s: the ``flash_mla`` package, else vLLM's bundled FlashMLA.
    """

    impl_name: ClassVar[str] = "DeepseekV4FlashMLASparseImpl"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla"})
    targets: ClassVar[Mapping[str, frozenset]] = {"cuda": frozenset({9, 10})}
    kernel_label: ClassVar[str] = "FlashMLA sparse FP8 decode"
    built_for: ClassVar[str] = "is built for SM90 and the SM100 family"

    @classmethod
    def build(cls) -> FlashMLABuild:
        """:func:`flashmla_build`: which FlashMLA this impl calls here."""
        return flashmla_build()

    # -- plan / run --------------------------------------------------------
    def _pages(self, cache: Any) -> Any:
        """The float8 ``(nb, bs, 1, 584)`` page view FlashMLA reads (shares storage with ``cache``)."""
        import torch

        view = self.layout.kernel_view(cache)  # uint8 (nb, bs, 584), strides (page, 584, 1)
        nb, bs, width = view.shape
        return view.view(torch.float8_e4m3fn).as_strided(
            (nb, bs, 1, width), (view.stride(0), width, width, 1), view.storage_offset()
        )

    def _schedule(self, plan: DecodePlan) -> Any:
        """A fresh sched_meta, filled by one decode of a dummy batch with the plan's shapes and lengths."""
        import torch

        lib, st, device = plan.library, plan.state, plan.device
        b, s, h_pad = plan.batch, plan.seq_q, st["h_pad"]
        meta = lib.get_mla_metadata()[0]
        dummy = st.get("dummy")
        if dummy is None:
            def pages(block_size: int) -> Any:
                return self._pages(self.layout.allocate(1, block_size, device))

            dummy = {
                "q": torch.zeros((b, s, h_pad, 512), dtype=torch.bfloat16, device=device),
                "k_cache": pages(plan.block_size),
                "indices": torch.full((b, s, plan.topk), -1, dtype=torch.int32, device=device),
            }
            if plan.extra_topk is not None:
                dummy["extra_k_cache"] = pages(plan.extra_block_size)
                dummy["extra_indices_in_kvcache"] = torch.full(
                    (b, s, plan.extra_topk), -1, dtype=torch.int32, device=device
                )
            st["dummy"] = dummy
        kwargs = dict(st["kwargs"])
        kwargs["indices"] = dummy["indices"]
        if "extra_k_cache" in dummy:
            kwargs["extra_k_cache"] = dummy["extra_k_cache"]
            kwargs["extra_indices_in_kvcache"] = dummy["extra_indices_in_kvcache"]
        lib.flash_mla_with_kvcache(dummy["q"], dummy["k_cache"], None, None, 512, meta, **kwargs)
        return meta

    def __init__(self, layout: str, block_size: int, **kwargs: Any) -> None:
        """As :class:`~dsv4sel.kernels.base.SparseMLAImpl`."""
        super().__init__(layout, block_size, **kwargs)
        self._sinks: dict[int, tuple[Any, int, Any]] = {}

    def plan_library(self, plan: DecodePlan) -> None:
        import torch

        _dtypes()
        h = plan.heads
        h_pad = padded_heads(h, FLASHMLA_HEADS, self.impl_name)
        st = plan.state
        st["h_pad"] = h_pad
        kwargs: dict[str, Any] = {
            "num_splits": None,
            "softmax_scale": float(plan.softmax_scale),
            "causal": False,
            "is_fp8_kvcache": True,
            "attn_sink": None,
        }
        # Optional arguments go only when used, so builds that predate them still work.
        if plan.topk_length is not None:
            kwargs["topk_length"] = plan.topk_length
        if plan.extra_topk_length is not None:
            kwargs["extra_topk_length"] = plan.extra_topk_length
        st["kwargs"] = kwargs
        # run() calls this when the op cannot be called directly: the constant keywords bound once.
        st["call"] = functools.partial(plan.library.flash_mla_with_kvcache, **kwargs)
        st["padded"] = padded = h != h_pad
        if padded:
            q_buf = torch.zeros((plan.batch, plan.seq_q, h_pad, 512), dtype=torch.bfloat16, device=plan.device)
            # The live heads' view, made once: run() copies q into it, its one extra launch.
            st["q_buf"], st["q_live"] = q_buf, q_buf.narrow(2, 0, h)
            plan.query_buffer = st["q_live"]
            st["copy_heads"], st["device_index"] = _head_copier(plan.device), q_buf.get_device()
            st["fast_copy"] = _bound_copier(st["copy_heads"], q_buf, h)
        # The outputs' views, as sizes and strides (the op returns contiguous out [b, s, h_pad, 512]
        # and lse [b, h_pad, s]): one as_strided each, lse's transpose and the head cut included.
        b, s_q = plan.batch, plan.seq_q
        st["out_view"] = ((b, s_q, h, 512), (s_q * h_pad * 512, h_pad * 512, 512, 1))
        st["lse_view"] = ((b, s_q, h), (h_pad * s_q, 1, s_q))
        st["meta"] = self._schedule(plan)
        st["op"] = self._direct_op(plan)
        st["replay"] = EagerReplay(plan, st["op"]) if st["op"] is not None and worth_replaying(plan, h_pad) else None
        plan.fast_run = fast_run(plan, _query)

    def _direct_op(self, plan: DecodePlan) -> Any:
        """The interface's own kernel op, when the build exposes it and it takes the planned schedule.

        ``flash_mla_with_kvcache`` checks its arguments against ``sched_meta`` in Python and then
        calls ``flash_mla_cuda.sparse_decode_fwd``; once a plan has checked the shapes, ``run``
        calls that op itself, which saves the interface's host time. Probed once per process and
        build, on the first plan's dummy batch (vLLM's and FlashMLA's op takes q, kv, indices,
        topk_length, attn_sink, tile_scheduler_metadata, num_splits, extra_kv, extra_indices,
        extra_topk_length, d_v, sm_scale, out, enable_batch_invariant); None (run calls the
        interface) when absent or different. Where the op has a ``default`` overload (a torch
        op), that is what is returned: calling it skips the overload lookup.
        """
        import torch

        op = getattr(getattr(plan.library, "flash_mla_cuda", None), "sparse_decode_fwd", None)
        if op is None:
            return None
        key = (id(plan.library), id(op))
        with _lock:
            known = _probed.get(key)
        if known is not None:
            return known[2]
        st = plan.state
        meta, dummy = st["meta"], st["dummy"]
        tsm, splits = getattr(meta, "tile_scheduler_metadata", None), getattr(meta, "num_splits", None)
        verdict = None
        if isinstance(tsm, torch.Tensor) and isinstance(splits, torch.Tensor):
            try:
                got = op(dummy["q"], dummy["k_cache"], dummy["indices"], plan.topk_length, None, tsm, splits,
                         dummy.get("extra_k_cache"), dummy.get("extra_indices_in_kvcache"), plan.extra_topk_length,
                         512, float(plan.softmax_scale), None, False)
                out, lse = got[0], got[1]
                b, s, h_pad = plan.batch, plan.seq_q, st["h_pad"]
                same_schedule = isinstance(got[2], torch.Tensor) and got[2].data_ptr() == tsm.data_ptr()
                # run() views the outputs by strides: they must come back contiguous
                shapes = (tuple(out.shape), tuple(lse.shape), out.is_contiguous(), lse.is_contiguous())
                if shapes == ((b, s, h_pad, 512), (b, h_pad, s), True, True) and same_schedule:
                    verdict = getattr(op, "default", op)
                    # A torch OpOverload's __call__ only forwards to its C++ callable: call that.
                    verdict = getattr(verdict, "_op", None) if callable(getattr(verdict, "_op", None)) else verdict
            except Exception:  # noqa: BLE001 - any failure of the trial call: keep the checked call path
                verdict = None
        with _lock:  # the entry holds the module and the op, so their ids stay theirs
            _probed[key] = (plan.library, op, verdict)
        return verdict

    def replan_library(self, plan: DecodePlan) -> None:
        """New lengths: a new schedule, copied into the planned tensors (a captured graph keeps reading them)."""
        import torch

        old, new = plan.state["meta"], self._schedule(plan)
        for name in ("tile_scheduler_metadata", "num_splits"):
            have, got = getattr(old, name, None), getattr(new, name, None)
            if isinstance(have, torch.Tensor) and isinstance(got, torch.Tensor):
                if have.shape != got.shape:
                    raise ValueError(
                        f"FlashMLA's {name} changed shape ({tuple(have.shape)} -> {tuple(got.shape)}); "
                        "make a new plan (and capture again)"
                    )
                have.copy_(got)
            else:
                setattr(old, name, got)

    def run_library(self, plan: DecodePlan, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                    extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        """One layer: the planned op (or interface) call. Per call this does only what depends on
        the layer's tensors: q into the padded buffer (padded heads: the one extra launch, none
        when ``q`` is the plan's ``query_buffer``), the memoized page views, int32 / float32
        conversions the caller's tensors need, and views of the outputs (no copy)."""
        st, device = plan.state, plan.device
        q_in = _query(st, q)
        pages = self._page_view(kv_cache, plan.block_size, "cache")
        idx = _i32(indices, device)
        sink = None if attn_sink is None else self._sink(st, attn_sink, device)
        extra_pages = extra_idx = None
        if extra_kv_cache is not None:
            extra_pages = self._page_view(extra_kv_cache, plan.extra_block_size, "extra cache")
            extra_idx = _i32(extra_indices, device)
        op = st["op"]
        if op is not None:  # the interface's kernel op with the planned schedule (see _direct_op)
            meta = st["meta"]
            out, lse = op(q_in, pages, idx, plan.topk_length, sink, meta.tile_scheduler_metadata, meta.num_splits,
                          extra_pages, extra_idx, plan.extra_topk_length, 512, plan.softmax_scale, None, False)[:2]
        elif extra_pages is None:
            out, lse = st["call"](q_in, pages, None, None, 512, st["meta"], indices=idx, attn_sink=sink)
        else:
            out, lse = st["call"](q_in, pages, None, None, 512, st["meta"], indices=idx, attn_sink=sink,
                                  extra_k_cache=extra_pages, extra_indices_in_kvcache=extra_idx)
        return _outputs(st, out, lse, plan.heads)

    def _page_view(self, cache: Any, block_size: int, what: str) -> Any:
        """The memoized FlashMLA page view of ``cache`` (memo_view's entries, looked up inline: this is
        per layer), which must have the plan's block size."""
        hit = self._views.get(id(cache))
        pages = hit[3] if hit is not None and hit[1] == cache.data_ptr() and hit[2] == cache.shape \
            else self._cached_view(cache, self._pages)
        if pages.shape[1] != block_size:
            raise ValueError(f"{what} has block size {pages.shape[1]}, the plan was made for {block_size}")
        return pages

    def _sink(self, st: dict, sink: Any, device: Any) -> Any:
        """The sink as FlashMLA takes it: float32 ``[h_pad]`` on the device."""
        if st["padded"]:
            return self._padded_sink(sink, st["h_pad"], device)
        if sink.dtype is _F32 and sink.is_contiguous() and sink.is_cuda:
            return sink
        return sink.to(device=device, dtype=_F32).contiguous()

    def _padded_sink(self, sink: Any, h_pad: int, device: Any) -> Any:
        """``sink`` as float32 ``[h_pad]`` (padded heads 0), made once per sink tensor and version.

        A layer's sink is a weight, the same tensor every step: padding it once leaves ``run``
        one copy (q's) for padded heads. Keyed on the tensor's identity and torch's version
        counter, so an in-place change by a torch op is seen at the next eager ``run`` (a CUDA
        graph captured before keeps the buffer it captured).
        """
        import torch

        memo = self._sinks
        hit = memo.get(id(sink))
        if hit is not None and hit[1] == sink._version and hit[2].shape[0] == h_pad:
            return hit[2]
        buf = torch.zeros((h_pad,), dtype=torch.float32, device=device)
        buf[: sink.shape[0]].copy_(sink)
        if len(memo) >= 512:
            memo.clear()
        memo[id(sink)] = (sink, sink._version, buf)  # holds sink: its id stays its own
        return buf
