"""The shared contract of the DeepSeek-V4 / V4.1 sparse-MLA attention impls.

Every impl (FlashMLA, FlashInfer, AITER, torch reference, the V4.1 impls) is a
:class:`SparseMLAImpl`:

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
* ``forward_decode(q, kv_cache, indices, *, softmax_scale, ...) -> DecodeOutput``
  is ``plan`` + ``run`` in one call: it runs the library kernel. When the library is missing or the device is
  wrong it raises :class:`KernelUnavailableError`, unless the impl was built
  with ``fallback="reference"``, the explicit opt-in to the torch reference.
  The reference reads only layouts with a codec (``layout.has_codec``); for
  the DeepSeek-V4.1 records the error is raised even with that opt-in.

Outputs follow :mod:`dsv4sel.kernels.reference`: ``out`` bf16
``[b, s_q, h, 512]``; ``lse`` float32 ``[b, s_q, h]`` (natural log, no sink,
``+inf`` for rows with no token) or ``None`` where the library does not return it.

This module imports neither torch nor a kernel library.
"""

from __future__ import annotations

import importlib
import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, NamedTuple

from .decode import is_int_tensor, check_decode_args
from .errors import KernelUnavailableError, UnknownLayoutError, UnsupportedLayoutError
from .layouts import HEAD_DIM, Fp8E4m3RowLayout, KVCacheLayout, get_layout
from .platform import PLATFORMS, Capability, detect_platform, device_target, format_capability, parse_capability

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DecodeInputs",
    "DecodeOutput",
    "DecodePlan",
    "SparseMLAImpl",
    "KernelUnavailableError",
    "UnknownLayoutError",
    "UnsupportedLayoutError",
    "FALLBACKS",
]

FALLBACKS: frozenset[str] = frozenset({"error", "reference"})


class DecodeOutput(NamedTuple):
    """What ``forward_decode`` returns."""

    out: "torch.Tensor"
    lse: "torch.Tensor | None"


@dataclass(frozen=True, eq=False)  # holds tensors: identity, not value, equality
class DecodeInputs:
    """The arguments of one ``forward_decode`` call, validated for shape."""

    q: "torch.Tensor"
    kv_cache: "torch.Tensor"
    indices: "torch.Tensor"
    softmax_scale: float
    attn_sink: "torch.Tensor | None" = None
    topk_length: "torch.Tensor | None" = None
    extra_kv_cache: "torch.Tensor | None" = None
    extra_indices: "torch.Tensor | None" = None
    extra_topk_length: "torch.Tensor | None" = None
    seq_lens: "torch.Tensor | None" = None

    @property
    def batch(self) -> int:
        return int(self.q.shape[0])

    @property
    def seq_q(self) -> int:
        return int(self.q.shape[1])

    @property
    def heads(self) -> int:
        return int(self.q.shape[2])


def _validate(inputs: DecodeInputs) -> None:
    """Shape and dtype checks that need no device sync (:func:`~dsv4sel.kernels.decode.check_decode_args`)."""
    check_decode_args(inputs.q, inputs.indices, inputs.softmax_scale, inputs.attn_sink, inputs.topk_length,
                      inputs.extra_kv_cache, inputs.extra_indices, inputs.extra_topk_length, inputs.seq_lens,
                      extra_cache_name="extra_kv_cache")


#: How the "cannot run here" reasons name each platform's hardware and its capability.
_PLATFORM_HARDWARE = {"cuda": "NVIDIA GPUs", "rocm": "AMD GPUs", "xpu": "Intel GPUs"}
_CAPABILITY_WORDS = {"cuda": "CUDA compute capability", "rocm": "ROCm GPU architecture"}


