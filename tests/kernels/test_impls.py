"""The impl classes: registry, availability, errors, and the argument mapping
to each kernel library.

The libraries do not run here (FlashMLA needs an SM90/SM100 GPU, FlashInfer's
DeepSeek-V4 decode SM10x/SM12x, AITER a ROCm GPU). Each mapping test injects a
fake module into ``sys.modules`` that records the call and computes, from the
arguments it was handed and with the semantics the library documents, what
the kernel would return. The impl's result must then equal the torch
reference on the original inputs; a wrong view, stride, scale, index table or
head padding makes the numbers differ.
"""

from __future__ import annotations

import logging
import math
import sys
from types import SimpleNamespace

import pytest
import torch

import dsv4sel.kernels as kernels
from dsv4sel.kernels.base import SparseMLAImpl
from dsv4sel.kernels.errors import KernelUnavailableError, UnknownLayoutError, UnsupportedLayoutError
from dsv4sel.kernels.flashinfer import DeepseekV4FlashInferMLASparseImpl
from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl
from dsv4sel.kernels.layouts import get_layout
from dsv4sel.kernels.platform import parse_capability
from dsv4sel.kernels.reference import DeepseekV4ReferenceSparseImpl, sparse_mla_decode
from dsv4sel.kernels.rocm import DeepseekV4ROCMAiterMLASparseImpl

SCALE = 512**-0.5
ALL_IMPLS = [
    DeepseekV4FlashMLASparseImpl,
    DeepseekV4FlashInferMLASparseImpl,
    DeepseekV4ROCMAiterMLASparseImpl,
    DeepseekV4ReferenceSparseImpl,
]


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def make_cache(layout_name, num_blocks, block_size, gen, layout=None):
    layout = layout or get_layout(layout_name)
    cache = layout.allocate(num_blocks, block_size)
    n = num_blocks * block_size
    layout.write(cache, torch.randn(n, 512, generator=gen).to(torch.bfloat16), torch.arange(n))
    return cache


def random_indices(b, s, k, capacity, gen, skip_fraction=0.2):
    idx = torch.randint(0, capacity, (b, s, k), generator=gen)
    return torch.where(torch.rand(b, s, k, generator=gen) < skip_fraction, torch.full_like(idx, -1), idx)


def pages_from_view(view: torch.Tensor, page_bytes: int) -> torch.Tensor:
    """What a kernel sees through a page view: the uint8 pages from its base pointer and page stride."""
    raw = view.view(torch.uint8)
    return raw.as_strided((view.shape[0], page_bytes), (view.stride(0), 1), raw.storage_offset())


def reference_rows_decode(q, rows, valid, softmax_scale, sinks=None, value_scale=1.0):
    """Documented kernel semantics on explicit per-token rows: [T, h, d] x [T, k, d]."""
    logits = softmax_scale * torch.einsum("thd,tkd->thk", q.double(), rows.double())
    logits = logits.masked_fill(~valid.unsqueeze(1), -math.inf)
    lse = torch.logsumexp(logits, dim=-1)
    weights = torch.exp(logits - torch.where(torch.isfinite(lse), lse, 0).unsqueeze(-1))
    out = torch.einsum("thk,tkd->thd", weights, rows.double()) * value_scale
    if sinks is not None:
        out = out / (1 + torch.exp(sinks.double().view(1, -1) - lse)).unsqueeze(-1)
    out = torch.where(torch.isfinite(lse).unsqueeze(-1), out, 0)
    return out, lse


# ---------------------------------------------------------------------------
# registry, construction, availability
# ---------------------------------------------------------------------------


def test_registry_names_the_v4_impls_then_the_v41_impls_by_module_and_class() -> None:
    assert kernels.IMPLS == (
        "dsv4sel.kernels.flashmla:DeepseekV4FlashMLASparseImpl",
        "dsv4sel.kernels.flashinfer:DeepseekV4FlashInferMLASparseImpl",
        "dsv4sel.kernels.rocm:DeepseekV4ROCMAiterMLASparseImpl",
        "dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl",
        "dsv4sel.kernels.v41:DeepseekV41FlashMLASparseImpl",
        "dsv4sel.kernels.v41:DeepseekV41FlashInferMLASparseImpl",
        "dsv4sel.kernels.v41:DeepseekV41MegaAttnImpl",
    )
    classes = [kernels.load_impl(spec) for spec in kernels.IMPLS]
    assert classes[:4] == ALL_IMPLS  # the V4.1 impls are tested in test_kernels_v41.py
    assert all(issubclass(cls, SparseMLAImpl) and cls.impl_name == cls.__name__ for cls in classes)
    with pytest.raises(ValueError):
        kernels.load_impl("dsv4sel.kernels.flashmla.DeepseekV4FlashMLASparseImpl")


def test_availability_report_on_a_cpu_machine(no_libraries) -> None:
    report = {row.spec.split(":")[1]: row for row in kernels.availability_report("cpu", None)}
    assert report["DeepseekV4ReferenceSparseImpl"].available
    for name in ("DeepseekV4FlashMLASparseImpl", "DeepseekV4FlashInferMLASparseImpl", "DeepseekV4ROCMAiterMLASparseImpl"):
        assert not report[name].available and report[name].reason


@pytest.mark.parametrize(
    ("impl", "platform", "capability", "needle"),
    [
        (DeepseekV4FlashMLASparseImpl, "cuda", (9, 0), "https://github.com/deepseek-ai/FlashMLA"),
        (DeepseekV4FlashMLASparseImpl, "cuda", "10.0", "placeholder"),
        (DeepseekV4FlashMLASparseImpl, "cuda", (12, 0), "SM90 and the SM100 family"),
        (DeepseekV4FlashMLASparseImpl, "rocm", (9, 4), "not rocm"),
        (DeepseekV4FlashMLASparseImpl, "cuda", None, "capability"),
        (DeepseekV4FlashInferMLASparseImpl, "cuda", (10, 0), "flashinfer"),
        (DeepseekV4FlashInferMLASparseImpl, "cuda", (12, 0), "pip install"),
        (DeepseekV4FlashInferMLASparseImpl, "cuda", (9, 0), "use FlashMLA"),
        (DeepseekV4ROCMAiterMLASparseImpl, "rocm", "gfx942", "amd-aiter"),
        (DeepseekV4ROCMAiterMLASparseImpl, "rocm", (11, 0), "gfx942 and gfx950"),
        (DeepseekV4ROCMAiterMLASparseImpl, "cuda", (9, 0), "not cuda"),
    ],
)
def test_is_available_says_what_is_wrong(no_libraries, impl, platform, capability, needle) -> None:
    ok, reason = impl.is_available(platform, capability)
    assert ok is False
    assert needle in reason


@pytest.mark.parametrize("impl", ALL_IMPLS)
def test_is_available_never_raises(impl) -> None:
    for platform, capability in [("cuda", "not-a-capability"), ("quantum", None), (None, None), ("cuda", object())]:
        ok, reason = impl.is_available(platform, capability)
        assert isinstance(ok, bool) and isinstance(reason, str) and reason


def test_is_available_with_the_library_and_a_matching_gpu(fake_module) -> None:
    fake_module("flash_mla", get_mla_metadata=lambda: (object(), None), flash_mla_with_kvcache=_fake_flash_mla_call)
    fake_module("flashinfer.mla", trtllm_batch_decode_sparse_mla_dsv4=lambda *a, **k: None)
    fake_module("aiter.mla", mla_decode_fwd=lambda *a, **k: None)
    assert DeepseekV4FlashMLASparseImpl.is_available("cuda", (9, 0))[0]
    assert DeepseekV4FlashMLASparseImpl.is_available("cuda", "10.3")[0]
    assert DeepseekV4FlashInferMLASparseImpl.is_available("cuda", (12, 1))[0]
    assert DeepseekV4ROCMAiterMLASparseImpl.is_available("rocm", "gfx950")[0]


def test_an_old_flash_mla_without_sparse_decode_is_reported(no_libraries, fake_module) -> None:
    def old_api(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits,
                softmax_scale=None, causal=False):
        raise AssertionError("must not be called")

    fake_module("flash_mla", get_mla_metadata=lambda *a: (None, None), flash_mla_with_kvcache=old_api)
    ok, reason = DeepseekV4FlashMLASparseImpl.is_available("cuda", (9, 0))
    assert not ok and "too old" in reason and "indices" in reason


@pytest.mark.parametrize(
    ("impl", "layout"),
    [
        (DeepseekV4FlashMLASparseImpl, "bf16_row"),
        (DeepseekV4ROCMAiterMLASparseImpl, "fp8_e4m3_row"),
    ],
)
def test_constructor_rejects_layouts_the_kernel_cannot_read(impl, layout) -> None:
    with pytest.raises(UnsupportedLayoutError, match="fp8_ds_mla"):
        impl(layout, 64)


def test_constructor_checks_its_arguments() -> None:
    with pytest.raises(UnknownLayoutError):
        DeepseekV4FlashMLASparseImpl("fp8", 64)
    with pytest.raises(ValueError, match="fallback"):
        DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 64, fallback="silent")
    with pytest.raises(ValueError, match="block_size"):
        DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 0)
    with pytest.raises(ValueError, match="kv_scale"):
        DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 64, kv_scale=2.0)
    with pytest.raises(ValueError, match="q_scale"):
        DeepseekV4FlashInferMLASparseImpl("bf16_row", 64, q_scale=2.0)


