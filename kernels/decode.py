"""The torch reference sparse MLA decode: the math, with no impl class.

:mod:`dsv4sel.kernels.reference` wraps it as an impl, and every impl's
``fallback="reference"`` path (in :mod:`dsv4sel.kernels.base`) calls it; it
lives here so that neither of those two modules imports the other.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .layouts import HEAD_DIM, KVCacheLayout, resolve_layout

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = ["sparse_mla_decode"]


def length_mask(lengths: "torch.Tensor | None", batch: int, k: int, device: Any) -> "torch.Tensor | None":
    """bool ``[batch, 1, k]``: column ``j`` of request ``b`` counts when
    ``j < lengths[b]`` (``topk_length``); None when ``lengths`` is None, i.e.
    every column counts. The one definition of a top-k length, shared by the
    reference decode and the library adapters that pass lengths as masks."""
    if lengths is None:
        return None
    import torch

    return torch.arange(k, device=device).view(1, 1, k) < lengths.to(device).view(batch, 1, 1)


def _gather(
    cache: "torch.Tensor",
    layout: KVCacheLayout,
    indices: "torch.Tensor",
    topk_length: "torch.Tensor | None",
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Dequantized rows ``[b, s, k, 512]`` (float32, zero where skipped) and the valid mask."""
    import torch

    b, s, k = indices.shape
    valid = indices >= 0
    keep = length_mask(topk_length, b, k, indices.device)
    if keep is not None:
        valid = valid & keep
    # Skipped entries read slot 0 and are zeroed: the cache may hold NaN bytes
    # there, and 0 * NaN would poison the weighted sum.
    slots = torch.where(valid, indices, torch.zeros_like(indices)).reshape(-1).long()
    rows = layout.read(cache, slots).float().view(b, s, k, HEAD_DIM)
    return rows.masked_fill_(~valid.unsqueeze(-1), 0.0), valid


def is_int_tensor(t: Any, torch: Any) -> bool:
    return isinstance(t, torch.Tensor) and not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


def check_decode_args(q: Any, indices: Any, softmax_scale: Any, attn_sink: Any = None, topk_length: Any = None,
                      extra_cache: Any = None, extra_indices: Any = None, extra_topk_length: Any = None,
                      seq_lens: Any = None, *, extra_cache_name: str = "extra_cache") -> None:
    """The shape and dtype checks of one decode call, none of which needs a
    device sync; raises ValueError naming the argument. The one validation of
    decode inputs: :func:`sparse_mla_decode` and every impl's
    ``forward_decode`` / ``run`` (:mod:`dsv4sel.kernels.base`, which spells
    the second cache ``extra_kv_cache``) call it."""
    import torch

    if not isinstance(q, torch.Tensor) or q.dim() != 4 or q.shape[-1] != HEAD_DIM or not q.is_floating_point():
        raise ValueError(f"q must be a floating [b, s_q, h, {HEAD_DIM}] tensor, got {getattr(q, 'shape', q)!r}")
    b, s, h = q.shape[:3]
    _check_indices("indices", indices, b, s, torch)
    if extra_indices is not None:
        _check_indices("extra_indices", extra_indices, b, s, torch)
    for name, t in (("topk_length", topk_length), ("extra_topk_length", extra_topk_length), ("seq_lens", seq_lens)):
        _check_lengths(name, t, b, torch)
    if attn_sink is not None and (not isinstance(attn_sink, torch.Tensor) or tuple(attn_sink.shape) != (h,)):
        raise ValueError(f"attn_sink must be a [{h}] tensor, got {getattr(attn_sink, 'shape', attn_sink)!r}")
    _check_pairing(softmax_scale, extra_cache, extra_indices, extra_topk_length, extra_cache_name)


def _check_pairing(softmax_scale: Any, extra_cache: Any, extra_indices: Any, extra_topk_length: Any,
                   extra_cache_name: str) -> None:
    if (extra_cache is None) != (extra_indices is None):
        raise ValueError(f"{extra_cache_name} and extra_indices must be given together")
    if extra_topk_length is not None and extra_indices is None:
        raise ValueError("extra_topk_length needs extra_indices")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise ValueError(f"softmax_scale must be a float, got {softmax_scale!r}")


