"""End-to-end checks against the real kernel libraries, where they run.

Each test asks the impl's own ``is_available()`` and skips with its reason
otherwise (FlashMLA needs an SM90/SM100 GPU and a source build, FlashInfer's
DeepSeek-V4 decode an SM10x/SM12x GPU, AITER a gfx942/gfx950 GPU). Where the
library runs, its output at DeepSeek-V4's decode shape (64 heads, 128 window
slots + 512 top-k compressed slots, sink) must match the torch reference to
bf16 precision.
"""

from __future__ import annotations

import pytest
import torch

from dsv4sel.kernels.flashinfer import DeepseekV4FlashInferMLASparseImpl
from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl
from dsv4sel.kernels.platform import detect_platform
from dsv4sel.kernels.reference import sparse_mla_decode
from dsv4sel.kernels.rocm import DeepseekV4ROCMAiterMLASparseImpl


def _layout_for(impl_cls) -> str:
    if impl_cls is DeepseekV4FlashInferMLASparseImpl and detect_platform()[1][0] == 10:
        return "bf16_row"
    return "fp8_ds_mla"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "impl_cls", [DeepseekV4FlashMLASparseImpl, DeepseekV4FlashInferMLASparseImpl, DeepseekV4ROCMAiterMLASparseImpl]
)
def test_real_library_matches_the_reference(impl_cls) -> None:
    ok, reason = impl_cls.is_available()
    if not ok:
        pytest.skip(f"{impl_cls.__name__} cannot run here: {reason}")
    device, block, batch, heads = "cuda", 64, 4, 64
    impl = impl_cls(_layout_for(impl_cls), block)
    gen = torch.Generator().manual_seed(7)
    window = impl.allocate_kv_cache(batch * 2, device=device)
    compressed = impl.allocate_kv_cache(batch * 32, device=device)
    for cache, n in ((window, batch * 128), (compressed, batch * 2048)):
        impl.write_kv(cache, torch.randn(n, 512, generator=gen).to(device), torch.arange(n, device=device))
    req = torch.arange(batch).view(batch, 1, 1)
    window_idx = (req * 128 + torch.arange(128).view(1, 1, 128)).to(device)
    topk = torch.argsort(torch.rand(batch, 2048, generator=gen), dim=-1)[:, :512].view(batch, 1, 512)
    comp_idx = (req * 2048 + topk).to(device)
    comp_idx[1, :, 300:] = -1  # a request with fewer compressed entries
    q = torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16).to(device)
    sink = torch.randn(heads, generator=gen).to(device)
    scale = 512**-0.5

    got = impl.forward_decode(
        q, window, window_idx, softmax_scale=scale, attn_sink=sink, extra_kv_cache=compressed,
        extra_indices=comp_idx, seq_lens=torch.full((batch,), 4096, device=device),
    )
    out, lse = sparse_mla_decode(
        q, window, impl.layout, window_idx, scale, sink, extra_cache=compressed, extra_indices=comp_idx
    )
    torch.testing.assert_close(got.out.float(), out, atol=2e-2, rtol=2e-2)
    if got.lse is not None:
        torch.testing.assert_close(got.lse, lse, atol=1e-3, rtol=1e-3)