@pytest.mark.parametrize(
    ("impl", "layout", "shape"),
    [
        (DeepseekV4FlashMLASparseImpl, "fp8_ds_mla", (10, 64, 584)),
        (DeepseekV4FlashInferMLASparseImpl, "bf16_row", (10, 64, 512)),
        (DeepseekV4FlashInferMLASparseImpl, "fp8_e4m3_row", (10, 64, 512)),
        (DeepseekV4FlashInferMLASparseImpl, "fp8_ds_mla", (10, 64, 584)),
        (DeepseekV4ROCMAiterMLASparseImpl, "fp8_ds_mla", (10, 64, 584)),
        (DeepseekV4ReferenceSparseImpl, "bf16_row", (10, 64, 512)),
    ],
)
def test_kv_cache_shape(impl, layout, shape) -> None:
    obj = impl(layout, 64)
    assert obj.kv_cache_shape(10, 64) == shape
    assert obj.kv_cache_shape(10) == shape
    cache = obj.allocate_kv_cache(10)
    assert tuple(obj.kv_cache_view(cache).shape) == shape
    assert cache.numel() * cache.element_size() == 10 * get_layout(layout).page_bytes(64)


def test_write_kv_rejects_a_cache_of_another_block_size(gen) -> None:
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 64)
    with pytest.raises(ValueError, match="block size 16"):
        impl.write_kv(get_layout("fp8_ds_mla").allocate(2, 16), torch.zeros(1, 512), torch.tensor([0]))


# ---------------------------------------------------------------------------
# without the library: one clear error, or the reference on explicit opt-in
# ---------------------------------------------------------------------------


def _decode_args(gen, layout_name="fp8_ds_mla", block_size=8, heads=4):
    cache = make_cache(layout_name, 2, block_size, gen)
    q = torch.randn(2, 1, heads, 512, generator=gen).to(torch.bfloat16)
    idx = random_indices(2, 1, 6, 2 * block_size, gen)
    return q, cache, idx


@pytest.mark.parametrize(
    ("impl", "layout", "platform", "capability", "needle"),
    [
        (DeepseekV4FlashMLASparseImpl, "fp8_ds_mla", "cuda", (9, 0), "pip install --no-build-isolation"),
        (DeepseekV4FlashInferMLASparseImpl, "bf16_row", "cuda", (10, 0), "flashinfer"),
        (DeepseekV4ROCMAiterMLASparseImpl, "fp8_ds_mla", "rocm", (9, 4), "amd-aiter"),
        (DeepseekV4FlashMLASparseImpl, "fp8_ds_mla", None, None, "platform cuda"),  # CPU tensors
    ],
)
def test_forward_decode_without_the_library_raises_one_clear_error(
    no_libraries, gen, impl, layout, platform, capability, needle
) -> None:
    q, cache, idx = _decode_args(gen, layout)
    obj = impl(layout, 8, platform=platform, capability=capability)
    with pytest.raises(KernelUnavailableError) as info:
        obj.forward_decode(q, cache, idx, softmax_scale=SCALE)
    assert isinstance(info.value, RuntimeError)
    assert needle in str(info.value) and info.value.impl == impl.__name__


def test_fallback_reference_is_an_explicit_opt_in_that_logs_once(no_libraries, gen, caplog) -> None:
    q, cache, idx = _decode_args(gen)
    obj = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 8, fallback="reference", platform="cuda", capability=(9, 0))
    with caplog.at_level(logging.WARNING):
        first = obj.forward_decode(q, cache, idx, softmax_scale=SCALE)
        obj.forward_decode(q, cache, idx, softmax_scale=SCALE)
    out, lse = sparse_mla_decode(q, cache, "fp8_ds_mla", idx, SCALE)
    assert torch.equal(first.out, out.to(torch.bfloat16)) and torch.equal(first.lse, lse)
    warnings = [r for r in caplog.records if "fallback='reference'" in r.getMessage()]
    assert len(warnings) == 1 and "github.com/deepseek-ai/FlashMLA" in warnings[0].getMessage()


def test_forward_decode_validates_shapes_before_dispatch(gen) -> None:
    q, cache, idx = _decode_args(gen)
    obj = DeepseekV4ReferenceSparseImpl("fp8_ds_mla", 8)
    with pytest.raises(ValueError, match="indices"):
        obj.forward_decode(q, cache, idx[:1], softmax_scale=SCALE)
    with pytest.raises(ValueError, match="topk_length"):
        obj.forward_decode(q, cache, idx, softmax_scale=SCALE, topk_length=torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="together"):
        obj.forward_decode(q, cache, idx, softmax_scale=SCALE, extra_indices=idx)
    with pytest.raises(ValueError, match="block size"):
        obj.forward_decode(q, get_layout("fp8_ds_mla").allocate(1, 16), idx, softmax_scale=SCALE)


# ---------------------------------------------------------------------------
# FlashMLA mapping
# ---------------------------------------------------------------------------


class _SchedMeta:
    """FlashMLA's FlashMLASchedMeta: empty until the first call fills it."""

    def __init__(self):
        self.have_initialized = False
        self.config = None
        self.tile_scheduler_metadata = None
        self.num_splits = None


def _fake_schedule(b, topk, extra_topk, topk_length, extra_topk_length):
    """The fake's planning result: like FlashMLA's, it depends on the values of the lengths."""
    lens = torch.full((b,), topk, dtype=torch.int32) if topk_length is None else topk_length.int()
    extra = torch.zeros(b, dtype=torch.int32) if extra_topk_length is None else extra_topk_length.int()
    if extra_topk_length is None and extra_topk is not None:
        extra = torch.full((b,), extra_topk, dtype=torch.int32)
    return torch.stack([lens.cpu(), extra.cpu()])


def _fake_flash_mla_call(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                         num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                         attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                         extra_topk_length=None):
    """FlashMLA's sparse decode as documented: reads fp8_ds_mla pages through k_cache's base and page stride.

    The first call of a sched_meta plans (fills it); later calls must have the
    same shapes and the same length values, else FlashMLA would run a stale
    schedule: the fake fails there.
    """
    _fake_flash_mla_call.calls.append(dict(locals()))
    meta = tile_scheduler_metadata
    extra_topk = None if extra_indices_in_kvcache is None else extra_indices_in_kvcache.shape[-1]
    config = (tuple(q.shape), k_cache.shape[1], indices.shape[-1], extra_topk,
              None if extra_k_cache is None else extra_k_cache.shape[1])
    schedule = _fake_schedule(q.shape[0], indices.shape[-1], extra_topk, topk_length, extra_topk_length)
    if not meta.have_initialized:
        meta.have_initialized, meta.config = True, config
        meta.tile_scheduler_metadata, meta.num_splits = schedule, torch.arange(q.shape[0] + 1, dtype=torch.int32)
        _fake_flash_mla_call.plannings += 1
    else:
        assert meta.config == config, "sched_meta reused with other shapes"
        assert torch.equal(meta.tile_scheduler_metadata, schedule), "sched_meta reused with other lengths"
    layout = get_layout("fp8_ds_mla")
    page_bytes = layout.page_bytes(k_cache.shape[1])
    kwargs = {}
    if extra_k_cache is not None:
        kwargs = dict(
            extra_cache=pages_from_view(extra_k_cache, layout.page_bytes(extra_k_cache.shape[1])),
            extra_indices=extra_indices_in_kvcache,
            extra_topk_length=extra_topk_length,
        )
    out, lse = sparse_mla_decode(
        q, pages_from_view(k_cache, page_bytes), layout, indices, softmax_scale, attn_sink, topk_length, **kwargs
    )
    return out.to(torch.bfloat16), lse.transpose(1, 2).contiguous()  # FlashMLA: lse [b, h_q, s_q]


_fake_flash_mla_call.calls = []
_fake_flash_mla_call.plannings = 0


@pytest.fixture
def fake_flash_mla(fake_module):
    _fake_flash_mla_call.calls = []
    _fake_flash_mla_call.plannings = 0
    metas = []

    def get_mla_metadata(*args, **kwargs):
        metas.append(_SchedMeta())
        return metas[-1], None

    mod = fake_module("flash_mla", get_mla_metadata=get_mla_metadata, flash_mla_with_kvcache=_fake_flash_mla_call)
    mod.metas = metas
    return mod


def _assert_planning_call(call, real):
    """The plan's dummy call: the real call's shapes and lengths, nothing to read (all indices -1)."""
    assert call["tile_scheduler_metadata"] is real["tile_scheduler_metadata"]
    assert call["q"].shape == real["q"].shape and not call["q"].any()
    assert call["k_cache"].shape[1:] == real["k_cache"].shape[1:] and call["k_cache"].data_ptr() != real["k_cache"].data_ptr()
    assert bool((call["indices"] == -1).all()) and call["indices"].shape == real["indices"].shape