class SparseMLAImpl:
    """Base class: availability, construction, cache helpers, and dispatch.

    Subclasses set the class attributes (``targets`` says where the kernel
    runs, read by :meth:`_target_reason`) and implement ``_import_library``,
    ``_library_missing_reason`` (+ optionally ``_entry_point_reason``),
    ``_plan_library`` (optional) and ``_run_library``.
    """

    impl_name: ClassVar[str] = "SparseMLAImpl"
    #: The importable module the impl calls (for messages).
    library_name: ClassVar[str] = ""
    #: Layout names the impl can read on at least one GPU generation.
    supported_layouts: ClassVar[frozenset[str]] = frozenset()
    #: Where the kernel runs: platform -> the GPU generations it is built for,
    #: each a major (``9`` is every SM9x) or an exact ``(major, minor)``
    #: (``(9, 4)`` is gfx942). None: every platform and capability torch runs on.
    targets: ClassVar[Mapping[str, frozenset] | None] = None
    #: The kernel as the "cannot run here" reasons name it, e.g. "FlashMLA sparse decode".
    kernel_label: ClassVar[str] = ""
    #: What the kernel needs, completing "<kernel_label> ...", e.g. "is built for SM90 and SM100".
    built_for: ClassVar[str] = ""
    #: Added after "this GPU is X.Y" on a GPU it is not built for, e.g. " (on SM90 use FlashMLA)".
    other_gpu_hint: ClassVar[str] = ""

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layout={self.layout.name!r}, block_size={self.block_size}, fallback={self.fallback!r})"

    # -- availability ----------------------------------------------------
    @classmethod
    def _target_reason(cls, platform: str, capability: Capability | None) -> str | None:
        """Why the impl cannot run on this target, or None if it can: read from
        :attr:`targets` (a subclass may override it for a rule no table says)."""
        if cls.targets is None:
            return None
        if platform not in cls.targets:
            where = ", ".join(f"{_PLATFORM_HARDWARE.get(p, p)} (platform {p})" for p in cls.targets)
            return f"{cls.kernel_label} runs on {where}, not {platform}"
        if capability is None:
            return f"no {_CAPABILITY_WORDS.get(platform, platform + ' capability')} known; {cls.kernel_label} {cls.built_for}"
        generations = cls.targets[platform]
        if capability[0] not in generations and tuple(capability) not in generations:
            return f"{cls.kernel_label} {cls.built_for}; this GPU is {format_capability(capability)}{cls.other_gpu_hint}"
        return None

    @classmethod
    def _import_library(cls) -> Any:
        """Import and return the kernel entry point's module (may raise anything)."""
        raise NotImplementedError

    @classmethod
    def _library_missing_reason(cls, exc: BaseException) -> str:
        """The message for a failed import: what to install."""
        raise NotImplementedError

    @classmethod
    def _entry_point_reason(cls, module: Any, capability: Capability | None) -> str | None:
        """Why the imported ``module`` cannot serve ``capability``, or None if it can.

        For entry points whose required arguments depend on the GPU generation
        (e.g. a keyword only newer library releases accept). Never raises.
        """
        return None

    @classmethod
    def _library_label(cls, module: Any) -> str:
        """How ``is_available`` names the imported library (name and version)."""
        version = getattr(module, "__version__", None)
        return f"{cls.library_name}{' ' + str(version) if version else ''}"

    @classmethod
    def _library(cls) -> tuple[Any, str | None]:
        """``(module, None)`` or ``(None, reason)``; never raises."""
        try:
            return cls._import_library(), None
        except Exception as exc:  # a broken install can raise OSError, RuntimeError, ...
            return None, cls._library_missing_reason(exc)

    @classmethod
    def is_available(cls, platform: str | None = None, capability: Any = None) -> tuple[bool, str]:
        """Can this impl run on (platform, capability)? ``None`` = this machine. Never raises."""
        try:
            if platform is None:
                detected, detected_cap = detect_platform()
                platform = detected
                if capability is None:
                    capability = detected_cap
            cap = parse_capability(capability)
            reason = cls._target_reason(platform, cap)
            if reason is not None:
                return False, reason
            module, reason = cls._library()
            if reason is None:
                reason = cls._entry_point_reason(module, cap)
            if reason is not None:
                return False, reason
            where = f"{platform}" + (f" {cap[0]}.{cap[1]}" if cap else "")
            return True, f"{cls._library_label(module)} importable; {where} supported"
        except Exception as exc:
            return False, f"availability check failed: {type(exc).__name__}: {exc}"

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

        Argument meanings are those of :func:`dsv4sel.kernels.reference.sparse_mla_decode`
        (``extra_kv_cache`` there is ``extra_cache``); ``seq_lens`` (int ``[b]``,
        tokens in each request's sequence) is needed only by FlashInfer on SM10x.

        This is :meth:`plan` then :meth:`run`: it pays for planning on every
        call. A serving engine plans once per step and runs every layer with
        that plan (see :meth:`plan`).
        """
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
        return self._run(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)

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
        for name, value in (("batch", batch), ("heads", heads), ("topk", topk), ("seq_q", seq_q)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if extra_topk is not None and (isinstance(extra_topk, bool) or not isinstance(extra_topk, int) or extra_topk <= 0):
            raise ValueError(f"extra_topk must be a positive int or None, got {extra_topk!r}")
        if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
            raise ValueError(f"softmax_scale must be a float, got {softmax_scale!r}")
        if extra_topk_length is not None and extra_topk is None:
            raise ValueError("extra_topk_length needs extra_topk")
        if device is None:
            given = [t for t in (topk_length, extra_topk_length, seq_lens) if t is not None]
            if not given:
                raise ValueError("plan() needs device= when no length tensor is given")
            device = given[0].device
        import torch

        for name, t in (("topk_length", topk_length), ("extra_topk_length", extra_topk_length), ("seq_lens", seq_lens)):
            if t is not None and (not is_int_tensor(t, torch) or tuple(t.shape) != (batch,)):
                raise ValueError(f"{name} must be an integer [{batch}] tensor, got {getattr(t, 'shape', t)!r}")
        if extra_block_size is not None:
            _check_positive_int("extra_block_size", extra_block_size)
        plan = self._make_plan(
            batch=batch, seq_q=seq_q, heads=heads, topk=topk, extra_topk=extra_topk,
            softmax_scale=float(softmax_scale), topk_length=topk_length, extra_topk_length=extra_topk_length,
            seq_lens=seq_lens, device=torch.device(device), extra_block_size=extra_block_size,
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
            self._replan_library(plan)
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
        if plan is None:
            raise ValueError(f"{self.impl_name}.run() needs a plan: call plan() first")
        if plan.impl_name != self.impl_name:
            raise ValueError(f"a plan of {plan.impl_name} cannot be run by {self.impl_name}")
        # torch.Size compares with a tuple in C: these checks cost well under a microsecond.
        if q.shape != plan.q_shape:
            raise ValueError(f"q must be {list(plan.q_shape)} as planned, got {tuple(q.shape)}")
        if indices.shape != plan.indices_shape:
            raise ValueError(f"indices must be {list(plan.indices_shape)} as planned, got {tuple(indices.shape)}")
        if extra_indices is None:
            if plan.extra_topk is not None or extra_kv_cache is not None:
                raise ValueError("extra_kv_cache and extra_indices must be given exactly when the plan has extra_topk")
        elif extra_indices.shape != plan.extra_indices_shape or extra_kv_cache is None:
            if plan.extra_topk is None or extra_kv_cache is None:
                raise ValueError("extra_kv_cache and extra_indices must be given exactly when the plan has extra_topk")
            raise ValueError(
                f"extra_indices must be {list(plan.extra_indices_shape)} as planned, got {tuple(extra_indices.shape)}"
            )
        if attn_sink is not None and attn_sink.shape != plan.sink_shape:
            raise ValueError(f"attn_sink must be a [{plan.heads}] tensor, got {tuple(attn_sink.shape)}")
        if plan.library is None:
            return self._run(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)
        return self._run_library(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)

    # -- plan / run internals ---------------------------------------------
    def _resolve(self, device: Any) -> tuple[Any, Capability | None, str | None]:
        """(library module, capability, None) or (None, capability, why not)."""
        platform, capability = device_target(device)
        platform = self.platform or platform
        capability = self.capability or capability
        reason = self._target_reason(platform, capability)
        module = None
        if reason is None:
            module, reason = self._library()
        if reason is None:
            reason = self._entry_point_reason(module, capability)
        return (module if reason is None else None), capability, reason

    def _make_plan(self, *, batch: int, seq_q: int, heads: int, topk: int, extra_topk: int | None,
                   softmax_scale: float, topk_length: Any, extra_topk_length: Any, seq_lens: Any,
                   device: Any, extra_block_size: int | None) -> "DecodePlan":
        import torch

        def i32(t: Any) -> Any:
            return None if t is None else t.to(device=device, dtype=torch.int32).clone()

        module, capability, reason = self._resolve(device)
        if reason is not None:
            if self.fallback == "reference" and not self.layout.has_codec:
                # The reference dequantizes through the layout; an opaque record
                # would only fail deeper down with a less useful error.
                reason += (
                    f"; fallback='reference' cannot stand in: the torch reference cannot read "
                    f"{self.layout.name} (dsv4sel has no verified codec for it)"
                )
                raise KernelUnavailableError(self.impl_name, reason)
            if self.fallback != "reference":
                raise KernelUnavailableError(self.impl_name, reason)
            if not self._fallback_logged:
                import logging

                logging.getLogger(__name__).warning(
                    "%s: %s; running the torch reference decode (fallback='reference')", self.impl_name, reason
                )
                self._fallback_logged = True
        plan = DecodePlan(
            impl_name=self.impl_name, batch=batch, seq_q=seq_q, heads=heads, topk=topk, extra_topk=extra_topk,
            softmax_scale=softmax_scale, device=device, capability=capability, library=module,
            topk_length=i32(topk_length), extra_topk_length=i32(extra_topk_length), seq_lens=i32(seq_lens),
            block_size=self.block_size, extra_block_size=extra_block_size or self.block_size,
        )
        if module is not None:
            self._plan_library(plan)
        return plan

    def _run(self, plan: "DecodePlan", q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
             extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        if plan.library is None:
            return self._forward_reference(DecodeInputs(
                q, kv_cache, indices, plan.softmax_scale, attn_sink, plan.topk_length,
                extra_kv_cache, extra_indices, plan.extra_topk_length, plan.seq_lens,
            ))
        return self._run_library(plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)

    def _plan_library(self, plan: "DecodePlan") -> None:
        """Fill ``plan.state`` with what the library call needs besides the per-layer tensors."""

    def _replan_library(self, plan: "DecodePlan") -> None:
        """Refresh ``plan.state`` after :meth:`replan` copied new lengths (in place)."""
        self._plan_library(plan)

    def _run_library(self, plan: "DecodePlan", q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                     extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        raise NotImplementedError

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
        """``make(cache)`` memoized on the cache's storage, shape and strides (per impl, a few entries).

        Views of the same cache are then built once, not on every run.
        """
        key = (cache.data_ptr(), cache.shape, cache.stride(), cache.dtype)  # device: UVA pointers are unique
        views = self._views
        view = views.get(key)
        if view is None:
            view = make(cache)
            if len(views) >= 16:
                views.clear()
            views[key] = view
        return view


@dataclass(eq=False)
class DecodePlan:
    """What :meth:`SparseMLAImpl.plan` fixed for one batch shape.

    ``topk_length``, ``extra_topk_length`` and ``seq_lens`` are the plan's own
    int32 copies on ``device`` (:meth:`SparseMLAImpl.replan` updates them in
    place). ``library`` is the kernel module, or None when the plan runs the
    torch reference (``fallback="reference"``). ``state`` holds what the impl
    prepared (scheduler metadata, buffers).
    """

    impl_name: str
    batch: int
    seq_q: int
    heads: int
    topk: int
    extra_topk: "int | None"
    softmax_scale: float
    device: Any
    capability: "Capability | None"
    library: Any
    topk_length: "torch.Tensor | None"
    extra_topk_length: "torch.Tensor | None"
    seq_lens: "torch.Tensor | None"
    block_size: int
    extra_block_size: int
    state: dict = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        # The shapes run() checks, as tuples (compared against torch.Size in C).
        self.q_shape = (self.batch, self.seq_q, self.heads, HEAD_DIM)
        self.indices_shape = (self.batch, self.seq_q, self.topk)
        self.extra_indices_shape = None if self.extra_topk is None else (self.batch, self.seq_q, self.extra_topk)
        self.sink_shape = (self.heads,)


def _check_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def import_attr_module(*candidates: str, attr: str) -> Any:
    """Import the first module in ``candidates`` that has ``attr``; return the module.

    Raises the last ImportError / AttributeError when none has it.
    """
    last: BaseException | None = None
    for name in candidates:
        try:
            module = importlib.import_module(name)
        except ImportError as exc:
            last = exc
            continue
        if hasattr(module, attr):
            return module
        last = AttributeError(f"module {name!r} has no attribute {attr!r}")
    assert last is not None
    raise last


def pad_heads(t: "torch.Tensor", dim: int, target: int, value: float = 0.0) -> "torch.Tensor":
    """``t`` padded with ``value`` along ``dim`` to size ``target`` (no copy if already there)."""
    import torch

    have = t.shape[dim]
    if have == target:
        return t
    shape = list(t.shape)
    shape[dim] = target - have
    return torch.cat([t, torch.full(shape, value, dtype=t.dtype, device=t.device)], dim=dim)


def padded_heads(heads: int, allowed: tuple[int, ...], impl: str) -> int:
    """The smallest allowed head count >= ``heads``; ValueError naming ``allowed`` if none."""
    for n in sorted(allowed):
        if heads <= n:
            return n
    raise ValueError(f"{impl}: {heads} query heads; the kernel requires h_q in {{{', '.join(map(str, allowed))}}}")
