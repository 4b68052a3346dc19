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
``backend_name``, ``model_label``) and ``_packed_format_kwargs``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

from .base import DecodeInputs, DecodeOutput, SparseMLAImpl, import_attr_module, pad_heads, padded_heads
from .errors import UnsupportedLayoutError
from .layouts import FP8_E4M3_MAX, Fp8E4m3RowLayout
from .platform import Capability, format_capability

__all__ = ["DeepseekV4FlashInferMLASparseImpl", "FLASHINFER_INSTALL_HINT", "SWA_COLUMNS"]

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
    #: The backend name in messages, and the model the decode serves.
    backend_name: ClassVar[str] = "FLASHINFER_MLA_SPARSE_DSV4"
    model_label: ClassVar[str] = "DeepSeek-V4"
    #: Layouts by GPU major (10: TRTLLM-gen plain rows, 12: packed pages).
    layouts_by_major: ClassVar[Mapping[int, frozenset[str]]] = LAYOUTS_BY_MAJOR
    supported_layouts: ClassVar[frozenset[str]] = frozenset().union(*LAYOUTS_BY_MAJOR.values())

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
    def _target_reason(cls, platform: str, capability: Capability | None) -> str | None:
        what = f"FlashInfer {cls.model_label} sparse decode"
        if platform != "cuda":
            return f"{what} runs on NVIDIA GPUs (platform cuda), not {platform}"
        if capability is None:
            return f"no CUDA compute capability known; {what} needs SM10x or SM12x"
        if capability[0] not in cls.layouts_by_major:
            return (
                f"{cls.backend_name} requires SM10x (TRTLLM-gen) or SM12x (packed sparse); "
                f"this GPU is {format_capability(capability)} (on SM90 use FlashMLA)"
            )
        return None

    @classmethod
    def _import_library(cls) -> Any:
        return import_attr_module("flashinfer.mla", "flashinfer.decode", attr=ENTRY_POINT)

    @classmethod
    def _library_missing_reason(cls, exc: BaseException) -> str:
        return f"flashinfer.mla.{ENTRY_POINT} is not importable ({type(exc).__name__}: {exc}): {FLASHINFER_INSTALL_HINT}"

    def _workspace(self, device: Any) -> Any:
        import torch

        key = str(device)
        if key not in self._workspaces:
            self._workspaces[key] = torch.zeros(self.workspace_bytes, dtype=torch.uint8, device=device)
        return self._workspaces[key]

    def _forward_library(self, lib: Any, capability: Capability | None, inputs: DecodeInputs) -> DecodeOutput:
        assert capability is not None  # _target_reason guarantees it
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
        fn = getattr(lib, ENTRY_POINT)
        h = inputs.heads
        h_pad = padded_heads(h, FLASHINFER_HEADS, self.impl_name)
        if major == 10:
            out = self._call_trtllm_gen(fn, inputs, h_pad)
        else:
            out = self._call_sm120(fn, inputs, h_pad)
        return DecodeOutput(out[:, :, :h], None)

    # -- argument builders -------------------------------------------------
    def _packed_format_kwargs(self) -> dict[str, Any]:
        """Extra keywords of the SM12x packed call that name the record format.

        Empty for V4: FlashInfer's default ``kv_cache_format`` is V4's 584-byte
        record, and releases before the keyword existed must keep working.
        """
        return {}

    @staticmethod
    def _active_columns(indices: Any, lengths: Any) -> Any:
        """``indices`` with columns at or beyond ``lengths[b]`` set to -1 (negatives stay)."""
        import torch

        b, _, k = indices.shape
        idx = indices.to(torch.int32)
        if lengths is None:
            return idx
        cols = torch.arange(k, device=idx.device).view(1, 1, k)
        keep = cols < lengths.to(idx.device).view(b, 1, 1)
        return torch.where(keep, idx, torch.full_like(idx, -1))

    @staticmethod
    def _per_token(lengths: Any, b: int, s: int, default: int, device: Any) -> Any:
        """int32 ``[b * s]``: ``lengths[b]`` for each query token, or ``default``."""
        import torch

        if lengths is None:
            return torch.full((b * s,), default, dtype=torch.int32, device=device)
        return lengths.to(device=device, dtype=torch.int32).repeat_interleave(s)

    def _sinks(self, inputs: DecodeInputs, h_pad: int) -> Any:
        import torch

        if inputs.attn_sink is None:
            return None
        return pad_heads(inputs.attn_sink.to(device=inputs.q.device, dtype=torch.float32), 0, h_pad).contiguous()

    def _call_trtllm_gen(self, fn: Any, inputs: DecodeInputs, h_pad: int) -> Any:
        import torch

        q, device = inputs.q, inputs.q.device
        b, s = inputs.batch, inputs.seq_q
        if inputs.seq_lens is None:
            raise ValueError(
                f"{self.impl_name} on SM10x needs seq_lens (int [b], tokens per request): "
                "TRTLLM-gen derives the 128-token window from it"
            )
        window = self._active_columns(inputs.indices.to(device), inputs.topk_length)
        if window.shape[-1] > SWA_COLUMNS:
            raise ValueError(f"TRTLLM-gen takes at most {SWA_COLUMNS} window indices, got {window.shape[-1]}")
        window = torch.nn.functional.pad(window, (0, SWA_COLUMNS - window.shape[-1]), value=-1)
        if inputs.extra_kv_cache is not None:
            extra = self._active_columns(inputs.extra_indices.to(device), inputs.extra_topk_length)
            extra_width = extra.shape[-1]
            table = torch.cat([window, extra], dim=-1)
            compressed = self.layout.kernel_view(inputs.extra_kv_cache)
        else:
            extra_width = 0
            table = window
            compressed = self.layout.kernel_view(inputs.kv_cache)  # window-only layer: any valid pool
        table = torch.nn.functional.pad(table, (0, (-table.shape[-1]) % 4), value=-1)
        extra_lens = self._per_token(inputs.extra_topk_length, b, s, extra_width, device)

        kv_scale = getattr(self.layout, "scale", 1.0)
        if isinstance(self.layout, Fp8E4m3RowLayout):
            # Pad before quantizing: zero heads stay zero, and float8 concatenation is not needed.
            padded = pad_heads(q.float() / self.q_scale, 2, h_pad)
            query = padded.clamp_(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
            q_scale = self.q_scale
        else:
            query = pad_heads(q.to(torch.bfloat16), 2, h_pad)
            q_scale = 1.0
        return fn(
            query.contiguous(),
            self.layout.kernel_view(inputs.kv_cache),
            self._workspace(device),
            sparse_indices=table.reshape(b * s, -1).contiguous(),
            compressed_kv_cache=compressed,
            sparse_topk_lens=(extra_lens + SWA_COLUMNS).contiguous(),
            seq_lens=inputs.seq_lens.to(device=device, dtype=torch.int32).contiguous(),
            bmm1_scale=float(inputs.softmax_scale) * q_scale * kv_scale,
            bmm2_scale=float(kv_scale),
            sinks=self._sinks(inputs, h_pad),
            kv_layout="HND",
        )

    def _call_sm120(self, fn: Any, inputs: DecodeInputs, h_pad: int) -> Any:
        import torch

        q, device = inputs.q, inputs.q.device
        b, s = inputs.batch, inputs.seq_q
        kwargs: dict[str, Any] = {
            "sparse_indices": inputs.indices.to(device=device, dtype=torch.int32).contiguous(),
            "swa_topk_lens": self._per_token(inputs.topk_length, b, s, inputs.indices.shape[-1], device),
            "bmm1_scale": float(inputs.softmax_scale),
            "bmm2_scale": 1.0,
            "sinks": self._sinks(inputs, h_pad),
            "kv_layout": "HND",
            **self._packed_format_kwargs(),
        }
        if inputs.extra_kv_cache is not None:
            kwargs["compressed_kv_cache"] = self.layout.kernel_view(inputs.extra_kv_cache)
            kwargs["extra_sparse_indices"] = inputs.extra_indices.to(device=device, dtype=torch.int32).contiguous()
            kwargs["extra_sparse_topk_lens"] = self._per_token(
                inputs.extra_topk_length, b, s, inputs.extra_indices.shape[-1], device
            )
        query = pad_heads(q.to(torch.bfloat16), 2, h_pad).contiguous()
        return fn(query, self.layout.kernel_view(inputs.kv_cache), self._workspace(device), **kwargs)
