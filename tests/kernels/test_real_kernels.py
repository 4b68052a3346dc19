"""End-to-end checks against the real kernel libraries, where they run.

Each test asks the impl's own ``is_available()`` and skips with its reason
otherwise (FlashMLA needs an SM90/SM100 GPU and a FlashMLA build: the ``flash_mla``
package, or vLLM's bundled build, installed or named by ``DSV4SEL_VLLM_FLASHMLA_DIR``; FlashInfer's
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


def _decode_batch(impl, batch, heads, gen, device="cuda"):
    """One step's decode inputs at DeepSeek-V4's shape: 128 window slots + 512 top-k compressed slots."""
    window = impl.allocate_kv_cache(batch * 2, device=device)
    compressed = impl.allocate_kv_cache(batch * 32, device=device)
    for cache, n in ((window, batch * 128), (compressed, batch * 2048)):
        impl.write_kv(cache, torch.randn(n, 512, generator=gen).to(device), torch.arange(n, device=device))
    req = torch.arange(batch).view(batch, 1, 1)
    window_idx = (req * 128 + torch.arange(128).view(1, 1, 128)).int().to(device)
    topk = torch.argsort(torch.rand(batch, 2048, generator=gen), dim=-1)[:, :512].view(batch, 1, 512)
    comp_idx = (req * 2048 + topk).int().to(device)
    q = torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16).to(device)
    sink = torch.randn(heads, generator=gen).to(device)
    return dict(q=q, kv_cache=window, indices=window_idx, extra_kv_cache=compressed, extra_indices=comp_idx,
                attn_sink=sink)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 16])
def test_flashmla_plan_run_and_cuda_graph_replay_match_the_reference(heads) -> None:
    ok, reason = DeepseekV4FlashMLASparseImpl.is_available()
    if not ok:
        pytest.skip(f"DeepseekV4FlashMLASparseImpl cannot run here: {reason}")
    device, batch, scale = "cuda", 8, 512**-0.5
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 64)
    gen = torch.Generator().manual_seed(11)
    layers = [_decode_batch(impl, batch, heads, gen) for _ in range(2)]
    lengths = [torch.tensor([128, 100, 7, 128, 128, 64, 1, 128]), torch.tensor([512, 300, 512, 0, 17, 512, 512, 256])]
    plan = impl.plan(batch=batch, heads=heads, topk=128, extra_topk=512, softmax_scale=scale,
                     topk_length=lengths[0].to(device), extra_topk_length=lengths[1].to(device))

    def check(got, layer, topk_length, extra_topk_length):
        out, lse = sparse_mla_decode(
            layer["q"], layer["kv_cache"], impl.layout, layer["indices"], scale, layer["attn_sink"],
            topk_length.to(device), extra_cache=layer["extra_kv_cache"], extra_indices=layer["extra_indices"],
            extra_topk_length=extra_topk_length.to(device),
        )
        torch.testing.assert_close(got.out.float(), out, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(got.lse, lse, atol=1e-3, rtol=1e-3)

    for layer in layers:  # eager: one plan, every layer
        check(impl.run(**layer, plan=plan), layer, *lengths)

    # capture one layer's run over static buffers; replay with other layers' tensors copied in
    static = {k: v.clone() for k, v in layers[0].items()}
    impl.run(**static, plan=plan)  # warm up outside the capture
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = impl.run(**static, plan=plan)
    torch.cuda.current_stream().wait_stream(stream)
    for layer in layers[::-1]:
        for key, value in layer.items():
            static[key].copy_(value)
        graph.replay()
        check(captured, layer, *lengths)
    # a new step: new lengths, re-planned in place, the same graph
    new_lengths = [torch.tensor([1, 128, 128, 50, 9, 128, 128, 77]), torch.tensor([3, 512, 0, 512, 511, 100, 1, 512])]
    impl.replan(plan, topk_length=new_lengths[0].to(device), extra_topk_length=new_lengths[1].to(device))
    graph.replay()
    check(captured, layers[0], *new_lengths)


@pytest.mark.gpu
@pytest.mark.parametrize("heads", [64, 16])
def test_flashmla_eager_run_replays_a_graph_bit_for_bit_and_steps_aside_where_it_must(heads, monkeypatch) -> None:
    """Eager run of a small plan replays a graph per cache pair (flashmla_replay): the direct call's
    outputs bit for bit, tensors of its own each call, across layers, query_buffer, replan and an in-place
    sink change; another stream and a caller's own capture call the op directly."""
    from dsv4sel.kernels.flashmla_replay import REPLAY_ENV

    ok, reason = DeepseekV4FlashMLASparseImpl.is_available()
    if not ok:
        pytest.skip(f"DeepseekV4FlashMLASparseImpl cannot run here: {reason}")
    device, batch, scale = "cuda", 4, 512**-0.5
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 64)
    gen = torch.Generator().manual_seed(5)
    layers = [_decode_batch(impl, batch, heads, gen) for _ in range(3)]
    lengths = [torch.tensor([128, 100, 7, 1]).to(device), torch.tensor([512, 0, 300, 512]).to(device)]

    def make_plan():
        return impl.plan(batch=batch, heads=heads, topk=128, extra_topk=512, softmax_scale=scale,
                         topk_length=lengths[0].clone(), extra_topk_length=lengths[1].clone())

    monkeypatch.setenv(REPLAY_ENV, "off")
    direct = make_plan()
    monkeypatch.delenv(REPLAY_ENV)
    plan = make_plan()
    replay = plan.state["replay"]
    assert direct.state["replay"] is None and replay is not None and replay.usable

    def same(layer, **over):
        got, want = impl.run(**{**layer, **over}, plan=plan), impl.run(**layer, plan=direct)
        assert torch.equal(got.out, want.out) and torch.equal(got.lse, want.lse)
        assert got.out.shape == (batch, 1, heads, 512) and got.lse.shape == (batch, 1, heads)
        return got

    first = [same(layer) for layer in layers]
    kept = [(g.out.clone(), g.lse.clone()) for g in first]
    for _ in range(2):
        for layer in layers:
            same(layer)
    assert all(torch.equal(g.out, k[0]) and torch.equal(g.lse, k[1]) for g, k in zip(first, kept)), \
        "a later call must not overwrite an earlier call's outputs"
    # a cache's first call takes the general path (it makes the cache's page view), its second on the
    # plan calls the op directly (a plan used once per layer never pays a capture), the third captures
    assert len(replay.graphs) == 3 and replay.replays == 3
    if plan.query_buffer is not None:
        plan.query_buffer.copy_(layers[0]["q"])
        same(layers[0], q=plan.query_buffer)
    new = [torch.tensor([5, 128, 128, 64]).to(device), torch.tensor([1, 512, 17, 0]).to(device)]
    for p in (plan, direct):
        impl.replan(p, topk_length=new[0], extra_topk_length=new[1])
    same(layers[1])
    layers[2]["attn_sink"].mul_(-2.0)  # a weight changed in place: seen at the next eager run
    same(layers[2])
    count = replay.replays
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        got = impl.run(**layers[0], plan=plan)
    torch.cuda.current_stream().wait_stream(side)
    want = impl.run(**layers[0], plan=direct)
    assert torch.equal(got.out, want.out) and replay.replays == count, "another stream calls the op directly"
    static = {k: v.clone() for k, v in layers[1].items()}
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = impl.run(**static, plan=plan)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    want = impl.run(**layers[1], plan=direct)
    assert torch.equal(captured.out, want.out) and replay.replays == count, "a caller's capture records the op"