@pytest.mark.parametrize(("heads", "padded"), [(4, 64), (64, 64), (100, 128), (128, 128)])
def test_flashmla_mapping(fake_flash_mla, gen, heads, padded) -> None:
    b, s, block_size = 2, 2, 64
    layout = get_layout("fp8_ds_mla")
    cache = make_cache("fp8_ds_mla", 3, block_size, gen)
    extra = make_cache("fp8_ds_mla", 2, block_size, gen)
    q = torch.randn(b, s, heads, 512, generator=gen).to(torch.bfloat16)
    idx = random_indices(b, s, 16, 3 * block_size, gen)
    extra_idx = random_indices(b, s, 8, 2 * block_size, gen)
    sink = torch.randn(heads, generator=gen)
    topk_length, extra_topk_length = torch.tensor([16, 9]), torch.tensor([3, 8])

    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", block_size, platform="cuda", capability=(9, 0))
    got = impl.forward_decode(
        q, cache, idx, softmax_scale=SCALE, attn_sink=sink, topk_length=topk_length,
        extra_kv_cache=extra, extra_indices=extra_idx, extra_topk_length=extra_topk_length,
    )

    planning, call = _fake_flash_mla_call.calls
    _assert_planning_call(planning, call)
    assert _fake_flash_mla_call.plannings == 1
    assert call["q"].shape == (b, s, padded, 512) and call["q"].dtype == torch.bfloat16
    assert not call["q"][:, :, heads:].any(), "padded heads must be zero"
    k_cache = call["k_cache"]
    assert k_cache.dtype == torch.float8_e4m3fn
    assert k_cache.shape == (3, block_size, 1, 584)
    assert k_cache.stride() == (layout.page_bytes(block_size), 584, 584, 1)
    assert k_cache.data_ptr() == cache.data_ptr()
    assert call["extra_k_cache"].data_ptr() == extra.data_ptr()
    assert call["block_table"] is None and call["cache_seqlens"] is None
    assert call["head_dim_v"] == 512 and call["num_splits"] is None
    assert call["tile_scheduler_metadata"] is fake_flash_mla.metas[-1]
    assert call["softmax_scale"] == SCALE and call["causal"] is False and call["is_fp8_kvcache"] is True
    for name in ("indices", "extra_indices_in_kvcache", "topk_length", "extra_topk_length"):
        assert call[name].dtype == torch.int32, name
    assert torch.equal(call["indices"], idx.int()) and torch.equal(call["topk_length"], topk_length.int())
    assert call["attn_sink"].dtype == torch.float32 and call["attn_sink"].shape == (padded,)

    out, lse = sparse_mla_decode(
        q, cache, layout, idx, SCALE, sink, topk_length,
        extra_cache=extra, extra_indices=extra_idx, extra_topk_length=extra_topk_length,
    )
    assert got.out.shape == (b, s, heads, 512) and got.lse.shape == (b, s, heads)
    torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got.lse, lse)


def test_flashmla_forward_decode_reuses_its_plan_for_the_same_shapes_and_lengths(fake_flash_mla, gen) -> None:
    q, cache, idx = _decode_args(gen, heads=64)
    b, k = q.shape[0], idx.shape[-1]
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 8, platform="cuda", capability=(10, 0))
    lengths = torch.full((b,), k, dtype=torch.int32)
    first = impl.forward_decode(q, cache, idx, softmax_scale=SCALE, topk_length=lengths)
    again = impl.forward_decode(q, cache, idx, softmax_scale=SCALE, topk_length=lengths)
    assert _fake_flash_mla_call.plannings == 1, "the same shapes and length tensor: the plan is reused"
    assert torch.equal(first.out, again.out) and torch.equal(first.lse, again.lse)
    metas = [c["tile_scheduler_metadata"] for c in _fake_flash_mla_call.calls]
    assert len(metas) == 3 and metas[0] is metas[1] is metas[2], "one schedule: the plan's dummy call, then two runs"
    call = _fake_flash_mla_call.calls[1]
    assert call["attn_sink"] is None and call["extra_k_cache"] is None
    lengths[0] = 1  # an in-place torch op moves the tensor's version: a new plan, with the new values
    got = impl.forward_decode(q, cache, idx, softmax_scale=SCALE, topk_length=lengths)
    assert _fake_flash_mla_call.plannings == 2  # the fake fails on a schedule of stale lengths
    want, _ = sparse_mla_decode(q, cache, "fp8_ds_mla", idx, SCALE, topk_length=lengths)
    torch.testing.assert_close(got.out.float(), want, atol=1e-2, rtol=1e-2)
    impl.forward_decode(q, cache, idx, softmax_scale=SCALE, topk_length=lengths.clone())  # another tensor
    impl.forward_decode(q, cache, idx, softmax_scale=SCALE * 2, topk_length=lengths)  # another scale
    impl.forward_decode(q, cache, idx, softmax_scale=SCALE)  # no lengths
    assert _fake_flash_mla_call.plannings == 5
    impl.forward_decode(q, cache, idx, softmax_scale=SCALE)
    assert _fake_flash_mla_call.plannings == 5
    with pytest.raises(ValueError, match="indices"):  # a new shape is validated in full
        impl.forward_decode(q, cache, idx[:1], softmax_scale=SCALE)


def test_flashmla_forward_decode_omits_unused_options(fake_flash_mla, gen) -> None:
    q, cache, idx = _decode_args(gen, heads=64)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 8, platform="cuda", capability=(10, 0))
    impl.forward_decode(q, cache, idx, softmax_scale=SCALE)
    call = _fake_flash_mla_call.calls[-1]
    assert call["attn_sink"] is None and call["extra_k_cache"] is None
    assert "topk_length" not in call or call["topk_length"] is None


def _layers(gen, n, b, s, heads, block_size=16, topk=12, extra_topk=20):
    """n layers' inputs: their own caches, indices, queries and sinks (one batch shape)."""
    layers = []
    for _ in range(n):
        cache = make_cache("fp8_ds_mla", 3, block_size, gen)
        extra = make_cache("fp8_ds_mla", 4, block_size, gen)
        layers.append(dict(
            q=torch.randn(b, s, heads, 512, generator=gen).to(torch.bfloat16), kv_cache=cache,
            indices=random_indices(b, s, topk, 3 * block_size, gen).int(), extra_kv_cache=extra,
            extra_indices=random_indices(b, s, extra_topk, 4 * block_size, gen).int(),
            attn_sink=torch.randn(heads, generator=gen),
        ))
    return layers


def _reference(layer, topk_length, extra_topk_length):
    return sparse_mla_decode(
        layer["q"], layer["kv_cache"], "fp8_ds_mla", layer["indices"], SCALE, layer["attn_sink"], topk_length,
        extra_cache=layer["extra_kv_cache"], extra_indices=layer["extra_indices"], extra_topk_length=extra_topk_length,
    )


@pytest.mark.parametrize("heads", [16, 64])
def test_flashmla_plan_once_then_run_every_layer(fake_flash_mla, gen, heads) -> None:
    b, s = 3, 2
    layers = _layers(gen, 3, b, s, heads)
    topk_length, extra_topk_length = torch.tensor([12, 5, 0]), torch.tensor([20, 7, 13])
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, platform="cuda", capability=(9, 0))
    plan = impl.plan(batch=b, seq_q=s, heads=heads, topk=12, extra_topk=20, softmax_scale=SCALE,
                     topk_length=topk_length, extra_topk_length=extra_topk_length, device="cpu")
    assert len(_fake_flash_mla_call.calls) == 1 and len(fake_flash_mla.metas) == 1
    topk_length[0] = 1  # the plan copied the lengths
    topk_length[0] = 12
    for layer in layers:
        got = impl.run(**layer)  # the impl's current plan
        out, lse = _reference(layer, topk_length, extra_topk_length)
        torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(got.lse, lse)
    planning, *runs = _fake_flash_mla_call.calls
    _assert_planning_call(planning, runs[0])
    assert len(runs) == 3 and len(fake_flash_mla.metas) == 1 and _fake_flash_mla_call.plannings == 1
    assert all(r["tile_scheduler_metadata"] is plan.state["meta"] for r in runs)
    assert all(r["topk_length"] is plan.topk_length for r in runs), "the lengths are the plan's buffers"
    if heads == 16:  # the padded q buffer is the plan's, reused by every layer; each sink is padded once
        assert len({r["q"].data_ptr() for r in runs}) == 1
        for layer in layers:
            impl.run(**layer)
        sinks = [r["attn_sink"] for r in _fake_flash_mla_call.calls[1:]]
        assert [t.data_ptr() for t in sinks[:3]] == [t.data_ptr() for t in sinks[3:]], "a sink is padded once"
        assert all(t.shape == (64,) and not t[16:].any() for t in sinks)
        # q written into the plan's query buffer: run copies nothing and decodes the same
        plan.query_buffer.copy_(layers[1]["q"])
        got = impl.run(**{**layers[1], "q": plan.query_buffer})
        assert _fake_flash_mla_call.calls[-1]["q"].data_ptr() == plan.query_buffer.data_ptr()
        torch.testing.assert_close(got.out.float(), _reference(layers[1], topk_length, extra_topk_length)[0],
                                   atol=1e-2, rtol=1e-2)
        layers[0]["attn_sink"].add_(1.0)  # changed in place: padded again, with the new values
        impl.run(**layers[0])
        assert torch.equal(_fake_flash_mla_call.calls[-1]["attn_sink"][:16], layers[0]["attn_sink"].float())
    else:  # nothing to pad: the layer's own tensors go straight to the kernel
        assert plan.query_buffer is None
        assert all(r["q"] is layer["q"] and r["indices"] is layer["indices"] for r, layer in zip(runs, layers))


def test_flashmla_replan_updates_the_schedule_in_place(fake_flash_mla, gen) -> None:
    b, s, heads = 2, 1, 64
    (layer,) = _layers(gen, 1, b, s, heads)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, platform="cuda", capability=(9, 0))
    plan = impl.plan(batch=b, heads=heads, topk=12, extra_topk=20, softmax_scale=SCALE,
                     topk_length=torch.tensor([12, 3]), extra_topk_length=torch.tensor([20, 20]), device="cpu")
    impl.run(**layer, plan=plan)
    meta = plan.state["meta"]
    tsm, lens = meta.tile_scheduler_metadata, plan.topk_length
    new_topk, new_extra = torch.tensor([4, 12]), torch.tensor([1, 9])
    assert impl.replan(plan, topk_length=new_topk, extra_topk_length=new_extra) is plan
    assert plan.state["meta"] is meta and meta.tile_scheduler_metadata is tsm and plan.topk_length is lens
    assert torch.equal(tsm, _fake_schedule(b, 12, 20, new_topk, new_extra))
    got = impl.run(**layer, plan=plan)  # the fake fails on a stale schedule
    out, lse = _reference(layer, new_topk, new_extra)
    torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got.lse, lse)
    with pytest.raises(ValueError, match="seq_lens"):
        impl.replan(plan, seq_lens=torch.tensor([5, 5]))
    with pytest.raises(ValueError, match=r"\[2\]"):
        impl.replan(plan, topk_length=torch.tensor([1, 2, 3]))


