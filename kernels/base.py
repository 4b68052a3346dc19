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
* ``forward_decode(q, kv_cache, indices, *, softmax_scale, ...) -> DecodeOutput``
  runs the library kernel. When the library is missing or the device is
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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from .errors import KernelUnavailableError, UnknownLayoutError, UnsupportedLayoutError
from .layouts import HEAD_DIM, Fp8E4m3RowLayout, KVCacheLayout, get_layout
from .platform import PLATFORMS, Capability, detect_platform, device_target, parse_capability

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DecodeInputs",
    "DecodeOutput",
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


def _is_int_tensor(t: Any, torch: Any) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


def _validate(inputs: DecodeInputs) -> None:
    """Shape and dtype checks that need no device sync."""
    import torch

    q = inputs.q
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[-1] != HEAD_DIM or not q.is_floating_point():
        raise ValueError(f"q must be a floating [b, s_q, h, {HEAD_DIM}] tensor, got {getattr(q, 'shape', q)!r}")
    b, s, h = q.shape[:3]
    for name in ("indices", "extra_indices"):
        t = getattr(inputs, name)
        if t is None:
            continue
        if not _is_int_tensor(t, torch) or t.dim() != 3 or tuple(t.shape[:2]) != (b, s):
            raise ValueError(f"{name} must be an integer [{b}, {s}, topk] tensor, got {getattr(t, 'shape', t)!r}")
    for name in ("topk_length", "extra_topk_length", "seq_lens"):
        t = getattr(inputs, name)
        if t is not None and (not _is_int_tensor(t, torch) or tuple(t.shape) != (b,)):
            raise ValueError(f"{name} must be an integer [{b}] tensor, got {getattr(t, 'shape', t)!r}")
    sink = inputs.attn_sink
    if sink is not None and (not isinstance(sink, torch.Tensor) or tuple(sink.shape) != (h,)):
        raise ValueError(f"attn_sink must be a [{h}] tensor, got {getattr(sink, 'shape', sink)!r}")
    if (inputs.extra_kv_cache is None) != (inputs.extra_indices is None):
        raise ValueError("extra_kv_cache and extra_indices must be given together")
    if inputs.extra_topk_length is not None and inputs.extra_indices is None:
        raise ValueError("extra_topk_length needs extra_indices")
    if isinstance(inputs.softmax_scale, bool) or not isinstance(inputs.softmax_scale, (int, float)):
        raise ValueError(f"softmax_scale must be a float, got {inputs.softmax_scale!r}")


class SparseMLAImpl:
    """Base class: availability, construction, cache helpers, and dispatch.

    Subclasses set the class attributes and implement ``_target_reason``,
    ``_import_library`` (+ optionally ``_library_reason``) and ``_forward_library``.
    """

    impl_name: ClassVar[str] = "SparseMLAImpl"
    #: The importable module the impl calls (for messages).
    library_name: ClassVar[str] = ""
    #: Layout names the impl can read on at least one GPU generation.
    supported_layouts: ClassVar[frozenset[str]] = frozenset()

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

    def __repr__(self) -> str:
        return f"{type(self).__name__}(layout={self.layout.name!r}, block_size={self.block_size}, fallback={self.fallback!r})"

    # -- availability ----------------------------------------------------
    @classmethod
    def _target_reason(cls, platform: str, capability: Capability | None) -> str | None:
        """Why the impl cannot run on this target, or None if it can."""
        raise NotImplementedError

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
            version = getattr(module, "__version__", None)
            where = f"{platform}" + (f" {cap[0]}.{cap[1]}" if cap else "")
            return True, f"{cls.library_name}{' ' + str(version) if version else ''} importable; {where} supported"
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
        """Sparse decode over the cache slots in ``indices`` (and ``extra_indices``).

        Argument meanings are those of :func:`dsv4sel.kernels.reference.sparse_mla_decode`
        (``extra_kv_cache`` there is ``extra_cache``); ``seq_lens`` (int ``[b]``,
        tokens in each request's sequence) is needed only by FlashInfer on SM10x.
        """
        inputs = DecodeInputs(
            q, kv_cache, indices, softmax_scale, attn_sink, topk_length,
            extra_kv_cache, extra_indices, extra_topk_length, seq_lens,
        )
        _validate(inputs)
        self._check_block_size(kv_cache)
        if extra_kv_cache is not None:
            self.layout.block_size_of(extra_kv_cache)
        platform, capability = device_target(q.device)
        platform = self.platform or platform
        capability = self.capability or capability
        reason = self._target_reason(platform, capability)
        module = None
        if reason is None:
            module, reason = self._library()
        if reason is None:
            reason = self._entry_point_reason(module, capability)
        if reason is None:
            return self._forward_library(module, capability, inputs)
        if self.fallback == "reference" and not self.layout.has_codec:
            # The reference dequantizes through the layout; an opaque record
            # would only fail deeper down with a less useful error.
            reason += (
                f"; fallback='reference' cannot stand in: the torch reference cannot read "
                f"{self.layout.name} (dsv4sel has no verified codec for it)"
            )
        elif self.fallback == "reference":
            if not self._fallback_logged:
                import logging

                logging.getLogger(__name__).warning(
                    "%s: %s; running the torch reference decode (fallback='reference')", self.impl_name, reason
                )
                self._fallback_logged = True
            return self._forward_reference(inputs)
        raise KernelUnavailableError(self.impl_name, reason)

    def _forward_library(self, lib: Any, capability: Capability | None, inputs: DecodeInputs) -> DecodeOutput:
        raise NotImplementedError

    def _forward_reference(self, inputs: DecodeInputs) -> DecodeOutput:
        from .reference import sparse_mla_decode

        out, lse = sparse_mla_decode(
            inputs.q, inputs.kv_cache, self.layout, inputs.indices, inputs.softmax_scale,
            inputs.attn_sink, inputs.topk_length,
            extra_cache=inputs.extra_kv_cache, extra_indices=inputs.extra_indices,
            extra_topk_length=inputs.extra_topk_length,
        )
        import torch

        # bf16 like every kernel's output, so callers see one dtype whatever ran.
        return DecodeOutput(out.to(torch.bfloat16), lse)


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
