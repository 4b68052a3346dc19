"""The extension API a pack implements is the one SparseMLAImpl calls (issue 18, point 1).

The example pack's impl (``examples/b12x-pack/dsv4sel_b12x/impl.py``) runs end to end on the
CPU against a stand-in ``b12x`` module that records each call and decodes, from exactly the
arguments it was handed (the uint8 page view of ``kv_cache_view``, int32 slots, the plan's
int32 lengths), what the documented kernel computes. A class that misses a required hook, or
writes one under a name the base class never calls, fails when it is defined, naming the
method to write.
"""

from __future__ import annotations

import importlib
import os
import sys

import pytest
import torch

from dsv4sel.kernels.base import DecodeOutput, SparseMLAImpl
from dsv4sel.kernels.errors import KernelUnavailableError
from dsv4sel.kernels.layouts import get_layout
from dsv4sel.kernels.reference import sparse_mla_decode

PACK = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                    "examples", "b12x-pack")
SCALE = 512**-0.5
LAYOUT = get_layout("fp8_ds_mla")


@pytest.fixture
def b12x_impl(monkeypatch):
    monkeypatch.syspath_prepend(PACK)
    module = importlib.import_module("dsv4sel_b12x.impl")
    return module.B12XMLASparseImpl


@pytest.fixture
def stand_in(fake_module):
    """A ``b12x`` module whose ``sparse_mla_decode`` records its arguments and decodes the pages it is handed."""
    calls = []

    def sparse_mla_decode_stub(q, pages, indices, *, softmax_scale, attn_sink=None, topk_length=None,
                               extra_pages=None, extra_indices=None, extra_topk_length=None):
        calls.append(dict(q=q, pages=pages, indices=indices, softmax_scale=softmax_scale, attn_sink=attn_sink,
                          topk_length=topk_length, extra_pages=extra_pages, extra_indices=extra_indices,
                          extra_topk_length=extra_topk_length))
        for view, idx in ((pages, indices), (extra_pages, extra_indices)):
            if view is None:
                continue
            # The documented arguments: the uint8 (num_blocks, block_size, 584) view, int32 slots.
            assert view.dtype == torch.uint8 and view.shape[2] == 584 and view.stride()[1:] == (584, 1)
            assert idx.dtype == torch.int32
        for lengths in (topk_length, extra_topk_length):
            assert lengths is None or lengths.dtype == torch.int32

        def cache_of(view):  # the pages from the view's base pointer and page stride, as a kernel reads them
            page_bytes = LAYOUT.page_bytes(view.shape[1])
            return view.as_strided((view.shape[0], page_bytes), (view.stride(0), 1), view.storage_offset())

        extra = {}
        if extra_pages is not None:
            extra = dict(extra_cache=cache_of(extra_pages), extra_indices=extra_indices,
                         extra_topk_length=extra_topk_length)
        out, lse = sparse_mla_decode(q, cache_of(pages), LAYOUT, indices, softmax_scale, attn_sink, topk_length,
                                     **extra)
        return out.to(torch.bfloat16), lse

    module = fake_module("b12x", sparse_mla_decode=sparse_mla_decode_stub)
    module.calls = calls
    return module


def _filled_cache(impl, num_blocks, gen):
    cache = impl.allocate_kv_cache(num_blocks)
    n = num_blocks * impl.block_size
    impl.write_kv(cache, torch.randn(n, 512, generator=gen).to(torch.bfloat16), torch.arange(n))
    return cache