def test_flashmla_run_checks_the_plan(fake_flash_mla, gen) -> None:
    b, s, heads = 2, 1, 64
    (layer,) = _layers(gen, 1, b, s, heads)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, platform="cuda", capability=(9, 0))
    with pytest.raises(ValueError, match="plan"):
        impl.run(**layer)
    plan = impl.plan(batch=b, heads=heads, topk=12, extra_topk=20, softmax_scale=SCALE, device="cpu")
    with pytest.raises(ValueError, match="q must be"):
        impl.run(**{**layer, "q": layer["q"][:1]})
    with pytest.raises(ValueError, match="indices must be"):
        impl.run(**{**layer, "indices": layer["indices"][:, :, :5]})
    with pytest.raises(ValueError, match="extra_topk"):
        impl.run(layer["q"], layer["kv_cache"], layer["indices"])
    with pytest.raises(ValueError, match="block size"):
        impl.run(**{**layer, "kv_cache": get_layout("fp8_ds_mla").allocate(2, 8)})
    other = DeepseekV4ReferenceSparseImpl("fp8_ds_mla", 16)
    with pytest.raises(ValueError, match="cannot be run"):
        other.run(**layer, plan=plan)
    with pytest.raises(ValueError, match="device"):
        impl.plan(batch=b, heads=heads, topk=12, softmax_scale=SCALE)


def _fake_sparse_decode_fwd(q, kv, indices, topk_length, attn_sink, tile_scheduler_metadata, num_splits, extra_kv,
                            extra_indices, extra_topk_length, d_v, sm_scale, out=None, enable_batch_invariant=False):
    """flash_mla_cuda.sparse_decode_fwd, the op under the interface: plans when given no schedule,
    else must be handed the schedule of these very lengths (fails on a stale one)."""
    _fake_sparse_decode_fwd.calls.append(dict(locals()))
    extra_topk = None if extra_indices is None else extra_indices.shape[-1]
    schedule = _fake_schedule(q.shape[0], indices.shape[-1], extra_topk, topk_length, extra_topk_length)
    if tile_scheduler_metadata is None:
        tile_scheduler_metadata, num_splits = schedule, torch.arange(q.shape[0] + 1, dtype=torch.int32)
    else:
        assert torch.equal(tile_scheduler_metadata, schedule), "stale schedule"
    assert d_v == 512 and out is None and enable_batch_invariant is False
    o, lse = _fake_decode(q, kv, extra_k_cache=extra_kv, extra_indices_in_kvcache=extra_indices, indices=indices,
                          attn_sink=attn_sink, topk_length=topk_length, extra_topk_length=extra_topk_length,
                          softmax_scale=sm_scale)
    return o, lse, tile_scheduler_metadata, num_splits


def _fake_decode(q, k_cache, extra_k_cache=None, extra_indices_in_kvcache=None, indices=None, attn_sink=None,
                 topk_length=None, extra_topk_length=None, softmax_scale=None):
    layout = get_layout("fp8_ds_mla")
    kwargs = {}
    if extra_k_cache is not None:
        kwargs = dict(extra_cache=pages_from_view(extra_k_cache, layout.page_bytes(extra_k_cache.shape[1])),
                      extra_indices=extra_indices_in_kvcache, extra_topk_length=extra_topk_length)
    out, lse = sparse_mla_decode(q, pages_from_view(k_cache, layout.page_bytes(k_cache.shape[1])), layout, indices,
                                 softmax_scale, attn_sink, topk_length, **kwargs)
    return out.to(torch.bfloat16), lse.transpose(1, 2).contiguous()



def _planned_with_the_kernel_op(fake_flash_mla, gen, heads):
    """A FlashMLA impl planned for 3 sequences over the fake interface whose kernel op records its
    calls; its two layers' inputs and the plan's two length tensors."""
    _fake_sparse_decode_fwd.calls = []
    fake_flash_mla.flash_mla_cuda = SimpleNamespace(sparse_decode_fwd=_fake_sparse_decode_fwd)
    layers = _layers(gen, 2, 3, 1, heads)
    lengths = [torch.tensor([12, 5, 0]), torch.tensor([20, 7, 13])]
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, platform="cuda", capability=(9, 0))
    plan = impl.plan(batch=3, heads=heads, topk=12, extra_topk=20, softmax_scale=SCALE,
                     topk_length=lengths[0], extra_topk_length=lengths[1], device="cpu")
    return impl, plan, layers, lengths


@pytest.mark.parametrize("heads", [64, 20])
def test_flashmla_run_calls_the_interfaces_kernel_op_with_the_planned_schedule(fake_flash_mla, gen, heads) -> None:
    impl, plan, layers, lengths = _planned_with_the_kernel_op(fake_flash_mla, gen, heads)
    assert plan.state["op"] is _fake_sparse_decode_fwd
    for layer in layers:
        got = impl.run(**layer)
        out, lse = _reference(layer, *lengths)
        torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(got.lse, lse)
    probe, *runs = _fake_sparse_decode_fwd.calls
    assert len(runs) == 2 and len(_fake_flash_mla_call.calls) == 1, "only the plan's dummy call goes through the interface"
    meta = plan.state["meta"]
    assert all(r["tile_scheduler_metadata"] is meta.tile_scheduler_metadata for r in [probe, *runs])
    assert all(r["topk_length"] is plan.topk_length and r["sm_scale"] == SCALE for r in runs)
    new = [torch.tensor([1, 12, 12]), torch.tensor([0, 20, 3])]
    impl.replan(plan, topk_length=new[0], extra_topk_length=new[1])
    got = impl.run(**layers[0])  # the op fails on a stale schedule
    out, lse = _reference(layers[0], *new)
    torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize("heads", [64, 20])
def test_flashmla_runs_bound_path_equals_the_general_path_and_declines_the_rest(fake_flash_mla, gen, heads) -> None:
    """plan.fast_run (run's per-call work bound once) gives the general path's outputs bit for bit, and
    returns None (the general path converts, memoizes or raises) for what it does not take."""
    impl, plan, layers, lengths = _planned_with_the_kernel_op(fake_flash_mla, gen, heads)
    b, s = 3, 1  # the helper's batch and query length
    bound, taken = plan.fast_run, []

    def spy(*args):
        got = bound(*args)
        taken.append(got is not None)
        return got

    plan.fast_run = spy
    for layer in layers:
        first = impl.run(**layer)  # a cache's first run: the general path makes its page views
        again = impl.run(**layer)
        general = impl.run_library(plan, layer["q"], layer["kv_cache"], layer["indices"], layer["extra_kv_cache"],
                                   layer["extra_indices"], layer["attn_sink"])
        for got in (first, again):
            assert torch.equal(got.out, general.out) and torch.equal(got.lse, general.lse)
            assert got.out.shape == (b, s, heads, 512) and got.lse.shape == (b, s, heads)
    assert taken == [False, True, False, True]
    layer = layers[0]
    declined = [
        {**layer, "indices": layer["indices"].long()},  # converted by the general path
        {**layer, "q": layer["q"].transpose(0, 1).contiguous().transpose(0, 1)} if s > 1 else
        {**layer, "q": layer["q"].to(torch.float32)},
        {**layer, "kv_cache": layer["kv_cache"].clone()},  # a cache not seen yet
    ]
    for args in declined:
        taken.clear()
        got = impl.run(**args)
        assert taken == [False]
        assert torch.equal(got.out, impl.run(**layer).out)
    with pytest.raises(ValueError, match="extra_kv_cache and extra_indices"):
        impl.run(**{**layer, "extra_indices": None})
    with pytest.raises(ValueError, match="q must be"):
        impl.run(**{**layer, "q": layer["q"][:2]})
    with pytest.raises(ValueError, match="attn_sink must be"):
        impl.run(**{**layer, "attn_sink": layer["attn_sink"][:-1]})
    if plan.query_buffer is not None:  # q written into the plan's buffer: no copy, same outputs
        plan.query_buffer.copy_(layer["q"])
        taken.clear()
        got = impl.run(**{**layer, "q": plan.query_buffer})
        assert taken == [True] and torch.equal(got.out, impl.run(**layer).out)
    fwd = impl.forward_decode(softmax_scale=SCALE, topk_length=lengths[0], extra_topk_length=lengths[1], **layer)
    assert torch.equal(fwd.out, impl.run(**layer).out)
    # a plan without an extra cache has its own bound path
    plain = {k: v for k, v in layer.items() if not k.startswith("extra")}
    plan = impl.plan(batch=b, heads=heads, topk=12, softmax_scale=SCALE, topk_length=lengths[0], device="cpu")
    bound, taken = plan.fast_run, []
    plan.fast_run = spy
    first, again = impl.run(**plain), impl.run(**plain)
    general = impl.run_library(plan, plain["q"], plain["kv_cache"], plain["indices"], None, None, plain["attn_sink"])
    assert taken == [True, True]  # the window cache's page view is memoized already
    assert torch.equal(first.out, general.out) and torch.equal(again.lse, general.lse)
    taken.clear()
    with pytest.raises(ValueError, match="extra_kv_cache and extra_indices"):
        impl.run(**layer)
    assert taken == [False]


