"""DeepSeek-V4.1 sparse-MLA impls: FlashMLA, FlashInfer and FlashMLA mega-attention.

The V4.1 rules name three impls, one per vLLM backend:

``DeepseekV41FlashMLASparseImpl`` (``FLASHMLA_SPARSE_DSV41``; CUDA SM90, SM10x)
    Reads ``fp8_ds_mla_v41`` (528 B/token) on SM10x and ``fp8_ds_mla``
    (584 B/token) on SM90: FlashMLA decodes V4.1's record only in its SM100
    kernels, so vLLM 0.33 keeps V4's record on Hopper. ``is_available`` checks
    the target and that ``flash_mla`` imports. ``forward_decode`` always raises
    :class:`KernelUnavailableError`: FlashMLA's V4.1 decode has no documented
    Python API, so there is nothing to map arguments to.
``DeepseekV41FlashInferMLASparseImpl`` (``FLASHINFER_MLA_SPARSE_DSV41``; SM10x, SM12x)
    Exactly the V4 mappings of :mod:`dsv4sel.kernels.flashinfer`: SM10x reads
    ``bf16_row`` / ``fp8_e4m3_row`` (TRTLLM-gen), SM12x reads V4's 584-byte
    ``fp8_ds_mla`` record (packed sparse, FlashInfer's default
    ``kv_cache_format``, as vLLM 0.33's SM120 V4.1 layer calls it; V4.1's
    528-byte record is written on SM100 only).
``DeepseekV41MegaAttnImpl`` (``FLASHMLA_MEGA_ATTN_DSV41``; SM10x only)
    Reads ``fp8_ds_mla_v41`` (main / sliding-window cache) and ``nvfp4_ds_mla``
    (288 B/token compressed cache). ``is_available`` checks the target and
    that the torch op ``torch.ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode``
    is registered; it is also the probe of the rules' ``mega_attn`` input
    (``dsv4sel doctor``: available -> ``mega_attn=available``).
    ``forward_decode`` always raises :class:`KernelUnavailableError`: the op's
    arguments are not documented here.

``DeepseekV41ROCMAiterMLASparseImpl`` (``ROCM_FLASHMLA_SPARSE_DSV41``; ROCm)
    Reads ``fp8_ds_mla`` (584 B/token: off SM100, V4.1 keeps the V4 record).
    ``is_available`` checks the target and that ``aiter.mla`` imports;
    ``forward_decode`` always raises :class:`KernelUnavailableError`: vLLM's
    V4.1 ROCm layer runs its own Triton decode, which has no public API.

``is_available`` answers whether the *kernel library* can run on the target,
which is what vLLM needs and what ``dsv4sel doctor`` reports; for the two
impls without an adapter its reason says that dsv4sel itself cannot call it.

The V4.1 layouts have no verified codec (:class:`~dsv4sel.kernels.layouts.OpaqueRecordLayout`):
``write_kv`` raises :class:`UnsupportedLayoutError`, and ``fallback="reference"``
does not run the torch reference on them (the reference cannot read them);
``KernelUnavailableError`` is raised instead. On ``bf16_row``, ``fp8_e4m3_row``
and ``fp8_ds_mla`` the FlashInfer impl's reference fallback works as for V4.

Importing this module imports neither torch nor a kernel library.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from .base import DecodeOutput, DecodePlan, KernelUnavailableError, SparseMLAImpl
from .errors import UnsupportedLayoutError
from .flashinfer import DeepseekV4FlashInferMLASparseImpl
from .flashmla import UsesFlashMLABuild, load_vllm_flashmla
from .platform import Capability

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DeepseekV41FlashMLASparseImpl",
    "DeepseekV41FlashInferMLASparseImpl",
    "DeepseekV41MegaAttnImpl",
    "DeepseekV41ROCMAiterMLASparseImpl",
    "MEGA_OP_NAMESPACE",
    "MEGA_OP",
    "MEGA_OP_PROVIDERS",
]

#: The mega-attention decode op: ``torch.ops.<namespace>.<op>``.
MEGA_OP_NAMESPACE = "_flashmla_C"
MEGA_OP = "fused_norm_rope_attn_rope_cast_decode"
#: Modules that may register ``torch.ops._flashmla_C`` ops when imported:
#: FlashMLA's package and vLLM's build of FlashMLA (loaded as
#: :func:`dsv4sel.kernels.flashmla.load_vllm_flashmla` loads it: from
#: ``$DSV4SEL_VLLM_FLASHMLA_DIR`` or the installed vLLM, without importing vLLM). Which one carries the mega
#: op depends on the build; importing one that does not is harmless. Imported
#: only when the op is not registered yet and the target is an SM10x GPU.
MEGA_OP_PROVIDERS: tuple[str, ...] = ("flash_mla", "vllm._flashmla_C")

#: FlashInfer V4.1 layouts by GPU major, the same as V4's: SM10x plain rows, SM12x V4's 584-byte
#: fp8_ds_mla record. vLLM 0.33 writes V4.1's 528-byte record on SM100 only (its
#: ``_use_v41_mxfp8_kv_record``), where FlashInfer reads plain rows, so FlashInfer never sees it.
_FI_LAYOUTS_BY_MAJOR: Mapping[int, frozenset[str]] = {
    10: frozenset({"bf16_row", "fp8_e4m3_row"}),
    12: frozenset({"fp8_ds_mla"}),
}

#: FlashMLA V4.1 layouts by GPU major: V4.1's 528-byte record is decoded by the SM100 kernels
#: only; on SM90 vLLM 0.33 keeps V4's 584-byte record (``_use_v41_mxfp8_kv_record``).
_FLASHMLA_LAYOUTS_BY_MAJOR: Mapping[int, frozenset[str]] = {
    9: frozenset({"fp8_ds_mla"}),
    10: frozenset({"fp8_ds_mla_v41"}),
}

_NO_FLASHMLA_ADAPTER = (
    "dsv4sel has no adapter for FlashMLA's V4.1 decode: its Python API is not documented; "
    "vLLM's own DeepSeek-V4.1 layer calls it"
)
_NO_ROCM_ADAPTER = (
    "dsv4sel has no adapter for vLLM's DeepSeek-V4.1 ROCm decode (its Triton kernels have no public API); "
    "vLLM's own layer (ROCM_FLASHMLA_SPARSE_DSV41) calls them"
)
_NO_MEGA_ADAPTER = (
    f"dsv4sel has no adapter for FlashMLA's V4.1 mega-attention decode: the arguments of "
    f"torch.ops.{MEGA_OP_NAMESPACE}.{MEGA_OP} are not documented; vLLM's own DeepSeek-V4.1 layer "
    "(FLASHMLA_MEGA_ATTN_DSV41) calls it"
)


class _WithoutDecodeAdapter(SparseMLAImpl, abstract=True):
    """An impl whose library dsv4sel can probe but not call.

    ``is_available`` is the base class's library check, with the missing
    adapter noted in the reason when the library is there. ``forward_decode``
    always raises :class:`KernelUnavailableError` with :attr:`no_adapter_reason`.
    """

    #: Why forward_decode cannot call the library.
    no_adapter_reason: ClassVar[str] = ""

    @classmethod
    def is_available(cls, platform: str | None = None, capability: Any = None) -> tuple[bool, str]:
        """Can the kernel library run on (platform, capability)? Never raises.

        True means vLLM can use the kernel here; dsv4sel's own
        ``forward_decode`` still cannot, and the reason says so.
        """
        ok, reason = super().is_available(platform, capability)
        if ok:
            reason = f"{reason}; note: {cls.no_adapter_reason}"
        return ok, reason

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
        """Always raises :class:`KernelUnavailableError` (with ``fallback="reference"`` too).

        No library call exists to map the arguments to, and the torch
        reference cannot read the V4.1 records, so no result can be honest.
        """
        raise KernelUnavailableError(self.impl_name, self._no_decode_reason())

    def plan(self, **kwargs: Any) -> DecodePlan:  # type: ignore[override]
        """Always raises :class:`KernelUnavailableError`, as :meth:`forward_decode` does."""
        raise KernelUnavailableError(self.impl_name, self._no_decode_reason())

    def run_library(self, plan: DecodePlan, *args: Any) -> DecodeOutput:
        raise KernelUnavailableError(self.impl_name, self._no_decode_reason())

    def _no_decode_reason(self) -> str:
        reason = self.no_adapter_reason
        if self.fallback == "reference" and not self.layout.has_codec:
            reason += (
                f"; fallback='reference' cannot stand in: the torch reference cannot read "
                f"{self.layout.name} (dsv4sel has no verified codec for it)"
            )
        return reason


class DeepseekV41FlashMLASparseImpl(UsesFlashMLABuild, _WithoutDecodeAdapter):
    """DeepSeek-V4.1 sparse decode through FlashMLA (SM90, SM10x): availability only.

    The record depends on the GPU: V4.1's 528-byte ``fp8_ds_mla_v41`` on SM10x,
    V4's 584-byte ``fp8_ds_mla`` on SM90 (FlashMLA decodes V4.1's record in its
    SM100 kernels only).
    """

    impl_name: ClassVar[str] = "DeepseekV41FlashMLASparseImpl"
    #: The record the kernels read, by GPU major; checked when the impl is given a CUDA capability.
    layouts_by_major: ClassVar[Mapping[int, frozenset[str]]] = _FLASHMLA_LAYOUTS_BY_MAJOR
    supported_layouts: ClassVar[frozenset[str]] = frozenset().union(*_FLASHMLA_LAYOUTS_BY_MAJOR.values())
    targets: ClassVar[Mapping[str, frozenset]] = {"cuda": frozenset(_FLASHMLA_LAYOUTS_BY_MAJOR)}
    kernel_label: ClassVar[str] = "FlashMLA DeepSeek-V4.1 sparse decode"
    built_for: ClassVar[str] = "is built for SM90 and the SM100 family"
    other_gpu_hint: ClassVar[str] = " (on SM12x use FLASHINFER_MLA_SPARSE_DSV41)"
    no_adapter_reason: ClassVar[str] = _NO_FLASHMLA_ADAPTER

    def __init__(self, layout: str, block_size: int, **kwargs: Any) -> None:
        """As :class:`~dsv4sel.kernels.base.SparseMLAImpl`; with a CUDA ``capability`` the layout
        must be the record that GPU's kernels read (the two records differ in size, so a cache of
        the other one would be addressed wrongly)."""
        super().__init__(layout, block_size, **kwargs)
        readable = None
        if self.capability is not None and self.platform in (None, "cuda"):
            readable = self.layouts_by_major.get(self.capability[0])
        if readable is not None and self.capability is not None and self.layout.name not in readable:
            raise UnsupportedLayoutError(
                f"{self.impl_name}: on SM{self.capability[0]}x FlashMLA's V4.1 kernels read "
                f"{', '.join(sorted(readable))}, not {self.layout.name}"
            )


class DeepseekV41FlashInferMLASparseImpl(DeepseekV4FlashInferMLASparseImpl):
    """DeepSeek-V4.1 sparse decode through ``trtllm_batch_decode_sparse_mla_dsv4``.

    The V4 call, unchanged: SM10x the TRTLLM-gen mapping on plain rows, SM12x
    the packed mapping on ``fp8_ds_mla`` pages with FlashInfer's default
    ``kv_cache_format`` (V4's record, which V4.1 keeps off SM100). Constructor
    arguments: see :class:`~dsv4sel.kernels.flashinfer.DeepseekV4FlashInferMLASparseImpl`.
    """

    impl_name: ClassVar[str] = "DeepseekV41FlashInferMLASparseImpl"
    layouts_by_major: ClassVar[Mapping[int, frozenset[str]]] = _FI_LAYOUTS_BY_MAJOR
    targets: ClassVar[Mapping[str, frozenset]] = {"cuda": frozenset(_FI_LAYOUTS_BY_MAJOR)}
    kernel_label: ClassVar[str] = "FlashInfer DeepSeek-V4.1 sparse decode"
    supported_layouts: ClassVar[frozenset[str]] = frozenset().union(*_FI_LAYOUTS_BY_MAJOR.values())


class _MegaOpMissing(ImportError):
    """The mega-attention op is not registered in this process."""


class DeepseekV41MegaAttnImpl(_WithoutDecodeAdapter):
    """FlashMLA's DeepSeek-V4.1 mega-attention (SM10x): availability and the ``mega_attn`` probe.

    ``is_available()`` is True exactly when the target is a CUDA SM10x GPU and
    ``torch.ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode`` is
    registered, after importing the :data:`MEGA_OP_PROVIDERS` that are
    installed. It never raises, also without torch.
    """

    impl_name: ClassVar[str] = "DeepseekV41MegaAttnImpl"
    library_name: ClassVar[str] = f"torch.ops.{MEGA_OP_NAMESPACE}.{MEGA_OP}"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla_v41", "nvfp4_ds_mla"})
    no_adapter_reason: ClassVar[str] = _NO_MEGA_ADAPTER
    targets: ClassVar[Mapping[str, frozenset]] = {"cuda": frozenset({10})}
    kernel_label: ClassVar[str] = "FlashMLA mega attention"
    built_for: ClassVar[str] = "requires sm_10x GPUs"

    @staticmethod
    def _lookup(torch: Any) -> Any:
        try:
            # Resolving an unregistered op raises (AttributeError or RuntimeError by torch version).
            return getattr(getattr(torch.ops, MEGA_OP_NAMESPACE), MEGA_OP)
        except (AttributeError, RuntimeError):
            return None

    @classmethod
    def import_library(cls) -> Any:
        import torch

        op = cls._lookup(torch)
        tried = []
        for name in MEGA_OP_PROVIDERS:
            if op is not None:
                break
            try:
                if name == "vllm._flashmla_C":
                    load_vllm_flashmla()  # by path: vLLM's top-level package is not imported
                else:
                    importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - a compiled provider, absent or broken: the reason says which
                tried.append(f"{name}: {type(exc).__name__}")
                continue
            tried.append(f"{name}: imported")
            op = cls._lookup(torch)
        if op is None:
            raise _MegaOpMissing(", ".join(tried))
        return op

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        if isinstance(exc, _MegaOpMissing):
            return (
                f"{cls.library_name} is not registered (imports tried: {exc}): FlashMLA / vLLM's "
                "_flashmla_C is not installed, or was built without the mega attention ops"
            )
        return (
            f"torch is not importable ({type(exc).__name__}: {exc}): the mega-attention decode is the torch "
            f"custom op {cls.library_name}"
        )


class DeepseekV41ROCMAiterMLASparseImpl(_WithoutDecodeAdapter):
    """DeepSeek-V4.1 on ROCm (``ROCM_FLASHMLA_SPARSE_DSV41``): availability only.

    Off SM100 V4.1 stores the V4 record (``fp8_ds_mla``, 584 B/token). The target
    check follows the V4.0 ROCm impl (gfx942 / gfx950 for AITER's kernels).
    """

    impl_name: ClassVar[str] = "DeepseekV41ROCMAiterMLASparseImpl"
    library_name: ClassVar[str] = "aiter"
    supported_layouts: ClassVar[frozenset[str]] = frozenset({"fp8_ds_mla"})
    no_adapter_reason: ClassVar[str] = _NO_ROCM_ADAPTER

    @classmethod
    def target_reason(cls, platform: str, capability: Capability | None) -> str | None:
        from .rocm import DeepseekV4ROCMAiterMLASparseImpl

        return DeepseekV4ROCMAiterMLASparseImpl.target_reason(platform, capability)

    @classmethod
    def import_library(cls) -> Any:
        from .rocm import DeepseekV4ROCMAiterMLASparseImpl

        return DeepseekV4ROCMAiterMLASparseImpl.import_library()

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        from .rocm import DeepseekV4ROCMAiterMLASparseImpl

        return DeepseekV4ROCMAiterMLASparseImpl.library_missing_reason(exc)
