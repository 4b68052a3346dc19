"""FlashInfer DeepSeek-V4 sparse decode: TRTLLM-gen on SM10x, packed sparse on SM12x.

One entry point, ``trtllm_batch_decode_sparse_mla_dsv4`` (in ``flashinfer.mla``;
later FlashInfer mains also export it from ``flashinfer.decode``), with two
argument conventions picked by the GPU generation, as FlashInfer documents them:

SM10x (``bf16_row`` or ``fp8_e4m3_row``; TRTLLM-gen)
    ``query`` bf16, or fp8 e4m3 ``q / q_scale`` for ``fp8_e4m3_row`` (the kernel
    wants query and KV in one dtype); ``swa_kv_cache`` = this cache
    ``(num_blocks, block_size, 512)``, ``compressed_kv_cache`` = the extra cache
    (this cache again for a window-only layer); ``sparse_indices`` int32
    ``[b * s_q, 128 + extra]``: 128 window columns (``indices`` masked by
    ``topk_length`` and padded with -1) then the extra columns, padded with -1 to
    a multiple of 4; ``sparse_topk_lens`` int32 ``[b * s_q]`` = 128 + active
    extra columns; ``seq_lens`` int32 ``[b]`` (required: the kernel derives the
    128-token window from it); ``bmm1_scale = softmax_scale * q_scale *
    kv_scale``, ``bmm2_scale = kv_scale``; ``kv_layout="HND"``.
SM12x (``fp8_ds_mla``; packed sparse)
    ``query`` bf16; ``swa_kv_cache`` = uint8 ``(num_blocks, block_size, 584)``
    view with strides ``(page_bytes, 584, 1)``; ``sparse_indices`` int32
    ``[b, s_q, topk]`` with ``swa_topk_lens`` int32 ``[b * s_q]``; the extra
    cache as ``compressed_kv_cache`` + ``extra_sparse_indices`` +
    ``extra_sparse_topk_lens``; ``bmm1_scale = softmax_scale``, ``bmm2_scale = 1``.

Both: ``workspace_buffer`` is a zeroed uint8 buffer (128 MiB by default) kept per
device; ``sinks`` float32 ``[h]``; heads padded with zeros to 8, 16, 32, 64 or
128. FlashInfer returns no lse here, so ``DecodeOutput.lse`` is None.
There is no SM90 path: on an H200 use FlashMLA.

:class:`dsv4sel.kernels.v41.DeepseekV41FlashInferMLASparseImpl` reuses this
class for DeepSeek-V4.1 through the class attributes (``layouts_by_major``,
``kernel_label``, ``targets``) and ``_packed_format_kwargs``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from .base import DecodeOutput, DecodePlan, SparseMLAImpl, import_attr_module, padded_heads
from .decode import length_mask
from .errors import UnsupportedLayoutError
from .layouts import FP8_E4M3_MAX, Fp8E4m3RowLayout

__all__ = ["DeepseekV4FlashInferMLASparseImpl", "DeepseekV4FlashInferSM120Impl", "FLASHINFER_INSTALL_HINT",
           "SWA_COLUMNS"]

FLASHINFER_INSTALL_HINT = "pip install 'dsv4sel[flashinfer]' (flashinfer-python >= 0.6.14) with a CUDA build of torch"
ENTRY_POINT = "trtllm_batch_decode_sparse_mla_dsv4"
#: TRTLLM-gen's combined index table always starts with this many window columns.
SWA_COLUMNS = 128
FLASHINFER_HEADS: tuple[int, ...] = (8, 16, 32, 64, 128)
DEFAULT_WORKSPACE_BYTES = 128 << 20

#: Layouts by GPU major: SM10x reads plain rows, SM12x the packed fp8_ds_mla pages.
LAYOUTS_BY_MAJOR: dict[int, frozenset[str]] = {
    10: frozenset({"bf16_row", "fp8_e4m3_row"}),
    12: frozenset({"fp8_ds_mla"}),
}


class DeepseekV4FlashInferMLASparseImpl(SparseMLAImpl):
    """DeepSeek-V4 sparse decode through ``flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4``."""

    impl_name: ClassVar[str] = "DeepseekV4FlashInferMLASparseImpl"
    library_name: ClassVar[str] = "flashinfer"
    #: Layouts by GPU major (10: TRTLLM-gen plain rows, 12: packed pages).
    layouts_by_major: ClassVar[Mapping[int, frozenset[str]]] = LAYOUTS_BY_MAJOR
    supported_layouts: ClassVar[frozenset[str]] = frozenset().union(*LAYOUTS_BY_MAJOR.values())
    targets: ClassVar[Mapping[str, frozenset]] = {"cuda": frozenset(LAYOUTS_BY_MAJOR)}
    kernel_label: ClassVar[str] = "FlashInfer DeepSeek-V4 sparse decode"
    built_for: ClassVar[str] = "requires SM10x (TRTLLM-gen) or SM12x (packed sparse)"
    other_gpu_hint: ClassVar[str] = " (on SM90 use FlashMLA)"

    def __init__(
        self,
        layout: str,
        block_size: int,
        *,
        kv_scale: float = 1.0,
        q_scale: float = 1.0,
        workspace_bytes: int = DEFAULT_WORKSPACE_BYTES,
        fallback: str = "error",
        platform: str | None = None,
        capability: Any = None,
    ) -> None:
        """``q_scale`` quantizes the query for ``fp8_e4m3_row`` (vLLM fixes it at 1.0);
        ``workspace_bytes`` sizes FlashInfer's scratch buffer. Other args: see the base class."""
        super().__init__(
            layout, block_size, kv_scale=kv_scale, fallback=fallback, platform=platform, capability=capability
        )
        if not float(q_scale) > 0:
            raise ValueError(f"q_scale must be positive, got {q_scale!r}")
        if float(q_scale) != 1.0 and not isinstance(self.layout, Fp8E4m3RowLayout):
            raise ValueError("q_scale applies to fp8_e4m3_row only")
        self.q_scale = float(q_scale)
        self.workspace_bytes = int(workspace_bytes)
        self._workspaces: dict[Any, Any] = {}

    @classmethod
    def import_library(cls) -> Any:
        return import_attr_module("flashinfer.mla", "flashinfer.decode", attr=ENTRY_POINT)

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        return f"flashinfer.mla.{ENTRY_POINT} is not importable ({type(exc).__name__}: {exc}): {FLASHINFER_INSTALL_HINT}"

    def _workspace(self, device: Any) -> Any:
        import torch

        key = str(device)
        if key not in self._workspaces:
            self._workspaces[key] = torch.zeros(self.workspace_bytes, dtype=torch.uint8, device=device)
        return self._workspaces[key]

    # -- plan / run ---------------------------------------------------------
    def plan_library(self, plan: DecodePlan) -> None:
        import torch

        capability = plan.capability
        assert capability is not None  # target_reason guarantees it
        major = capability[0]
        readable = self.layouts_by_major[major]
        if self.layout.name not in readable:
            if major == 10:
                why = (
                    "SM10x uses the plain bf16 / per-tensor FP8 row layouts (bf16_row, fp8_e4m3_row), "
                    f"not {self.layout.name}"
                )
            else:
                why = f"SM12x reads only the packed {', '.join(sorted(readable))} layout"
            raise UnsupportedLayoutError(f"{self.impl_name}: {why}; got {self.layout.name}")
        st = plan.state
        st["fn"] = getattr(plan.library, ENTRY_POINT)
        st["major"] = major
        st["h_pad"] = h_pad = padded_heads(plan.heads, FLASHINFER_HEADS, self.impl_name)
        device, b, s = plan.device, plan.batch, plan.seq_q
        fp8_query = major == 10 and isinstance(self.layout, Fp8E4m3RowLayout)
        st["fp8_query"] = fp8_query
        if h_pad != plan.heads or fp8_query:
            dtype = torch.float8_e4m3fn if fp8_query else torch.bfloat16
            st["q_buf"] = torch.zeros((b, s, h_pad, 512), dtype=dtype, device=device)
        if h_pad != plan.heads:
            st["sink_buf"] = torch.zeros((h_pad,), dtype=torch.float32, device=device)
        st["workspace"] = self._workspace(device)
        if major == 10:
            if plan.seq_lens is None:
                raise ValueError(
                    f"{self.impl_name} on SM10x needs seq_lens (int [b], tokens per request): "
                    "TRTLLM-gen derives the 128-token window from it"
                )
            if plan.topk > SWA_COLUMNS:
                raise ValueError(f"TRTLLM-gen takes at most {SWA_COLUMNS} window indices, got {plan.topk}")
            extra_width = plan.extra_topk or 0
            width = SWA_COLUMNS + extra_width
            width += (-width) % 4
            # The combined index table: window columns, then extra columns, -1 everywhere else.
            st["table"] = torch.full((b, s, width), -1, dtype=torch.int32, device=device)
            kv_scale = getattr(self.layout, "scale", 1.0)
            q_scale = self.q_scale if fp8_query else 1.0
            st["kwargs"] = {
                "seq_lens": plan.seq_lens,
                "bmm1_scale": float(plan.softmax_scale) * q_scale * kv_scale,
                "bmm2_scale": float(kv_scale),
                "kv_layout": "HND",
            }
            st["topk_lens"] = torch.empty((b * s,), dtype=torch.int32, device=device)
        else:
            st["kwargs"] = {
                "bmm1_scale": float(plan.softmax_scale),
                "bmm2_scale": 1.0,
                "kv_layout": "HND",
                **self._packed_format_kwargs(),
            }
            st["swa_topk_lens"] = torch.empty((b * s,), dtype=torch.int32, device=device)
            if plan.extra_topk is not None:
                st["extra_topk_lens"] = torch.empty((b * s,), dtype=torch.int32, device=device)
        self.replan_library(plan)

    def replan_library(self, plan: DecodePlan) -> None:
        """Everything derived from the lengths, written into the planned buffers."""
        st, device, b, s = plan.state, plan.device, plan.batch, plan.seq_q
        if st["major"] == 10:
            st["keep"] = self._keep(plan.topk_length, b, plan.topk, device, st.get("keep"))
            if plan.extra_topk is not None:
                st["extra_keep"] = self._keep(plan.extra_topk_length, b, plan.extra_topk, device, st.get("extra_keep"))
            extra_lens = self._per_token(plan.extra_topk_length, b, s, plan.extra_topk or 0, device)
            st["topk_lens"].copy_(extra_lens + SWA_COLUMNS)
        else:
            st["swa_topk_lens"].copy_(self._per_token(plan.topk_length, b, s, plan.topk, device))
            if plan.extra_topk is not None:
                st["extra_topk_lens"].copy_(self._per_token(plan.extra_topk_length, b, s, plan.extra_topk, device))

    @staticmethod
    def _keep(lengths: Any, b: int, k: int, device: Any, out: Any) -> Any:
        """bool ``[b, 1, k]``: column < lengths[b] (None when every column counts)."""
        keep = length_mask(lengths, b, k, device)
        if keep is None or out is None:
            return keep
        out.copy_(keep)
        return out

    def _query(self, plan: DecodePlan, q: Any) -> Any:
        import torch

        st, h = plan.state, plan.heads
        buf = st.get("q_buf")
        if buf is None:
            return q if q.dtype == torch.bfloat16 and q.is_contiguous() else q.to(torch.bfloat16).contiguous()
        if st["fp8_query"]:
            # Zero padded heads stay zero; quantize the live heads into the planned buffer.
            buf[:, :, :h].copy_((q.float() / self.q_scale).clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX))
        else:
            buf[:, :, :h].copy_(q)
        return buf

    def _sinks(self, plan: DecodePlan, attn_sink: Any) -> Any:
        import torch

        if attn_sink is None:
            return None
        buf = plan.state.get("sink_buf")
        if buf is None:
            if attn_sink.dtype == torch.float32 and attn_sink.device == plan.device and attn_sink.is_contiguous():
                return attn_sink
            return attn_sink.to(device=plan.device, dtype=torch.float32).contiguous()
        buf[: plan.heads].copy_(attn_sink)
        return buf

    def _checked_view(self, cache: Any, block_size: int, what: str) -> Any:
        view = self._cached_view(cache, self.layout.kernel_view)
        if view.shape[1] != block_size:
            raise ValueError(f"{what} has block size {view.shape[1]}, the plan was made for {block_size}")
        return view

    def run_library(self, plan: DecodePlan, q: Any, kv_cache: Any, indices: Any, extra_kv_cache: Any,
                     extra_indices: Any, attn_sink: Any) -> DecodeOutput:
        import torch

        st, device = plan.state, plan.device
        pool = self._checked_view(kv_cache, plan.block_size, "cache")
        kwargs = dict(st["kwargs"])
        kwargs["sinks"] = self._sinks(plan, attn_sink)
        if st["major"] == 10:
            table, k = st["table"], plan.topk
            idx = indices.to(device=device, dtype=torch.int32)
            keep = st.get("keep")
            table[:, :, :k].copy_(idx if keep is None else torch.where(keep, idx, -1))
            if extra_kv_cache is not None:
                extra = extra_indices.to(device=device, dtype=torch.int32)
                extra_keep = st.get("extra_keep")
                table[:, :, SWA_COLUMNS : SWA_COLUMNS + (plan.extra_topk or 0)].copy_(
                    extra if extra_keep is None else torch.where(extra_keep, extra, -1)
                )
                compressed = self._checked_view(extra_kv_cache, plan.extra_block_size, "extra cache")
            else:
                compressed = pool  # window-only layer: any valid pool
            kwargs["sparse_indices"] = table.view(plan.batch * plan.seq_q, -1)
            kwargs["compressed_kv_cache"] = compressed
            kwargs["sparse_topk_lens"] = st["topk_lens"]
        else:
            kwargs["sparse_indices"] = _i32(indices, device)
            kwargs["swa_topk_lens"] = st["swa_topk_lens"]
            if extra_kv_cache is not None:
                kwargs["compressed_kv_cache"] = self._checked_view(extra_kv_cache, plan.extra_block_size, "extra cache")
                kwargs["extra_sparse_indices"] = _i32(extra_indices, device)
                kwargs["extra_sparse_topk_lens"] = st["extra_topk_lens"]
        out = st["fn"](self._query(plan, q), pool, st["workspace"], **kwargs)
        if st["h_pad"] != plan.heads:
            out = out[:, :, : plan.heads]
        return DecodeOutput(out, None)

    # -- helpers -------------------------------------------------------------
    def _packed_format_kwargs(self) -> dict[str, Any]:
        """Extra keywords of the SM12x packed call that name the record format.

        Empty for V4: FlashInfer's default ``kv_cache_format`` is V4's 584-byte
        record, and releases before the keyword existed must keep working.
        """
        return {}

    @staticmethod
    def _per_token(lengths: Any, b: int, s: int, default: int, device: Any) -> Any:
        """int32 ``[b * s]``: ``lengths[b]`` for each query token, or ``default``."""
        import torch

        if lengths is None:
            return torch.full((b * s,), default, dtype=torch.int32, device=device)
        return lengths.to(device=device, dtype=torch.int32).repeat_interleave(s)