def test_flashmla_forward_decode_again_takes_the_last_plans_bound_path(fake_flash_mla, gen) -> None:
    """A repeated forward_decode with the same scale and length tensors runs the last plan's bound path
    (no key of every argument); a length changed in place, or another shape, still gets its own plan."""
    fake_flash_mla.flash_mla_cuda = SimpleNamespace(sparse_decode_fwd=_fake_sparse_decode_fwd)
    _fake_sparse_decode_fwd.calls = []
    layers = _layers(gen, 2, 3, 1, 20)
    lengths = [torch.tensor([12, 5, 0]), torch.tensor([20, 7, 13])]
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, platform="cuda", capability=(9, 0))
    for layer in layers + layers:
        got = impl.forward_decode(softmax_scale=SCALE, topk_length=lengths[0], extra_topk_length=lengths[1], **layer)
        out, lse = _reference(layer, *lengths)
        torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(got.lse, lse)
    assert len(impl._forward_plans) == 1 and impl._forward_last[1] is next(iter(impl._forward_plans.values()))
    lengths[1][0] = 3  # in place: the version moves, the fake op fails on a stale schedule
    got = impl.forward_decode(softmax_scale=SCALE, topk_length=lengths[0], extra_topk_length=lengths[1], **layers[0])
    torch.testing.assert_close(got.out.float(), _reference(layers[0], *lengths)[0], atol=1e-2, rtol=1e-2)
    assert len(impl._forward_plans) == 2
    with pytest.raises(ValueError, match="indices"):  # another shape: validated in full
        impl.forward_decode(softmax_scale=SCALE, topk_length=lengths[0], extra_topk_length=lengths[1],
                            **{**layers[0], "indices": layers[0]["indices"][:2]})


def test_flashmla_run_keeps_the_interface_when_the_op_differs(fake_flash_mla, gen) -> None:
    def other_op(q, kv, indices, topk_length, attn_sink, tile_scheduler_metadata, num_splits, extra_kv):
        raise AssertionError("must not be called with this arity")

    fake_flash_mla.flash_mla_cuda = SimpleNamespace(sparse_decode_fwd=other_op)
    (layer,) = _layers(gen, 1, 2, 1, 64)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, platform="cuda", capability=(9, 0))
    impl.plan(batch=2, heads=64, topk=12, extra_topk=20, softmax_scale=SCALE, device="cpu")
    assert impl._current_plan.state["op"] is None
    got = impl.run(**layer)
    assert len(_fake_flash_mla_call.calls) == 2  # the dummy call, then run through the interface
    torch.testing.assert_close(got.out.float(), _reference(layer, None, None)[0], atol=1e-2, rtol=1e-2)


def test_plan_without_the_library_raises_or_plans_the_reference(no_libraries, gen) -> None:
    (layer,) = _layers(gen, 1, 2, 1, 8)
    strict = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, platform="cuda", capability=(9, 0))
    with pytest.raises(KernelUnavailableError, match="FlashMLA"):
        strict.plan(batch=2, heads=8, topk=12, extra_topk=20, softmax_scale=SCALE, device="cpu")
    lenient = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 16, fallback="reference", platform="cuda", capability=(9, 0))
    lengths = torch.tensor([3, 12]), torch.tensor([20, 1])
    plan = lenient.plan(batch=2, heads=8, topk=12, extra_topk=20, softmax_scale=SCALE,
                        topk_length=lengths[0], extra_topk_length=lengths[1], device="cpu")
    assert plan.library is None
    got = lenient.run(**layer)
    out, lse = _reference(layer, *lengths)
    assert torch.equal(got.out, out.to(torch.bfloat16)) and torch.equal(got.lse, lse)


def test_flashmla_rejects_more_than_128_heads(fake_flash_mla, gen) -> None:
    q, cache, idx = _decode_args(gen, heads=129)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 8, platform="cuda", capability=(9, 0))
    with pytest.raises(ValueError, match=r"h_q in \{64, 128\}"):
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE)


# ---------------------------------------------------------------------------
# FlashInfer mapping
# ---------------------------------------------------------------------------


def _fake_trtllm_dsv4(query, swa_kv_cache, workspace_buffer, sparse_indices=None, compressed_kv_cache=None,
                      sparse_topk_lens=None, seq_lens=None, out=None, bmm1_scale=1.0, bmm2_scale=1.0, sinks=None,
                      kv_layout="HND", cum_seq_lens_q=None, max_q_len=None, enable_pdl=None, swa_topk_lens=None,
                      extra_sparse_indices=None, extra_sparse_topk_lens=None):
    """flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4, both conventions, as its docstring states."""
    _fake_trtllm_dsv4.calls.append(dict(locals()))
    b, s, h, _ = query.shape
    tokens = b * s
    if _fake_trtllm_dsv4.arch == 10:
        # TRTLLM-gen: plain rows; first 128 table columns index the SWA pool, the rest the compressed pool.
        swa = swa_kv_cache.reshape(-1, 512).float()
        comp = compressed_kv_cache.reshape(-1, 512).float()
        cols = torch.arange(sparse_indices.shape[1], device=sparse_indices.device).view(1, -1)
        valid = (sparse_indices >= 0) & (cols < sparse_topk_lens.view(-1, 1))
        safe = sparse_indices.clamp_min(0).long()
        rows = torch.where(
            (cols < 128).unsqueeze(-1),
            swa[safe.clamp_max(swa.shape[0] - 1)],
            comp[safe.clamp_max(comp.shape[0] - 1)],
        )
        out, _ = reference_rows_decode(query.float().view(tokens, h, 512), rows, valid, bmm1_scale, sinks, bmm2_scale)
        return out.view(b, s, h, 512).to(torch.bfloat16)
    # SM12x packed sparse: fp8_ds_mla pages behind uint8 views; per-token segment lengths.
    layout = get_layout("fp8_ds_mla")
    kwargs = {}
    if compressed_kv_cache is not None:
        assert torch.equal(extra_sparse_topk_lens.view(b, s), extra_sparse_topk_lens.view(b, s)[:, :1].expand(b, s))
        kwargs = dict(
            extra_cache=pages_from_view(compressed_kv_cache, layout.page_bytes(compressed_kv_cache.shape[1])),
            extra_indices=extra_sparse_indices,
            extra_topk_length=extra_sparse_topk_lens.view(b, s)[:, 0],
        )
    out, _ = sparse_mla_decode(
        query, pages_from_view(swa_kv_cache, layout.page_bytes(swa_kv_cache.shape[1])), layout, sparse_indices,
        bmm1_scale, sinks, swa_topk_lens.view(b, s)[:, 0], **kwargs,
    )
    return out.to(torch.bfloat16)


@pytest.fixture
def fake_flashinfer(fake_module):
    def install(arch: int, module: str = "flashinfer.mla"):
        _fake_trtllm_dsv4.calls = []
        _fake_trtllm_dsv4.arch = arch
        return fake_module(module, trtllm_batch_decode_sparse_mla_dsv4=_fake_trtllm_dsv4)

    return install


def _window_and_compressed(gen, layout_name, layout=None, b=2, s=1, block_size=64):
    swa = make_cache(layout_name, 2, block_size, gen, layout)
    comp = make_cache(layout_name, 3, block_size, gen, layout)
    window = random_indices(b, s, 128, 2 * block_size, gen)
    compressed = random_indices(b, s, 30, 3 * block_size, gen)
    return swa, comp, window, compressed


@pytest.mark.parametrize("heads", [4, 16, 100])
def test_flashinfer_sm100_bf16_row_mapping(fake_flashinfer, gen, heads) -> None:
    fake_flashinfer(10)
    swa, comp, window, compressed = _window_and_compressed(gen, "bf16_row")
    q = torch.randn(2, 1, heads, 512, generator=gen).to(torch.bfloat16)
    sink = torch.randn(heads, generator=gen)
    topk_length, extra_topk_length, seq_lens = torch.tensor([128, 70]), torch.tensor([30, 11]), torch.tensor([900, 70])
    impl = DeepseekV4FlashInferMLASparseImpl("bf16_row", 64, platform="cuda", capability=(10, 0), workspace_bytes=4096)
    got = impl.forward_decode(
        q, swa, window, softmax_scale=SCALE, attn_sink=sink, topk_length=topk_length,
        extra_kv_cache=comp, extra_indices=compressed, extra_topk_length=extra_topk_length, seq_lens=seq_lens,
    )
    (call,) = _fake_trtllm_dsv4.calls
    padded = {4: 8, 16: 16, 100: 128}[heads]
    assert call["query"].shape == (2, 1, padded, 512) and call["query"].dtype == torch.bfloat16
    assert call["swa_kv_cache"].data_ptr() == swa.data_ptr() and call["swa_kv_cache"].shape == (2, 64, 512)
    assert call["compressed_kv_cache"].data_ptr() == comp.data_ptr()
    table = call["sparse_indices"]
    assert table.dtype == torch.int32 and table.shape == (2, 160)  # 128 + 30, padded to a multiple of 4
    assert bool((table[1, 70:128] == -1).all()), "window columns past topk_length must be -1"
    assert bool((table[:, 158:] == -1).all())
    assert call["sparse_topk_lens"].tolist() == [158, 139] and call["sparse_topk_lens"].dtype == torch.int32
    assert call["seq_lens"].tolist() == [900, 70] and call["seq_lens"].dtype == torch.int32
    assert call["bmm1_scale"] == pytest.approx(SCALE) and call["bmm2_scale"] == 1.0
    assert call["sinks"].shape == (padded,) and call["sinks"].dtype == torch.float32
    assert call["kv_layout"] == "HND" and call["workspace_buffer"].numel() == 4096
    assert got.lse is None

    out, _ = sparse_mla_decode(
        q, swa, "bf16_row", window, SCALE, sink, topk_length,
        extra_cache=comp, extra_indices=compressed, extra_topk_length=extra_topk_length,
    )
    torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)