@pytest.mark.gpu
def test_flashmla_padded_run_reads_the_q_the_kernel_before_it_just_wrote() -> None:
    """At 16 heads run() first copies q into the plan's 64-head buffer (eagerly the replay's stage
    kernel or the copy kernel, under a caller's capture the copy kernel): it reads the q the kernel
    just before it wrote, in a CUDA graph too. A GEMM writes q; run's outputs equal a run on a copy
    of q taken once the GPU is idle, call after call and replay after replay."""
    ok, reason = DeepseekV4FlashMLASparseImpl.is_available()
    if not ok:
        pytest.skip(f"DeepseekV4FlashMLASparseImpl cannot run here: {reason}")
    device, batch, heads, scale = "cuda", 4, 16, 512**-0.5
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", 64)
    gen = torch.Generator().manual_seed(13)
    layer = _decode_batch(impl, batch, heads, gen)
    plan = impl.plan(batch=batch, heads=heads, topk=128, extra_topk=512, softmax_scale=scale, device=device)
    # q as a projection writes it: a long GEMM whose last output tiles land just before run's copy
    x = torch.empty(batch * heads, 8192, dtype=torch.bfloat16, device=device)
    w = (torch.randn(8192, 512, generator=gen) / 90).to(torch.bfloat16).to(device)
    q = layer["q"]

    def step():
        torch.matmul(x, w, out=q.view(batch * heads, 512))
        return impl.run(**layer, plan=plan)

    def finished():  # run on a copy of q taken once the GPU is idle
        torch.cuda.synchronize()
        want = impl.run(**{**layer, "q": q.clone()}, plan=plan)
        torch.cuda.synchronize()
        return want

    for _ in range(3):  # eager
        x.copy_(torch.randn(x.shape, generator=gen).to(torch.bfloat16))
        got = step()
        got = (got.out.clone(), got.lse.clone())
        want = finished()
        assert torch.equal(got[0], want.out) and torch.equal(got[1], want.lse)
    step()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        captured = step()
    torch.cuda.current_stream().wait_stream(stream)
    for _ in range(5):
        x.copy_(torch.randn(x.shape, generator=gen).to(torch.bfloat16))
        graph.replay()
        got = (captured.out.clone(), captured.lse.clone())
        want = finished()
        assert torch.equal(got[0], want.out) and torch.equal(got[1], want.lse)