#: The FlashInfer module whose dispatch table lists the SM120 DeepSeek-V4 decode shapes, and the table
#: (keyed by (query heads, top-k)) that vLLM 0.33 reads before it builds the SM120 layer.
SM120_MODULE = "flashinfer.mla._sparse_mla_sm120"
SM120_DISPATCH = "_DECODE_DSV4_DISPATCH"
SM120_HINT = "install a FlashInfer build that contains flashinfer-ai/flashinfer#4380"


class DeepseekV4FlashInferSM120Impl(DeepseekV4FlashInferMLASparseImpl):
    """FlashInfer's packed DeepSeek-V4 sparse decode on SM12x, with FlashInfer's SM120
    specialization: the probe of the rules' ``flashinfer_sm120`` input (``dsv4sel doctor``,
    ``explain --detect``), which says whether the default backend of an RTX PRO 6000 or a
    DGX Spark can start.

    ``is_available()`` is True on an SM12x GPU when FlashInfer imports with the sparse decode
    entry point and its SM120 dispatch table (``flashinfer.mla._sparse_mla_sm120``) lists a
    DeepSeek-V4 (query heads, top-k) shape; the reason names the shapes, since vLLM checks the
    model's own shape (its heads per GPU, its window) when it builds the layer. Without
    FlashInfer the reason is "flashinfer not installed". Decoding is its parent's.
    """

    impl_name: ClassVar[str] = "DeepseekV4FlashInferSM120Impl"
    layouts_by_major: ClassVar[Mapping[int, frozenset[str]]] = {12: LAYOUTS_BY_MAJOR[12]}
    supported_layouts: ClassVar[frozenset[str]] = LAYOUTS_BY_MAJOR[12]
    targets: ClassVar[Mapping[str, frozenset]] = {"cuda": frozenset({12})}
    kernel_label: ClassVar[str] = "FlashInfer's DeepSeek-V4 SM120 sparse decode"
    built_for: ClassVar[str] = "runs on SM12x (SM120, SM121)"
    other_gpu_hint: ClassVar[str] = ""

    @classmethod
    def library_missing_reason(cls, exc: BaseException) -> str:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "flashinfer":
            return f"flashinfer not installed: {FLASHINFER_INSTALL_HINT}"
        return super().library_missing_reason(exc)

    @classmethod
    def entry_point_reason(cls, module: Any, capability: Any) -> str | None:
        shapes = _sm120_shapes()
        return shapes if isinstance(shapes, str) else None

    @classmethod
    def is_available(cls, platform: str | None = None, capability: Any = None) -> tuple[bool, str]:
        """As the base class's, the SM120 decode shapes named when available. Never raises."""
        ok, reason = super().is_available(platform, capability)
        if ok:
            shapes = _sm120_shapes()
            listed = ", ".join(f"({h}, {k})" for h, k in shapes) if isinstance(shapes, list) and shapes \
                else "(its table does not list them)"
            reason += (f"; SM120 DeepSeek-V4 decode for (heads, top-k) {listed}: vLLM checks the model's "
                       "own shape when it builds the layer")
        return ok, reason


def _sm120_shapes() -> list[tuple[int, int]] | str:
    """The (query heads, top-k) shapes of FlashInfer's SM120 DeepSeek-V4 dispatch table, sorted
    (empty when the table cannot be listed but answers membership), or why there is none."""
    import importlib

    try:
        table = getattr(importlib.import_module(SM120_MODULE), SM120_DISPATCH, None)
    except ImportError as exc:
        return f"this FlashInfer has no SM120 sparse MLA module ({SM120_MODULE}: {exc}): {SM120_HINT}"
    if table is None:
        return f"this FlashInfer has no DeepSeek-V4 SM120 decode table ({SM120_MODULE}.{SM120_DISPATCH}): {SM120_HINT}"
    try:
        keys = [k for k in table if isinstance(k, tuple) and len(k) == 2]
    except TypeError:  # a table that answers `in` only
        return []
    if not keys:
        return f"this FlashInfer's DeepSeek-V4 SM120 decode table is empty: {SM120_HINT}"
    return sorted(keys, key=repr)


def _i32(t: Any, device: Any) -> Any:
    import torch

    if t.dtype == torch.int32 and t.device == device and t.is_contiguous():
        return t
    return t.to(device=device, dtype=torch.int32).contiguous()