def test_flashinfer_sm100_fp8_row_folds_the_scales_into_bmm1_and_bmm2(fake_flashinfer, gen) -> None:
    fake_flashinfer(10)
    layout = get_layout("fp8_e4m3_row").with_scale(0.5)
    swa, comp, window, compressed = _window_and_compressed(gen, "fp8_e4m3_row", layout)
    q = torch.randn(2, 1, 8, 512, generator=gen)
    impl = DeepseekV4FlashInferMLASparseImpl(
        "fp8_e4m3_row", 64, kv_scale=0.5, q_scale=2.0, platform="cuda", capability=(10, 0), workspace_bytes=64
    )
    got = impl.forward_decode(
        q, swa, window, softmax_scale=SCALE, extra_kv_cache=comp, extra_indices=compressed,
        seq_lens=torch.tensor([500, 500]),
    )
    (call,) = _fake_trtllm_dsv4.calls
    assert call["query"].dtype == torch.float8_e4m3fn, "TRTLLM-gen needs query and KV in one dtype"
    assert call["swa_kv_cache"].dtype == torch.float8_e4m3fn
    assert call["bmm1_scale"] == pytest.approx(SCALE * 2.0 * 0.5) and call["bmm2_scale"] == 0.5
    q_seen = call["query"].float() * 2.0  # what the kernel's query stands for
    out, _ = sparse_mla_decode(q_seen, swa, layout, window, SCALE, extra_cache=comp, extra_indices=compressed)
    torch.testing.assert_close(got.out.float(), out, atol=2e-2, rtol=2e-2)


def test_flashinfer_sm100_window_only_layer_reuses_the_window_pool(fake_flashinfer, gen) -> None:
    fake_flashinfer(10)
    swa = make_cache("bf16_row", 2, 64, gen)
    window = random_indices(1, 1, 100, 128, gen)
    q = torch.randn(1, 1, 8, 512, generator=gen)
    impl = DeepseekV4FlashInferMLASparseImpl("bf16_row", 64, platform="cuda", capability=(10, 0), workspace_bytes=64)
    got = impl.forward_decode(q, swa, window, softmax_scale=SCALE, seq_lens=torch.tensor([100]))
    (call,) = _fake_trtllm_dsv4.calls
    assert call["sparse_indices"].shape == (1, 128) and call["sparse_topk_lens"].tolist() == [128]
    assert call["compressed_kv_cache"].data_ptr() == swa.data_ptr()
    torch.testing.assert_close(got.out.float(), sparse_mla_decode(q, swa, "bf16_row", window, SCALE)[0], atol=1e-2, rtol=1e-2)


def test_flashinfer_sm100_needs_seq_lens(fake_flashinfer, gen) -> None:
    fake_flashinfer(10)
    q, cache, idx = _decode_args(gen, "bf16_row")
    impl = DeepseekV4FlashInferMLASparseImpl("bf16_row", 8, platform="cuda", capability=(10, 0), workspace_bytes=64)
    with pytest.raises(ValueError, match="seq_lens"):
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE)


@pytest.mark.parametrize("module", ["flashinfer.mla", "flashinfer.decode"])
def test_flashinfer_sm120_fp8_ds_mla_mapping(fake_flashinfer, gen, module) -> None:
    fake_flashinfer(12, module)
    block_size = 64
    swa, comp, window, compressed = _window_and_compressed(gen, "fp8_ds_mla", b=2, s=2)
    q = torch.randn(2, 2, 20, 512, generator=gen).to(torch.bfloat16)
    sink = torch.randn(20, generator=gen)
    topk_length, extra_topk_length = torch.tensor([128, 40]), torch.tensor([7, 30])
    impl = DeepseekV4FlashInferMLASparseImpl("fp8_ds_mla", block_size, platform="cuda", capability="12.0", workspace_bytes=64)
    got = impl.forward_decode(
        q, swa, window, softmax_scale=SCALE, attn_sink=sink, topk_length=topk_length,
        extra_kv_cache=comp, extra_indices=compressed, extra_topk_length=extra_topk_length,
    )
    (call,) = _fake_trtllm_dsv4.calls
    page = get_layout("fp8_ds_mla").page_bytes(block_size)
    assert call["query"].shape == (2, 2, 32, 512)
    assert call["swa_kv_cache"].dtype == torch.uint8 and call["swa_kv_cache"].shape == (2, block_size, 584)
    assert call["swa_kv_cache"].stride() == (page, 584, 1)
    assert call["sparse_indices"].shape == (2, 2, 128) and call["sparse_indices"].dtype == torch.int32
    assert call["swa_topk_lens"].tolist() == [128, 128, 40, 40]
    assert call["extra_sparse_topk_lens"].tolist() == [7, 7, 30, 30]
    assert call["bmm1_scale"] == pytest.approx(SCALE) and call["bmm2_scale"] == 1.0
    assert call["seq_lens"] is None and call["sparse_topk_lens"] is None
    out, _ = sparse_mla_decode(
        q, swa, "fp8_ds_mla", window, SCALE, sink, topk_length,
        extra_cache=comp, extra_indices=compressed, extra_topk_length=extra_topk_length,
    )
    torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)


@pytest.mark.parametrize(("layout", "capability", "needle"), [("fp8_ds_mla", (10, 0), "plain"), ("bf16_row", (12, 0), "packed")])
def test_flashinfer_layout_must_match_the_gpu_generation(fake_flashinfer, gen, layout, capability, needle) -> None:
    fake_flashinfer(capability[0])
    q, cache, idx = _decode_args(gen, layout)
    impl = DeepseekV4FlashInferMLASparseImpl(layout, 8, platform="cuda", capability=capability, workspace_bytes=64)
    with pytest.raises(UnsupportedLayoutError, match=needle):
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE, seq_lens=torch.tensor([8, 8]))


# ---------------------------------------------------------------------------
# AITER mapping
# ---------------------------------------------------------------------------


def _fake_mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                         page_size=1, nhead_kv=1, sm_scale=None, logit_cap=0.0, num_kv_splits=None,
                         return_lse=False, **kwargs):
    """aiter.mla.mla_decode_fwd with the DeepSeek-V3 ABI: q.k over 576 columns, v = first 512, lse on request."""
    _fake_mla_decode_fwd.calls.append(dict(locals()))
    assert page_size == 1 and nhead_kv == 1 and max_seqlen_q == 1
    assert kv_buffer.shape[1:] == (1, 1, 576) and q.shape[-1] == 576 and o.shape[-1] == 512
    tokens = q.shape[0]
    lse = torch.empty(tokens, q.shape[1])
    for t in range(tokens):
        assert int(qo_indptr[t + 1] - qo_indptr[t]) == 1
        rows = kv_buffer[kv_indices[kv_indptr[t] : kv_indptr[t + 1]].long(), 0, 0].double()
        logits = sm_scale * q[t].double() @ rows.T  # [h, n]
        lse[t] = torch.logsumexp(logits, dim=-1).float()
        o[t] = (torch.softmax(logits, dim=-1) @ rows[:, :512]).to(o.dtype)
    return o, (lse if return_lse else None)


def test_aiter_mapping(fake_module, gen) -> None:
    _fake_mla_decode_fwd.calls = []
    fake_module("aiter.mla", mla_decode_fwd=_fake_mla_decode_fwd)
    block_size = 16
    cache = make_cache("fp8_ds_mla", 3, block_size, gen)
    extra = make_cache("fp8_ds_mla", 2, block_size, gen)
    b, s, h = 3, 2, 16
    q = torch.randn(b, s, h, 512, generator=gen).to(torch.bfloat16)
    idx = random_indices(b, s, 10, 3 * block_size, gen)
    extra_idx = random_indices(b, s, 6, 2 * block_size, gen)
    idx[2, 1] = -1
    extra_idx[2, 1] = -1  # token (2, 1) selects nothing
    sink = torch.randn(h, generator=gen)
    topk_length = torch.tensor([10, 4, 10])

    impl = DeepseekV4ROCMAiterMLASparseImpl("fp8_ds_mla", block_size, platform="rocm", capability="gfx942")
    got = impl.forward_decode(
        q, cache, idx, softmax_scale=SCALE, attn_sink=sink, topk_length=topk_length,
        extra_kv_cache=extra, extra_indices=extra_idx,
    )
    (call,) = _fake_mla_decode_fwd.calls
    assert call["q"].shape == (b * s, h, 576) and not call["q"][..., 512:].any()
    assert call["kv_buffer"].dtype == torch.bfloat16 and not call["kv_buffer"][..., 512:].any()
    assert call["qo_indptr"].tolist() == list(range(b * s + 1))
    assert call["kv_last_page_lens"].tolist() == [1] * (b * s)
    assert all(call[k].dtype == torch.int32 for k in ("qo_indptr", "kv_indptr", "kv_indices", "kv_last_page_lens"))
    counts = (call["kv_indptr"][1:] - call["kv_indptr"][:-1]).tolist()
    assert counts[-1] == 1 and min(counts) >= 1, "an empty token must read the zero row, not nothing"
    assert call["sm_scale"] == pytest.approx(SCALE) and call["return_lse"] is True

    out, lse = sparse_mla_decode(
        q, cache, "fp8_ds_mla", idx, SCALE, sink, topk_length, extra_cache=extra, extra_indices=extra_idx
    )
    assert not got.out[2, 1].any() and bool((got.lse[2, 1] == math.inf).all())
    torch.testing.assert_close(got.out.float(), out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got.lse, lse, atol=1e-4, rtol=1e-5)


# ---------------------------------------------------------------------------
# FlashInfer and AITER: plan once, run every layer, replan in place
# ---------------------------------------------------------------------------


