"""The optional prefill hook of the extension API (``prefill_library``, :meth:`SparseMLAImpl.prefill`):
a host hands an impl that writes it its sparse prefill, every query token its own row (issue 33)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dsv4sel.kernels.base import HOOKS, SparseMLAImpl  # noqa: E402
from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl  # noqa: E402
from dsv4sel.kernels.layouts import get_layout  # noqa: E402
from dsv4sel.kernels.reference import DeepseekV4ReferenceSparseImpl, sparse_mla_decode  # noqa: E402


def _cache(gen, blocks=4, block_size=64):
    layout = get_layout("fp8_ds_mla")
    cache = layout.allocate(blocks, block_size)
    layout.write(cache, torch.randn(blocks * block_size, 512, generator=gen), torch.arange(blocks * block_size))
    return cache


def test_the_hook_is_listed_and_only_impls_that_write_it_have_prefill():
    assert HOOKS["prefill_library"].startswith("prefill_library(self, plan, q, kv_cache, indices")
    assert DeepseekV4ReferenceSparseImpl.has_prefill() is True
    assert DeepseekV4FlashMLASparseImpl.has_prefill() is False
    assert SparseMLAImpl.has_prefill() is False


def test_prefill_is_the_reference_on_every_token_with_two_caches_lengths_and_a_sink():
    gen = torch.Generator().manual_seed(0)
    main, extra = _cache(gen), _cache(gen, blocks=2)
    n, heads = 5, 16
    q = torch.randn(n, 1, heads, 512, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, 256, (n, 1, 32), generator=gen, dtype=torch.int32)
    extra_idx = torch.randint(-1, 128, (n, 1, 8), generator=gen, dtype=torch.int32)
    lens, extra_lens = torch.tensor([32, 3, 0, 17, 9]), torch.tensor([8, 8, 2, 0, 5])
    sink = torch.randn(heads, generator=gen)
    got = DeepseekV4ReferenceSparseImpl("fp8_ds_mla", 64).prefill(
        q, main, idx, softmax_scale=0.05, attn_sink=sink, topk_length=lens, extra_kv_cache=extra,
        extra_indices=extra_idx, extra_topk_length=extra_lens)
    want, lse = sparse_mla_decode(q, main, "fp8_ds_mla", idx, 0.05, sink, lens, extra_cache=extra,
                                  extra_indices=extra_idx, extra_topk_length=extra_lens)
    assert torch.equal(got.out, want.to(torch.bfloat16)) and torch.equal(got.lse, lse)


def test_prefill_on_an_impl_without_the_hook_says_which_hook_to_write():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(2, 1, 64, 512, generator=gen).to(torch.bfloat16)
    idx = torch.zeros(2, 1, 4, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"DeepseekV4FlashMLASparseImpl has no prefill hook: prefill_library\("):
        DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 64).prefill(q, _cache(gen), idx, softmax_scale=0.1)


def test_prefill_checks_its_arguments_like_a_decode():
    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 1, 8, 512, generator=gen).to(torch.bfloat16)
    with pytest.raises(ValueError, match="indices"):
        DeepseekV4ReferenceSparseImpl("fp8_ds_mla", 64).prefill(q, _cache(gen), torch.zeros(3, 1, 4, dtype=torch.int32),
                                                                softmax_scale=0.1)
