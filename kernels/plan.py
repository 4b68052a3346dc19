"""The value types of a decode: :class:`DecodeOutput`, :class:`DecodeInputs`, :class:`DecodePlan`,
and the small helpers the impls share (head padding, entry-point imports).

This module imports neither torch nor a kernel library.
"""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from .layouts import HEAD_DIM
from .platform import Capability

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "DecodeInputs",
    "DecodeOutput",
    "DecodePlan",
    "check_plan_args",
    "check_run_args",
    "check_positive_int",
    "import_attr_module",
    "lengths_key",
    "memo_view",
    "padded_heads",
]


class DecodeOutput(NamedTuple):
    """What ``forward_decode`` and ``run`` return."""

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


@dataclass(eq=False)
class DecodePlan:
    """What :meth:`SparseMLAImpl.plan <dsv4sel.kernels.base.SparseMLAImpl.plan>` fixed for one batch shape.

    ``topk_length``, ``extra_topk_length`` and ``seq_lens`` are the plan's own
    int32 copies on ``device`` (``replan`` updates them in place). ``library``
    is the kernel module, or None when the plan runs the torch reference
    (``fallback="reference"``). ``state`` holds what the impl's
    ``plan_library`` prepared (scheduler metadata, buffers); ``run_library``
    reads it. ``query_buffer``: where the kernel takes more heads than the
    plan's (padded heads), the ``[batch, seq_q, heads, 512]`` view of the plan's
    padded query buffer; a caller that writes ``q`` there (e.g. as the ``out=``
    of its projection) and passes that view as ``q`` saves ``run`` its one copy.
    None where nothing is padded.
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
        self.query_buffer: "torch.Tensor | None" = None
        #: ``fast(impl, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink)``: the impl's
        #: run of this plan with its per-call work bound once (a DecodeOutput, or None: the general
        #: path), or None; ``run`` and ``forward_decode`` try it first.
        self.fast_run: Any = None


def check_positive_int(name: str, value: Any) -> None:
    """ValueError unless ``value`` is a positive int (bools are not)."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def check_plan_args(*, batch: Any, heads: Any, topk: Any, seq_q: Any, extra_topk: Any, softmax_scale: Any,
                    topk_length: Any, extra_topk_length: Any, seq_lens: Any, extra_block_size: Any,
                    device: Any) -> Any:
    """The checks of ``SparseMLAImpl.plan``'s arguments (ValueError naming the argument);
    returns the device, as a ``torch.device`` (default: the lengths' device)."""
    import torch

    from .decode import _check_lengths

    for name, value in (("batch", batch), ("heads", heads), ("topk", topk), ("seq_q", seq_q)):
        check_positive_int(name, value)
    if extra_topk is not None:
        check_positive_int("extra_topk", extra_topk)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise ValueError(f"softmax_scale must be a float, got {softmax_scale!r}")
    if extra_topk_length is not None and extra_topk is None:
        raise ValueError("extra_topk_length needs extra_topk")
    lengths = (("topk_length", topk_length), ("extra_topk_length", extra_topk_length), ("seq_lens", seq_lens))
    for name, t in lengths:
        _check_lengths(name, t, batch, torch)
    if extra_block_size is not None:
        check_positive_int("extra_block_size", extra_block_size)
    if device is None:
        given = [t for _, t in lengths if t is not None]
        if not given:
            raise ValueError("plan() needs device= when no length tensor is given")
        device = given[0].device
    return torch.device(device)


def check_run_args(plan: "DecodePlan | None", impl_name: str, q: Any, indices: Any, extra_kv_cache: Any,
                   extra_indices: Any, attn_sink: Any) -> DecodePlan:
    """``run``'s checks of its arguments against the plan (ValueError naming the argument); the plan."""
    if plan is None:
        raise ValueError(f"{impl_name}.run() needs a plan: call plan() first")
    if plan.impl_name != impl_name:
        raise ValueError(f"a plan of {plan.impl_name} cannot be run by {impl_name}")
    # torch.Size compares with a tuple in C: these checks cost well under a microsecond.
    if q.shape != plan.q_shape:
        raise ValueError(f"q must be {list(plan.q_shape)} as planned, got {tuple(q.shape)}")
    if indices.shape != plan.indices_shape:
        raise ValueError(f"indices must be {list(plan.indices_shape)} as planned, got {tuple(indices.shape)}")
    if extra_indices is not None and extra_indices.shape != plan.extra_indices_shape \
            or (extra_kv_cache is None) != (extra_indices is None) or (extra_indices is None) != (plan.extra_topk is None):
        _extra_mismatch(plan, extra_kv_cache, extra_indices)
    if attn_sink is not None and attn_sink.shape != plan.sink_shape:
        raise ValueError(f"attn_sink must be a [{plan.heads}] tensor, got {tuple(attn_sink.shape)}")
    return plan


def _extra_mismatch(plan: DecodePlan, extra_kv_cache: Any, extra_indices: Any) -> None:
    """run()'s error for extra arguments that do not fit the plan."""
    if plan.extra_topk is None or extra_kv_cache is None or extra_indices is None:
        raise ValueError("extra_kv_cache and extra_indices must be given exactly when the plan has extra_topk")
    raise ValueError(
        f"extra_indices must be {list(plan.extra_indices_shape or ())} as planned, got {tuple(extra_indices.shape)}")


def lengths_key(softmax_scale: Any, topk_length: Any, extra_topk_length: Any, seq_lens: Any) -> tuple:
    """forward_decode's scale and length tensors, by identity and torch version."""
    return (softmax_scale, id(topk_length), None if topk_length is None else topk_length._version,
            id(extra_topk_length), None if extra_topk_length is None else extra_topk_length._version,
            id(seq_lens), None if seq_lens is None else seq_lens._version)


def memo_view(memo: dict, cache: "torch.Tensor", make: Any) -> Any:
    """``make(cache)`` memoized in ``memo`` per cache tensor (at most 16 entries).

    The key is the tensor's identity (the memo holds the tensor, so the id cannot be reused),
    checked against its data pointer and shape in case it was re-pointed (``set_``, ``resize_``).
    """
    hit = memo.get(id(cache))
    if hit is not None and hit[1] == cache.data_ptr() and hit[2] == cache.shape:
        return hit[3]
    view = make(cache)
    if len(memo) >= 16:
        memo.clear()
    memo[id(cache)] = (cache, cache.data_ptr(), cache.shape, view)
    return view


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


def padded_heads(heads: int, allowed: tuple[int, ...], impl: str) -> int:
    """The smallest allowed head count >= ``heads``; ValueError naming ``allowed`` if none."""
    for n in sorted(allowed):
        if heads <= n:
            return n
    raise ValueError(f"{impl}: {heads} query heads; the kernel requires h_q in {{{', '.join(map(str, allowed))}}}")
