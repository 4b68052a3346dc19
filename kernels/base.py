"""The shared contract of the DeepSeek-V4 / V4.1 sparse-MLA attention impls.

Every impl (FlashMLA, FlashInfer, AITER, torch reference, the V4.1 impls, a rule
pack's) is a :class:`SparseMLAImpl`. What a caller uses:

* ``is_available(platform=None, capability=None) -> (bool, reason)``:
  a classmethod that never raises. ``None`` means "detect this machine".
  The reason says what to install or what is wrong.
* ``Impl(layout, block_size, *, fallback="error", ...)``: the layout is a
  name from :data:`dsv4sel.kernels.layouts.LAYOUTS` the impl can read.
* ``kv_cache_shape(num_blocks, block_size)``: the logical cache shape the
  kernel is handed (``(num_blocks, block_size, 584)`` for fp8_ds_mla,
  ``(..., 512)`` for rows). ``allocate_kv_cache`` makes the backing tensor,
  ``kv_cache_view`` maps it to that shape.
* ``write_kv(kv_cache, kv, slots)``: store ``[n, 512]`` rows.
* ``plan(batch=, heads=, topk=, softmax_scale=, ...) -> DecodePlan`` then
  ``run(q, kv_cache, indices, ...) -> DecodeOutput``: the decode split the way
  FlashInfer's wrappers split it. ``plan`` does, once per batch shape, what
  depends only on shapes and lengths (scheduler metadata, padded-head
  buffers, int32 lengths); ``run`` launches the kernel for one layer and is
  safe to capture in a CUDA graph; ``replan`` refreshes a plan's lengths in
  place between graph replays.
* ``forward_decode(q, kv_cache, indices, *, softmax_scale, ...) -> DecodeOutput``:
  one call that plans (or reuses the plan it made for the same shapes and the
  same, unmodified length tensors) and runs. When the library is missing or
  the device is wrong it raises :class:`KernelUnavailableError`, unless the impl
  was built with ``fallback="reference"``, the explicit opt-in to the torch
  reference. The reference reads only layouts with a codec
  (``layout.has_codec``); for the DeepSeek-V4.1 records the error is raised
  even with that opt-in.

Outputs follow :mod:`dsv4sel.kernels.reference`: ``out`` bf16
``[b, s_q, h, 512]``; ``lse`` float32 ``[b, s_q, h]`` (natural log, no sink,
``+inf`` for rows with no token) or ``None`` where the library does not return it.

The extension API, what an impl writes (:data:`~dsv4sel.kernels.availability.HOOKS`; docs/kernels.md,
"Writing an impl"): required ``import_library(cls)`` and ``run_library(self, plan, q, kv_cache,
indices, extra_kv_cache, extra_indices, attn_sink) -> DecodeOutput``; optional ``plan_library``,
``replan_library``, ``prefill_library`` (the sparse prefill: :meth:`SparseMLAImpl.prefill`), ``library_missing_reason``, ``entry_point_reason``, ``target_reason``,
``library_label``. A class missing a required hook, or defining one under an old name the base
class never calls (``_forward_library``, ...), is a TypeError when it is defined.

This module imports neither torch nor a kernel library.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .availability import HOOKS, REQUIRED_HOOKS, ImplClass, missing_hooks, writes_hook
from .decode import check_decode_args
from .errors import KernelUnavailableError, UnknownLayoutError, UnsupportedLayoutError
from .layouts import Fp8E4m3RowLayout, KVCacheLayout, get_layout
from .plan import (DecodeInputs, DecodeOutput, DecodePlan, check_plan_args, check_run_args,  # noqa: F401
                   import_attr_module, lengths_key, memo_view, padded_heads)
from .platform import PLATFORMS, Capability, device_target, parse_capability

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DecodeInputs", "DecodeOutput", "DecodePlan", "SparseMLAImpl", "KernelUnavailableError", "UnknownLayoutError",
    "UnsupportedLayoutError", "FALLBACKS", "HOOKS", "REQUIRED_HOOKS", "missing_hooks",
]

FALLBACKS: frozenset[str] = frozenset({"error", "reference"})
#: forward_decode keeps at most this many plans per impl (the oldest goes first).
FORWARD_PLANS = 8


def _validate(inputs: DecodeInputs) -> None:
    """Shape and dtype checks that need no device sync (:func:`~dsv4sel.kernels.decode.check_decode_args`)."""
    check_decode_args(inputs.q, inputs.indices, inputs.softmax_scale, inputs.attn_sink, inputs.topk_length,
                      inputs.extra_kv_cache, inputs.extra_indices, inputs.extra_topk_length, inputs.seq_lens,
                      extra_cache_name="extra_kv_cache")


class SparseMLAImpl(ImplClass, abstract=True):
    """Base class: availability, construction, cache helpers, plan / run / forward_decode.

    Subclasses set the class attributes (``targets`` says where the kernel runs,
    read by :meth:`target_reason`) and write the hooks of the extension API
    (module docstring; :data:`~dsv4sel.kernels.availability.HOOKS`): at least
    ``import_library`` and ``run_library``.
    """

    def __init__(
        self,
        layout: str,
        block_size: int,
        *,
        kv_scale: float = 1.0,
        fallback: str = "error",
        platform: str | None = None,
        capability: Any = None,
    ) -> None:
        """Args:
            layout: a layout name this impl reads (see ``supported_layouts``).
            block_size: tokens per cache page.
            kv_scale: per-tensor scale of ``fp8_e4m3_row`` (must stay 1.0 for others).
            fallback: ``"error"`` (default) raises KernelUnavailableError when
                the library cannot run; ``"reference"`` runs the torch reference instead
                (for layouts with a codec; otherwise the error is still raised).
            platform, capability: the target to check the library against; by
                default taken from the device of ``q`` at each call.
        """
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be one of {sorted(FALLBACKS)}, got {fallback!r}")
        if not isinstance(layout, str):
            raise TypeError(f"layout must be a layout name, got {type(layout).__name__}")
        lay = get_layout(layout)
        if lay.name not in self.supported_layouts:
            raise UnsupportedLayoutError(
                f"{self.impl_name} does not read the {lay.name} layout; it reads "
                f"{', '.join(sorted(self.supported_layouts))}"
            )
        if float(kv_scale) != 1.0:
            if not isinstance(lay, Fp8E4m3RowLayout):
                raise ValueError(f"kv_scale applies to fp8_e4m3_row only; {lay.name} keeps its scales in the cache")
            lay = lay.with_scale(kv_scale)
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        if platform is not None and platform not in PLATFORMS:
            raise ValueError(f"platform must be one of {sorted(PLATFORMS)}, got {platform!r}")
        self.layout: KVCacheLayout = lay
        self.block_size = block_size
        self.fallback = fallback
        self.platform = platform
        self.capability: Capability | None = parse_capability(capability)
        self._fallback_logged = False
        self._current_plan: DecodePlan | None = None
        self._views: dict[Any, Any] = {}
        self._forward_plans: dict[Any, tuple[DecodePlan, tuple]] = {}
        # (scale and length tensors' ids and versions, kept plan entry) of the last forward_decode that ran
        # the bound path; the entry holds the length tensors, so their ids stay theirs.
        self._forward_last: "tuple[tuple, tuple[DecodePlan, tuple]] | None" = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layout={self.layout.name!r}, block_size={self.block_size}, fallback={self.fallback!r})"

    # -- cache helpers ---------------------------------------------------
    def kv_cache_shape(self, num_blocks: int, block_size: int | None = None) -> tuple[int, int, int]:
        """The logical ``(num_blocks, block_size, width)`` cache shape handed to the kernel."""
        return self.layout.kernel_shape(num_blocks, self.block_size if block_size is None else block_size)

    def allocate_kv_cache(self, num_blocks: int, device: Any = "cpu") -> "torch.Tensor":
        """A zeroed cache tensor in this impl's layout (pages back to back)."""
        return self.layout.allocate(num_blocks, self.block_size, device)

    def kv_cache_view(self, kv_cache: "torch.Tensor") -> "torch.Tensor":
        """``kv_cache`` viewed with :meth:`kv_cache_shape` (shares storage)."""
        return self.layout.kernel_view(kv_cache)

    def write_kv(self, kv_cache: "torch.Tensor", kv: "torch.Tensor", slots: "torch.Tensor") -> None:
        """Store ``kv`` ``[n, 512]`` at ``slots`` (``block * block_size + offset``)."""
        self._check_block_size(kv_cache)
        self.layout.write(kv_cache, kv, slots)

    def _check_block_size(self, kv_cache: "torch.Tensor") -> None:
        got = self.layout.block_size_of(kv_cache)
        if got != self.block_size:
            raise ValueError(f"cache has block size {got}, this impl was built for {self.block_size}")

    # -- decode ----------------------------------------------------------
    def forward_decode(
        self,
        q: "torch.Tensor",
        kv_cache: "torch.Tensor",
        indices: "torch.Tensor",
        *,
        softmax_scale: float,
        attn_sink: "torch.Tensor | None" = None,
        topk_length: "torch.Tensor | None" = None,
        extra_kv_cache: "torch.Tensor | None" = None,
        extra_indices: "torch.Tensor | None" = None,
        extra_topk_length: "torch.Tensor | None" = None,
        seq_lens: "torch.Tensor | None" = None,
    ) -> DecodeOutput:
        """Sparse decode over the cache slots in ``indices`` (and ``extra_indices``), in one call.

        Arguments: those of :func:`dsv4sel.kernels.reference.sparse_mla_decode` (``extra_cache``
        there); ``seq_lens`` (int ``[b]``) is needed only by FlashInfer on SM10x.

        :meth:`plan` then :meth:`run`, with the plan kept: a later call with the same shapes,
        dtypes, ``softmax_scale``, device and length tensors (the same objects, not changed in
        place by a torch op since: their version counter is in the key) reuses it and costs what
        :meth:`run` costs; the last :data:`FORWARD_PLANS` are kept. Lengths changed in place by a
        non-torch writer (a custom kernel, a DLPack peer) are not noticed: pass a new tensor, or
        use :meth:`plan` / :meth:`replan` / :meth:`run`, as a serving engine does.
        """
        again = self._forward_again(q, kv_cache, indices, softmax_scale, attn_sink, topk_length, extra_kv_cache,
                                    extra_indices, extra_topk_length, seq_lens)
        if again is not None:
            return again
        # Cheap parts only (no torch.device object, no shape slices): this is all a repeated call adds to run.
        key = (q.shape, q.dtype, q.get_device(), indices.shape, indices.dtype, kv_cache.shape[1], softmax_scale,
               None if topk_length is None else (id(topk_length), topk_length._version),
               None if extra_topk_length is None else (id(extra_topk_length), extra_topk_length._version),
               None if seq_lens is None else (id(seq_lens), seq_lens._version),
               None if extra_indices is None else (extra_indices.shape, extra_indices.dtype),
               None if extra_kv_cache is None else extra_kv_cache.shape[1],
               None if attn_sink is None else attn_sink.shape)
        hit = self._forward_plans.get(key)
        if hit is None:
            hit = self._forward_plan(key, q, kv_cache, indices, softmax_scale, attn_sink, topk_length,
                                     extra_kv_cache, extra_indices, extra_topk_length, seq_lens)
        plan = hit[0]
        if plan.library is None:
            return self._run_reference(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)
        fast = plan.fast_run
        got = None if fast is None else fast(self, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)
        if got is not None:
            self._forward_last = (lengths_key(softmax_scale, topk_length, extra_topk_length, seq_lens), hit)
            return got
        return self.run_library(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)

    def _forward_again(self, q: Any, kv_cache: Any, indices: Any, softmax_scale: Any, attn_sink: Any,
                       topk_length: Any, extra_kv_cache: Any, extra_indices: Any, extra_topk_length: Any,
                       seq_lens: Any) -> "DecodeOutput | None":
        """The last kept plan's bound path, when the call has its scale and length tensors (same objects,
        same versions): the bound path checks the rest (shapes, dtypes, device, caches, sink) itself."""
        last = self._forward_last
        if last is None or last[0] != lengths_key(softmax_scale, topk_length, extra_topk_length, seq_lens):
            return None
        fast = last[1][0].fast_run
        return None if fast is None else fast(self, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)

    def _forward_plan(self, key: Any, q: Any, kv_cache: Any, indices: Any, softmax_scale: Any, attn_sink: Any,
                      topk_length: Any, extra_kv_cache: Any, extra_indices: Any, extra_topk_length: Any,
                      seq_lens: Any) -> tuple[DecodePlan, tuple]:
        """Validate one forward_decode call in full and plan it; the plan is kept under ``key``
        together with the length tensors (which keeps their ids from being reused)."""
        inputs = DecodeInputs(
            q, kv_cache, indices, softmax_scale, attn_sink, topk_length,
            extra_kv_cache, extra_indices, extra_topk_length, seq_lens,
        )
        _validate(inputs)
        self._check_block_size(kv_cache)
        extra_block_size = None
        if extra_kv_cache is not None:
            extra_block_size = self.layout.block_size_of(extra_kv_cache)
        plan = self._make_plan(
            batch=inputs.batch, seq_q=inputs.seq_q, heads=inputs.heads, topk=int(indices.shape[-1]),
            extra_topk=None if extra_indices is None else int(extra_indices.shape[-1]),
            softmax_scale=float(softmax_scale), topk_length=topk_length, extra_topk_length=extra_topk_length,
            seq_lens=seq_lens, device=q.device, extra_block_size=extra_block_size,
        )
        if len(self._forward_plans) >= FORWARD_PLANS:
            del self._forward_plans[next(iter(self._forward_plans))]
        hit = (plan, (topk_length, extra_topk_length, seq_lens))
        self._forward_plans[key] = hit
        return hit

    # -- prefill (optional hook) -----------------------------------------
    @classmethod
    def has_prefill(cls) -> bool:
        """Whether the impl writes the optional ``prefill_library`` hook: a host then hands it its
        sparse prefill (:meth:`prefill`); otherwise the host runs its own prefill kernel."""
        return writes_hook(cls, "prefill_library")

    def prefill(
        self,
        q: "torch.Tensor",
        kv_cache: "torch.Tensor",
        indices: "torch.Tensor",
        *,
        softmax_scale: float,
        attn_sink: "torch.Tensor | None" = None,
        topk_length: "torch.Tensor | None" = None,
        extra_kv_cache: "torch.Tensor | None" = None,
        extra_indices: "torch.Tensor | None" = None,
        extra_topk_length: "torch.Tensor | None" = None,
    ) -> DecodeOutput:
        """The sparse attention of prefill tokens: every query token is its own row (``q``
        ``[n, 1, h, 512]``, ``indices`` ``[n, 1, topk]`` its own cache slots, the lengths ``[n]``),
        with the semantics of :meth:`forward_decode`. Plans for this call only (a prefill's shape
        changes every step) and calls the impl's ``prefill_library``; with ``fallback="reference"``
        and no library, the torch reference. Raises TypeError when the impl has no prefill hook
        (:meth:`has_prefill`): the host runs its own prefill then."""
        inputs = DecodeInputs(q, kv_cache, indices, softmax_scale, attn_sink, topk_length,
                              extra_kv_cache, extra_indices, extra_topk_length, None)
        _validate(inputs)
        if not self.has_prefill():
            raise TypeError(f"{self.impl_name} has no prefill hook: {HOOKS['prefill_library']}")
        plan = self._make_plan(
            batch=inputs.batch, seq_q=inputs.seq_q, heads=inputs.heads, topk=int(indices.shape[-1]),
            extra_topk=None if extra_indices is None else int(extra_indices.shape[-1]),
            softmax_scale=float(softmax_scale), topk_length=topk_length, extra_topk_length=extra_topk_length,
            seq_lens=None, device=q.device,
            extra_block_size=None if extra_kv_cache is None else self.layout.block_size_of(extra_kv_cache),
        )
        if plan.library is None:
            return self._run_reference(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)
        hook = getattr(self, "prefill_library")  # noqa: B009 - an optional hook, no default on the base
        return hook(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)

    def plan(
        self,
        *,
        batch: int,
        heads: int,
        topk: int,
        softmax_scale: float,
        seq_q: int = 1,
        extra_topk: int | None = None,
        topk_length: "torch.Tensor | None" = None,
        extra_topk_length: "torch.Tensor | None" = None,
        seq_lens: "torch.Tensor | None" = None,
        extra_block_size: int | None = None,
        device: Any = None,
    ) -> "DecodePlan":
        """Prepare the decode of one batch shape: what every layer of a step shares.

        Everything that depends only on the batch's shapes and lengths is done
        here, once: the library's scheduler metadata, padded-head buffers, int32
        copies of the lengths, index-table masks. :meth:`run` then only launches
        the kernel, so it is safe to capture in a CUDA graph; replaying the graph
        in a later step needs :meth:`replan` (new length values, same buffers).

        Args:
            batch, seq_q, heads: ``q`` is ``[batch, seq_q, heads, 512]``.
            topk: columns of ``indices``; ``extra_topk``: columns of
                ``extra_indices`` (None: no extra cache).
            softmax_scale: multiplies ``q . kv``.
            topk_length, extra_topk_length, seq_lens: integer ``[batch]`` tensors
                (see :meth:`forward_decode`); their values are copied.
            extra_block_size: block size of the extra cache (default: this impl's).
            device: where the decode runs (default: the device of the lengths).

        The plan is also kept as the impl's current plan, which :meth:`run`
        uses when given none. Raises :class:`KernelUnavailableError` when the
        library cannot run (unless ``fallback="reference"``; the plan then runs
        the torch reference, which is not meant for graph capture).
        """
        device = check_plan_args(batch=batch, heads=heads, topk=topk, seq_q=seq_q, extra_topk=extra_topk,
                                 softmax_scale=softmax_scale, topk_length=topk_length,
                                 extra_topk_length=extra_topk_length, seq_lens=seq_lens,
                                 extra_block_size=extra_block_size, device=device)
        plan = self._make_plan(
            batch=batch, seq_q=seq_q, heads=heads, topk=topk, extra_topk=extra_topk,
            softmax_scale=float(softmax_scale), topk_length=topk_length, extra_topk_length=extra_topk_length,
            seq_lens=seq_lens, device=device, extra_block_size=extra_block_size,
        )
        self._current_plan = plan
        return plan

    def replan(
        self,
        plan: "DecodePlan",
        *,
        topk_length: "torch.Tensor | None" = None,
        extra_topk_length: "torch.Tensor | None" = None,
        seq_lens: "torch.Tensor | None" = None,
    ) -> "DecodePlan":
        """Give ``plan`` new length values in place (same shapes, same buffers).

        For CUDA graphs: a graph captured over :meth:`run` with ``plan`` reads
        the plan's buffers, so a new step re-plans into them, outside the
        graph, and replays. Only lengths the plan was made with can be given.
        """
        if plan.impl_name != self.impl_name:
            raise ValueError(f"a plan of {plan.impl_name} cannot be re-planned by {self.impl_name}")
        for name, new in (("topk_length", topk_length), ("extra_topk_length", extra_topk_length), ("seq_lens", seq_lens)):
            if new is None:
                continue
            buf = getattr(plan, name)
            if buf is None:
                raise ValueError(f"the plan was made without {name}; make a new plan")
            if tuple(new.shape) != tuple(buf.shape) or new.is_floating_point():
                raise ValueError(f"{name} must be an integer {list(buf.shape)} tensor, got {tuple(new.shape)}")
            buf.copy_(new)
        if plan.library is not None:
            self.replan_library(plan)
        return plan

    def run(
        self,
        q: "torch.Tensor",
        kv_cache: "torch.Tensor",
        indices: "torch.Tensor",
        *,
        extra_kv_cache: "torch.Tensor | None" = None,
        extra_indices: "torch.Tensor | None" = None,
        attn_sink: "torch.Tensor | None" = None,
        plan: "DecodePlan | None" = None,
    ) -> DecodeOutput:
        """Decode one layer with a plan (default: the last one :meth:`plan` made).

        ``q``, ``indices`` and ``extra_indices`` must have the plan's shapes;
        ``indices`` int32 and contiguous avoid a conversion. Launches only the
        kernel (plus a copy into the padded-head buffer when ``heads`` is not
        a kernel head count), so it can be captured in a CUDA graph.
        """
        plan = plan if plan is not None else self._current_plan
        fast = None if plan is None else plan.fast_run
        if fast is not None and plan is not None and plan.impl_name == self.impl_name:  # the plan's bound path
            got = fast(self, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)
            if got is not None:
                return got
        plan = check_run_args(plan, self.impl_name, q, indices, extra_kv_cache, extra_indices, attn_sink)
        if plan.library is None:
            return self._run_reference(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)
        return self.run_library(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)

    # -- plan / run internals ---------------------------------------------
    def _resolve(self, device: Any) -> tuple[Any, Capability | None, str | None]:
        """(library module, capability, None) or (None, capability, why not)."""
        platform, capability = device_target(device)
        platform = self.platform or platform
        capability = self.capability or capability
        reason = self.target_reason(platform, capability)
        module = None
        if reason is None:
            module, reason = self._library()
        if reason is None:
            reason = self.entry_point_reason(module, capability)
        return (module if reason is None else None), capability, reason

    def _make_plan(self, *, batch: int, seq_q: int, heads: int, topk: int, extra_topk: int | None,
                   softmax_scale: float, topk_length: Any, extra_topk_length: Any, seq_lens: Any,
                   device: Any, extra_block_size: int | None) -> "DecodePlan":
        import torch

        def i32(t: Any) -> Any:
            return None if t is None else t.to(device=device, dtype=torch.int32).clone()

        module, capability, reason = self._resolve(device)
        if reason is not None:
            self._unavailable(reason)
        plan = DecodePlan(
            impl_name=self.impl_name, batch=batch, seq_q=seq_q, heads=heads, topk=topk, extra_topk=extra_topk,
            softmax_scale=softmax_scale, device=device, capability=capability, library=module,
            topk_length=i32(topk_length), extra_topk_length=i32(extra_topk_length), seq_lens=i32(seq_lens),
            block_size=self.block_size, extra_block_size=extra_block_size or self.block_size,
        )
        if module is not None:
            self.plan_library(plan)
        return plan

    def _unavailable(self, reason: str) -> None:
        """The library cannot run: raise, or (``fallback="reference"``, a layout with a codec) log once."""
        if self.fallback == "reference" and not self.layout.has_codec:
            # The reference dequantizes through the layout; an opaque record
            # would only fail deeper down with a less useful error.
            raise KernelUnavailableError(self.impl_name, reason + (
                f"; fallback='reference' cannot stand in: the torch reference cannot read "
                f"{self.layout.name} (dsv4sel has no verified codec for it)"))
        if self.fallback != "reference":
            raise KernelUnavailableError(self.impl_name, reason)
        if not self._fallback_logged:
            import logging

            logging.getLogger(__name__).warning(
                "%s: %s; running the torch reference decode (fallback='reference')", self.impl_name, reason
            )
            self._fallback_logged = True

    def _run_reference(self, plan: "DecodePlan", q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                       extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        """A plan without a library (``fallback="reference"``): the torch reference."""
        return self._forward_reference(DecodeInputs(
            q, kv_cache, indices, plan.softmax_scale, attn_sink, plan.topk_length,
            extra_kv_cache, extra_indices, plan.extra_topk_length, plan.seq_lens,
        ))

    # -- optional hooks of the extension API (the required ones: ImplClass) ----
    def plan_library(self, plan: "DecodePlan") -> None:
        """Fill ``plan.state`` with what :meth:`run_library` needs besides the per-layer tensors
        (default: nothing). Called once per plan, with ``plan.library`` imported."""

    def replan_library(self, plan: "DecodePlan") -> None:
        """Refresh ``plan.state`` after :meth:`replan` copied new lengths into the plan's
        tensors (default: :meth:`plan_library` again); keep the planned buffers (in place)."""
        self.plan_library(plan)

    def _forward_reference(self, inputs: DecodeInputs) -> DecodeOutput:
        from .decode import sparse_mla_decode

        out, lse = sparse_mla_decode(
            inputs.q, inputs.kv_cache, self.layout, inputs.indices, inputs.softmax_scale,
            inputs.attn_sink, inputs.topk_length,
            extra_cache=inputs.extra_kv_cache, extra_indices=inputs.extra_indices,
            extra_topk_length=inputs.extra_topk_length,
        )
        import torch

        # bf16 like every kernel's output, so callers see one dtype whatever ran.
        return DecodeOutput(out.to(torch.bfloat16), lse)

    def _cached_view(self, cache: "torch.Tensor", make: Any) -> Any:
        """``make(cache)`` made once per cache tensor (:func:`~dsv4sel.kernels.plan.memo_view`)."""
        return memo_view(self._views, cache, make)