def test_the_example_pack_decodes_through_its_kernel(b12x_impl, stand_in, gen) -> None:
    assert b12x_impl.is_available("cuda", "12.0") == (True, "b12x importable; cuda 12.0 supported")
    impl = b12x_impl("fp8_ds_mla", 16, platform="cuda", capability="12.1")
    cache, extra = _filled_cache(impl, 3, gen), _filled_cache(impl, 4, gen)
    b, s, h = 2, 1, 8
    q = torch.randn(b, s, h, 512, generator=gen).to(torch.bfloat16)
    idx = torch.randint(-1, 48, (b, s, 12), generator=gen)  # int64: the impl hands the kernel int32
    extra_idx = torch.randint(0, 64, (b, s, 20), generator=gen, dtype=torch.int32)
    topk_length, extra_topk_length = torch.tensor([12, 5]), torch.tensor([20, 3])
    sink = torch.randn(h, generator=gen)
    got = impl.forward_decode(q, cache, idx, softmax_scale=SCALE, attn_sink=sink, topk_length=topk_length,
                              extra_kv_cache=extra, extra_indices=extra_idx, extra_topk_length=extra_topk_length)
    (call,) = stand_in.calls
    view = impl.kv_cache_view(cache)
    assert call["pages"].data_ptr() == cache.data_ptr() and call["pages"].shape == view.shape
    assert call["pages"].stride() == view.stride() == (LAYOUT.page_bytes(16), 584, 1)
    assert call["extra_pages"].data_ptr() == extra.data_ptr()
    assert torch.equal(call["indices"], idx.int()) and call["extra_indices"] is extra_idx
    assert torch.equal(call["topk_length"], topk_length.int()) and call["softmax_scale"] == SCALE
    assert call["attn_sink"] is sink and call["q"] is q
    want, lse = sparse_mla_decode(q, cache, LAYOUT, idx, SCALE, sink, topk_length, extra_cache=extra,
                                  extra_indices=extra_idx, extra_topk_length=extra_topk_length)
    assert isinstance(got, DecodeOutput)
    torch.testing.assert_close(got.out.float(), want, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(got.lse, lse)

    # plan once, run two layers: two kernel calls with the plan's lengths
    plan = impl.plan(batch=b, heads=h, topk=12, softmax_scale=SCALE, topk_length=topk_length, device="cpu")
    for layer_cache in (cache, extra):
        impl.run(q, layer_cache, idx[..., :12], plan=plan)
    assert len(stand_in.calls) == 3
    assert all(c["topk_length"] is plan.topk_length for c in stand_in.calls[1:])
    assert stand_in.calls[2]["pages"].data_ptr() == extra.data_ptr()


def test_the_example_pack_says_what_to_install_and_where_it_runs(b12x_impl, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "b12x", None)  # not installed
    ok, reason = b12x_impl.is_available("cuda", "12.0")
    assert not ok and "`b12x` is not importable" in reason and "install the fork's wheel" in reason
    ok, reason = b12x_impl.is_available("cuda", "9.0")
    assert not ok and reason == "B12X has kernels for SM120/SM121 only; this GPU is 9.0"
    impl = b12x_impl("fp8_ds_mla", 16, platform="cuda", capability="12.0")
    cache = impl.allocate_kv_cache(2)
    q, idx = torch.zeros(1, 1, 8, 512), torch.zeros(1, 1, 4, dtype=torch.int32)
    with pytest.raises(KernelUnavailableError, match="install the fork's wheel"):
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE)


def test_a_missing_hook_fails_when_the_class_is_defined() -> None:
    with pytest.raises(TypeError, match=r"NoKernel must implement run_library: run_library\(self, plan, q, kv_cache"):
        class NoKernel(SparseMLAImpl):  # noqa: F841
            supported_layouts = frozenset({"fp8_ds_mla"})

            @classmethod
            def import_library(cls):
                return object()

    with pytest.raises(TypeError, match="must implement import_library, run_library"):
        class Nothing(SparseMLAImpl):  # noqa: F841
            pass


@pytest.mark.parametrize("old, new", [("_forward_library", "run_library"), ("_run_library", "run_library"),
                                      ("_plan_library", "plan_library"), ("_import_library", "import_library")])
def test_a_hook_under_a_name_the_base_class_never_calls_fails_naming_the_right_one(old, new) -> None:
    def hook(*args):
        raise AssertionError("never called")

    namespace = {old: hook, "import_library": classmethod(lambda cls: None), "run_library": hook}
    with pytest.raises(TypeError, match=rf"defines {old}, which SparseMLAImpl never calls: implement {new}\("):
        type("OldStyleImpl", (SparseMLAImpl,), namespace)


def test_an_abstract_base_may_leave_hooks_to_its_subclasses_and_is_never_available() -> None:
    class Base(SparseMLAImpl, abstract=True):
        supported_layouts = frozenset({"fp8_ds_mla"})

    ok, reason = Base.is_available("cuda", "9.0")
    assert not ok and reason.startswith("Base must implement import_library, run_library")

    class Full(Base):
        @classmethod
        def import_library(cls):
            return torch

        def run_library(self, plan, q, kv_cache, indices, extra_kv_cache, extra_indices, attn_sink):
            return DecodeOutput(torch.zeros(q.shape, dtype=torch.bfloat16), None)

    assert Full.is_available("cpu")[0]
    out = Full("fp8_ds_mla", 16).forward_decode(torch.zeros(1, 1, 4, 512), LAYOUT.allocate(1, 16),
                                                torch.zeros(1, 1, 2, dtype=torch.int32), softmax_scale=SCALE)
    assert out.out.shape == (1, 1, 4, 512)