def _check_indices(name: str, t: Any, b: int, s: int, torch: Any) -> None:
    if not is_int_tensor(t, torch) or t.dim() != 3 or tuple(t.shape[:2]) != (b, s):
        raise ValueError(f"{name} must be an integer [{b}, {s}, topk] tensor, got {getattr(t, 'shape', t)!r}")


def _check_lengths(name: str, t: Any, b: int, torch: Any) -> None:
    """A length tensor, when given, is an integer ``[b]`` tensor (ValueError naming it otherwise)."""
    if t is not None and (not is_int_tensor(t, torch) or tuple(t.shape) != (b,)):
        raise ValueError(f"{name} must be an integer [{b}] tensor, got {getattr(t, 'shape', t)!r}")


def sparse_mla_decode(
    q: "torch.Tensor",
    cache: "torch.Tensor",
    layout: "KVCacheLayout | str",
    indices: "torch.Tensor",
    softmax_scale: float,
    attn_sink: "torch.Tensor | None" = None,
    topk_length: "torch.Tensor | None" = None,
    *,
    extra_cache: "torch.Tensor | None" = None,
    extra_indices: "torch.Tensor | None" = None,
    extra_topk_length: "torch.Tensor | None" = None,
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Sparse MLA decode in float32; returns ``(out, lse)``.

    Args:
        q: ``[b, s_q, h, 512]``, any float dtype (upcast to float32).
        cache: a cache made by ``layout.allocate`` (any device).
        layout: a layout object or name (``fp8_ds_mla``, ``bf16_row``, ``fp8_e4m3_row``).
        indices: integer ``[b, s_q, topk]`` cache slots; negative = skip.
        softmax_scale: multiplies ``q . kv`` before the softmax.
        attn_sink: optional ``[h]`` per-head sink logits (see module docstring).
        topk_length: optional integer ``[b]``: only the first ``topk_length[b]``
            columns of ``indices`` count.
        extra_cache, extra_indices, extra_topk_length: a second token set in a
            second cache of the same layout (DeepSeek-V4 attends to the
            sliding-window cache and the compressed cache at once), combined
            into the same softmax.

    Returns:
        ``out`` float32 ``[b, s_q, h, 512]`` and ``lse`` float32 ``[b, s_q, h]``
        (natural log, without the sink; ``+inf`` where no token was selected).
    """
    import torch

    lay = resolve_layout(layout)
    check_decode_args(q, indices, softmax_scale, attn_sink, topk_length, extra_cache, extra_indices,
                      extra_topk_length)

    kv, valid = _gather(cache, lay, indices.to(q.device), topk_length)
    if extra_indices is not None and extra_cache is not None:  # given together (checked above)
        kv2, valid2 = _gather(extra_cache, lay, extra_indices.to(q.device), extra_topk_length)
        kv, valid = torch.cat([kv, kv2], dim=2), torch.cat([valid, valid2], dim=2)

    qf = q.float()
    # [b, s, h, d] x [b, s, k, d] -> [b, s, h, k]
    logits = torch.matmul(qf, kv.transpose(-1, -2)) * float(softmax_scale)
    logits.masked_fill_(~valid.unsqueeze(2), float("-inf"))
    if logits.shape[-1] == 0:
        row_max = torch.full(logits.shape[:-1], float("-inf"), device=q.device)
    else:
        row_max = logits.amax(dim=-1)
    # Subtract a finite max so exp never overflows; rows with no token use 0.
    shift = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    weights = torch.exp(logits - shift.unsqueeze(-1))  # skipped tokens: exp(-inf) = 0
    denom = weights.sum(dim=-1)  # [b, s, h]
    numer = torch.matmul(weights, kv)  # [b, s, h, d]

    total = denom
    if attn_sink is not None:
        # exp(sink - shift) may overflow to inf: then out -> 0, the correct limit.
        total = denom + torch.exp(attn_sink.to(q.device).float().view(1, 1, -1) - shift)
    has_tokens = denom > 0
    out = torch.where(
        has_tokens.unsqueeze(-1),
        numer / torch.where(has_tokens, total, torch.ones_like(total)).unsqueeze(-1),
        torch.zeros_like(numer),
    )
    lse = torch.where(has_tokens, shift + torch.log(denom), torch.full_like(denom, float("inf")))
    return out, lse