def _fi_layers(gen, layout_name, n, b, s, heads, device="cpu", layout=None):
    layers = []
    for _ in range(n):
        swa, comp, window, compressed = _window_and_compressed(gen, layout_name, layout, b=b, s=s)
        layers.append(dict(
            q=torch.randn(b, s, heads, 512, generator=gen).to(torch.bfloat16).to(device), kv_cache=swa.to(device),
            indices=window.int().to(device), extra_kv_cache=comp.to(device), extra_indices=compressed.int().to(device),
            attn_sink=torch.randn(heads, generator=gen).to(device),
        ))
    return layers


def _check_against_reference(got, layer, layout, topk_length, extra_topk_length, atol=1e-2):
    out, _ = sparse_mla_decode(
        layer["q"], layer["kv_cache"], layout, layer["indices"], SCALE, layer["attn_sink"], topk_length,
        extra_cache=layer["extra_kv_cache"], extra_indices=layer["extra_indices"], extra_topk_length=extra_topk_length,
    )
    torch.testing.assert_close(got.out.float(), out, atol=atol, rtol=atol)


@pytest.mark.parametrize(("arch", "layout_name", "heads"), [(10, "bf16_row", 16), (10, "bf16_row", 20), (12, "fp8_ds_mla", 20)])
def test_flashinfer_plan_once_then_run_every_layer_and_replan(fake_flashinfer, gen, arch, layout_name, heads) -> None:
    fake_flashinfer(arch)
    b, s = 2, 2 if arch == 12 else 1
    layers = _fi_layers(gen, layout_name, 2, b, s, heads)
    lengths = [torch.tensor([128, 70]), torch.tensor([30, 11])]
    seq_lens = torch.tensor([900, 70]) if arch == 10 else None
    impl = DeepseekV4FlashInferMLASparseImpl(layout_name, 64, platform="cuda", capability=(arch, 0), workspace_bytes=64)
    plan = impl.plan(batch=b, seq_q=s, heads=heads, topk=128, extra_topk=30, softmax_scale=SCALE,
                     topk_length=lengths[0], extra_topk_length=lengths[1], seq_lens=seq_lens, device="cpu")
    for layer in layers:
        _check_against_reference(impl.run(**layer), layer, layout_name, *lengths)
    first, second = _fake_trtllm_dsv4.calls
    same = ["workspace_buffer", "sparse_topk_lens", "seq_lens"] if arch == 10 else ["workspace_buffer", "swa_topk_lens", "extra_sparse_topk_lens"]
    if heads != 16:
        same += ["query", "sinks"]  # padded: the plan's buffers
    for name in same:
        assert first[name] is second[name], f"{name} must be the plan's buffer"
    if arch == 10:
        assert first["sparse_indices"].data_ptr() == second["sparse_indices"].data_ptr(), "the index table is planned"
    new = [torch.tensor([5, 128]), torch.tensor([0, 30])]
    planned = {k: v for k, v in plan.state.items() if isinstance(v, torch.Tensor)}
    impl.replan(plan, topk_length=new[0], extra_topk_length=new[1])
    assert all(plan.state[k] is v for k, v in planned.items()), "replan must update the planned tensors in place"
    got = impl.run(**layers[0])
    third = _fake_trtllm_dsv4.calls[-1]
    for name in same:
        assert third[name] is first[name], f"replan must keep {name} in place"
    _check_against_reference(got, layers[0], layout_name, *new)


def test_aiter_plan_once_then_run_every_layer_and_replan(fake_module, gen) -> None:
    _fake_mla_decode_fwd.calls = []
    fake_module("aiter.mla", mla_decode_fwd=_fake_mla_decode_fwd)
    b, s, h, block_size = 3, 2, 16, 16
    layers = []
    for _ in range(2):
        layers.append(dict(
            q=torch.randn(b, s, h, 512, generator=gen).to(torch.bfloat16),
            kv_cache=make_cache("fp8_ds_mla", 3, block_size, gen), indices=random_indices(b, s, 10, 3 * block_size, gen),
            extra_kv_cache=make_cache("fp8_ds_mla", 2, block_size, gen),
            extra_indices=random_indices(b, s, 6, 2 * block_size, gen), attn_sink=torch.randn(h, generator=gen),
        ))
    layers[1]["indices"][2, 1] = -1
    layers[1]["extra_indices"][2, 1] = -1  # a token that selects nothing
    lengths = [torch.tensor([10, 4, 10]), torch.tensor([6, 6, 2])]
    impl = DeepseekV4ROCMAiterMLASparseImpl("fp8_ds_mla", block_size, platform="rocm", capability="gfx950")
    plan = impl.plan(batch=b, seq_q=s, heads=h, topk=10, extra_topk=6, softmax_scale=SCALE,
                     topk_length=lengths[0], extra_topk_length=lengths[1], device="cpu")
    for layer in layers:
        got = impl.run(**layer)
        _check_against_reference(got, layer, "fp8_ds_mla", *lengths)
    assert not got.out[2, 1].any() and bool((got.lse[2, 1] == math.inf).all())
    first, second = _fake_mla_decode_fwd.calls
    for name in ("q", "kv_buffer", "qo_indptr", "kv_indices", "kv_last_page_lens"):
        assert first[name] is second[name], f"{name} must be the plan's buffer"
    keep = plan.state["keep"], plan.state["extra_keep"]
    impl.replan(plan, topk_length=torch.tensor([1, 10, 0]), extra_topk_length=torch.tensor([0, 3, 6]))
    assert (plan.state["keep"], plan.state["extra_keep"]) == keep, "replan must update the masks in place"
    _check_against_reference(impl.run(**layers[0]), layers[0], "fp8_ds_mla", torch.tensor([1, 10, 0]),
                             torch.tensor([0, 3, 6]))
    assert _fake_mla_decode_fwd.calls[-1]["kv_buffer"] is first["kv_buffer"]


# CUDA graph capture of run(): the libraries do not run on an H200, so these use fakes written
# with fixed-size torch ops only (capturable); a host sync or a data-dependent shape in the
# adapter's run() makes the capture fail.


def _dense_mla_decode_fwd(q, kv_buffer, o, qo_indptr, kv_indptr, kv_indices, kv_last_page_lens, max_seqlen_q,
                          page_size=1, nhead_kv=1, sm_scale=None, return_lse=False, **kwargs):
    """aiter.mla.mla_decode_fwd's semantics in fixed-size torch ops (capturable)."""
    cap = kv_indices.numel()
    pos = kv_indptr[:-1].long().view(-1, 1) + torch.arange(cap, device=q.device).view(1, -1)
    valid = pos < kv_indptr[1:].long().view(-1, 1)
    rows = kv_buffer[kv_indices[pos.clamp(max=cap - 1)].long(), 0, 0].float()  # [T, cap, 576]
    logits = (sm_scale * torch.einsum("thd,tkd->thk", q.float(), rows)).masked_fill(~valid.unsqueeze(1), -math.inf)
    lse = torch.logsumexp(logits, dim=-1)
    o.copy_(torch.einsum("thk,tkd->thd", torch.softmax(logits, dim=-1), rows[..., :512]).to(o.dtype))
    return o, (lse if return_lse else None)


def _dense_trtllm_sm120(query, swa_kv_cache, workspace_buffer, sparse_indices=None, swa_topk_lens=None,
                        compressed_kv_cache=None, extra_sparse_indices=None, extra_sparse_topk_lens=None,
                        bmm1_scale=1.0, bmm2_scale=1.0, sinks=None, kv_layout="HND", **kwargs):
    """FlashInfer's SM12x packed sparse decode in fixed-size torch ops (capturable)."""
    layout = get_layout("fp8_ds_mla")
    b, s, h, _ = query.shape
    tokens = b * s

    def rows(view, idx, lens):
        k = idx.shape[-1]
        valid = (idx.reshape(tokens, k) >= 0) & (torch.arange(k, device=idx.device).view(1, -1) < lens.view(-1, 1))
        slots = torch.where(valid, idx.reshape(tokens, k).long(), -1).reshape(-1)
        pages = pages_from_view(view, layout.page_bytes(view.shape[1]))
        return layout.read(pages, slots, check=False).float().view(tokens, k, 512), valid

    kv, valid = rows(swa_kv_cache, sparse_indices, swa_topk_lens)
    if compressed_kv_cache is not None:
        kv2, valid2 = rows(compressed_kv_cache, extra_sparse_indices, extra_sparse_topk_lens)
        kv, valid = torch.cat([kv, kv2], 1), torch.cat([valid, valid2], 1)
    out, _ = reference_rows_decode(query.float().view(tokens, h, 512), kv, valid, bmm1_scale, sinks, bmm2_scale)
    return out.view(b, s, h, 512).to(torch.bfloat16)


def _capture_and_replay(impl, layers, plan):
    static = {k: v.clone() for k, v in layers[0].items()}
    impl.run(**static, plan=plan)  # warm up (Triton compiles) outside the capture
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = impl.run(**static, plan=plan)
    torch.cuda.current_stream().wait_stream(stream)
    results = []
    for layer in layers[::-1]:
        for key, value in layer.items():
            static[key].copy_(value)
        graph.replay()
        results.append((layer, captured.out.clone()))
    return graph, static, captured, results


@pytest.mark.gpu
@pytest.mark.parametrize("impl_kind", ["flashinfer-sm100", "flashinfer-sm120", "aiter"])
def test_run_of_flashinfer_and_aiter_can_be_captured_in_a_cuda_graph(fake_module, gen, impl_kind) -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch: CUDA graph capture needs a GPU")
    b, s, h = 2, 1, 20
    lengths = [torch.tensor([128, 70], device="cuda"), torch.tensor([30, 11], device="cuda")]
    if impl_kind == "aiter":
        fake_module("aiter.mla", mla_decode_fwd=_dense_mla_decode_fwd)
        impl = DeepseekV4ROCMAiterMLASparseImpl("fp8_ds_mla", 64, platform="rocm", capability="gfx950")
        layout_name, seq_lens = "fp8_ds_mla", None
    else:
        arch = 10 if impl_kind == "flashinfer-sm100" else 12
        _fake_trtllm_dsv4.calls, _fake_trtllm_dsv4.arch = [], arch
        fn = _fake_trtllm_dsv4 if arch == 10 else _dense_trtllm_sm120
        fake_module("flashinfer.mla", trtllm_batch_decode_sparse_mla_dsv4=fn)
        layout_name = "bf16_row" if arch == 10 else "fp8_ds_mla"
        seq_lens = torch.tensor([900, 70], device="cuda") if arch == 10 else None
        impl = DeepseekV4FlashInferMLASparseImpl(layout_name, 64, platform="cuda", capability=(arch, 0),
                                                  workspace_bytes=1 << 20)
    layers = _fi_layers(gen, layout_name, 2, b, s, h, device="cuda")
    plan = impl.plan(batch=b, seq_q=s, heads=h, topk=128, extra_topk=30, softmax_scale=SCALE,
                     topk_length=lengths[0], extra_topk_length=lengths[1], seq_lens=seq_lens)
    graph, static, captured, results = _capture_and_replay(impl, layers, plan)
    for layer, out in results:
        _check_against_reference(SimpleNamespace(out=out), layer, layout_name, *lengths, atol=2e-2)
    new = [torch.tensor([3, 128], device="cuda"), torch.tensor([30, 0], device="cuda")]
    impl.replan(plan, topk_length=new[0], extra_topk_length=new[1])
    graph.replay()  # static holds layers[0]
    _check_against_reference(SimpleNamespace(out=captured.out), layers[0], layout_name, *new, atol=2e-2)


# ---------------------------------------------------------------------------
# capability parsing (what the CLI hands is_available)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [((9, 0), (9, 0)), ("9.0", (9, 0)), ("sm_90", (9, 0)), ("sm100", (10, 0)), ("12.1", (12, 1)),
     (10, (10, 0)), (9.0, (9, 0)), ("gfx942", (9, 4)), ("gfx950", (9, 5)), ("gfx1100", (11, 0)), ("gfx942:sramecc+:xnack-", (9, 4)), (None, None), ("unknown", None)],
)
def test_parse_capability(value, expected) -> None:
    assert parse_capability(value) == expected


@pytest.mark.parametrize("value", ["nine", "9", (9,), True, -1, "gfx"])
def test_parse_capability_rejects_garbage(value) -> None:
    with pytest.raises(ValueError):
        parse_capability(value)


# ---------------------------------------------------------------------------
# Which FlashMLA: the flash_mla package, else vLLM's bundled build
# ---------------------------------------------------------------------------

_FAKE_EXTENSION = '''
import sys
LOADS = getattr(sys, "_dsv4sel_fake_ext_loads", 0) + 1
sys._dsv4sel_fake_ext_loads = LOADS
'''

_FAKE_INTERFACE = '''
import dataclasses
import vllm._flashmla_C  # as vLLM's copy of the interface does
EXTENSION = vllm._flashmla_C


@dataclasses.dataclass
class FlashMLASchedMeta:
    have_initialized: bool = False


def get_mla_metadata(*args, **kwargs):
    return FlashMLASchedMeta(), None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, out=None, enable_batch_invariant=False):
    raise AssertionError("not called here")
'''


def _fake_vllm_bundle(root, top_level_init=None):
    """A folder laid out like vLLM's wheel: vllm/_flashmla_C + vllm/third_party/flashmla/flash_mla_interface.py."""
    pkg = root / "vllm"
    (pkg / "third_party" / "flashmla").mkdir(parents=True)
    (pkg / "_flashmla_C.py").write_text(_FAKE_EXTENSION)
    (pkg / "third_party" / "flashmla" / "__init__.py").write_text("")
    (pkg / "third_party" / "flashmla" / "flash_mla_interface.py").write_text(_FAKE_INTERFACE)
    if top_level_init is not None:
        (pkg / "__init__.py").write_text(top_level_init)
    return root


@pytest.fixture
def without_flashmla(monkeypatch):
    """No flash_mla, no vLLM, no $DSV4SEL_VLLM_FLASHMLA_DIR: each test adds back the one it describes."""
    from dsv4sel.kernels.flashmla import VLLM_FLASHMLA_DIR_ENV

    monkeypatch.setitem(sys.modules, "flash_mla", None)
    monkeypatch.delenv(VLLM_FLASHMLA_DIR_ENV, raising=False)
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "path", [p for p in sys.path])
    return monkeypatch


def test_flashmla_build_from_the_folder_in_the_environment_variable(without_flashmla, tmp_path) -> None:
    from dsv4sel.kernels.flashmla import VLLM_FLASHMLA_DIR_ENV, flashmla_build

    without_flashmla.setitem(sys.modules, "vllm", None)  # no installed vLLM either
    without_flashmla.setenv(VLLM_FLASHMLA_DIR_ENV, str(_fake_vllm_bundle(tmp_path)))
    build = flashmla_build()
    assert build.source == "vllm-dir" and build.found
    assert build.location == str(tmp_path / "vllm" / "_flashmla_C.py")
    assert "DSV4SEL_VLLM_FLASHMLA_DIR" in build.describe() and str(tmp_path) in build.describe()
    assert build.module.EXTENSION.__name__ == "vllm._flashmla_C"
    assert sys.modules["vllm"] is None, "the stand-in parent package must not outlive the load"
    assert "vllm._flashmla_C" not in sys.modules
    assert flashmla_build().module is build.module, "a build is loaded once per process"
    ok, reason = DeepseekV4FlashMLASparseImpl.is_available("cuda", (9, 0))
    assert ok and "vLLM's bundled FlashMLA from $DSV4SEL_VLLM_FLASHMLA_DIR" in reason
    # the folder may also be the vllm package folder itself
    without_flashmla.setenv(VLLM_FLASHMLA_DIR_ENV, str(tmp_path / "vllm"))
    assert flashmla_build().module is build.module


def test_flashmla_build_from_the_installed_vllm_without_importing_vllm(without_flashmla, tmp_path) -> None:
    from dsv4sel.kernels.flashmla import flashmla_build

    _fake_vllm_bundle(tmp_path, top_level_init="raise RuntimeError('vllm/__init__.py must not run')\n")
    without_flashmla.syspath_prepend(str(tmp_path))
    build = flashmla_build()
    assert build.source == "vllm", build.reason
    assert build.location == str(tmp_path / "vllm" / "_flashmla_C.py")
    assert build.describe().startswith("vLLM") and "bundled FlashMLA" in build.describe()
    assert "vllm" not in sys.modules, "vLLM's top-level package must not be imported"


def test_flashmla_package_comes_first_and_missing_builds_are_explained(without_flashmla, fake_module, tmp_path) -> None:
    from dsv4sel.kernels.flashmla import VLLM_FLASHMLA_DIR_ENV, flashmla_build

    without_flashmla.setitem(sys.modules, "vllm", None)
    build = flashmla_build()
    assert build.source == "none" and build.module is None
    for needle in ("flash_mla is not importable", "DSV4SEL_VLLM_FLASHMLA_DIR is unset", "vllm is not installed"):
        assert needle in build.reason
    without_flashmla.setenv(VLLM_FLASHMLA_DIR_ENV, str(tmp_path / "nothing-here"))
    assert "does not load" in flashmla_build().reason
    ok, reason = DeepseekV4FlashMLASparseImpl.is_available("cuda", (9, 0))
    assert not ok and "nothing-here" in reason and "pip install vllm==0.33.0" in reason
    _fake_vllm_bundle(tmp_path)
    without_flashmla.setenv(VLLM_FLASHMLA_DIR_ENV, str(tmp_path))
    fake_module("flash_mla", __version__="9.9", get_mla_metadata=lambda: (None, None),
                flash_mla_with_kvcache=_fake_flash_mla_call)
    build = flashmla_build()
    assert build.source == "flash_mla" and build.version == "9.9" and build.describe().startswith("FlashMLA package")
    assert DeepseekV4FlashMLASparseImpl.build() == build


def test_eager_replay_is_chosen_for_small_cuda_plans_unless_turned_off(monkeypatch) -> None:
    """flashmla_replay.worth_replaying: CUDA plans up to MAX_REPLAY_ROWS query rows (padded heads
    counted) replay graphs in eager mode; larger ones, other devices, no fused launches, or
    $DSV4SEL_FLASHMLA_REPLAY=off call the op directly."""
    from dsv4sel.kernels import codec_support
    from dsv4sel.kernels.flashmla_replay import MAX_REPLAY_ROWS, REPLAY_ENV, worth_replaying

    def plan(batch, device="cuda"):
        return SimpleNamespace(device=torch.device(device), batch=batch, seq_q=1)

    monkeypatch.setattr(codec_support, "fused_unavailable", lambda device: None)
    fits = MAX_REPLAY_ROWS // 64
    assert worth_replaying(plan(fits), 64) and worth_replaying(plan(fits // 4), 64)
    assert not worth_replaying(plan(fits + 1), 64)
    assert not worth_replaying(plan(fits, "cpu"), 64)
    monkeypatch.setenv(REPLAY_ENV, "off")
    assert not worth_replaying(plan(1), 64)
    monkeypatch.delenv(REPLAY_ENV)
    monkeypatch.setattr(codec_support, "fused_unavailable", lambda device: "no Triton")
    assert not worth_replaying(plan(1), 64)
