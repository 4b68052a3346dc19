"""The torch reference sparse decode against a naive per-token float64 loop."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4sel.kernels.layouts import LAYOUTS, get_layout
from dsv4sel.kernels.reference import DeepseekV4ReferenceSparseImpl, sparse_mla_decode

SCALE = 512**-0.5


def naive_decode(q, sources, softmax_scale, attn_sink=None):
    """Per (batch, token, head) loop in float64.

    ``sources`` is a list of (cache, layout, indices, topk_length); rows are read
    one slot at a time through the layout (the codec is tested elsewhere).
    """
    b, s, h, _ = q.shape
    out = torch.zeros(b, s, h, 512, dtype=torch.float64)
    lse = torch.zeros(b, s, h, dtype=torch.float64)
    for bi in range(b):
        for si in range(s):
            rows = []
            for cache, layout, indices, lengths in sources:
                width = indices.shape[-1] if lengths is None else int(lengths[bi])
                for col in range(min(width, indices.shape[-1])):
                    slot = int(indices[bi, si, col])
                    if slot >= 0:
                        rows.append(layout.read(cache, torch.tensor([slot], device=cache.device))[0].double().cpu())
            for hi in range(h):
                if not rows:
                    lse[bi, si, hi] = math.inf
                    continue
                qv = q[bi, si, hi].double().cpu()
                logits = [softmax_scale * float(qv @ r) for r in rows]
                m = max(logits)
                weights = [math.exp(z - m) for z in logits]
                denom = sum(weights)
                total = denom
                if attn_sink is not None:
                    sink = float(attn_sink[hi])
                    total = denom + (math.exp(sink - m) if sink - m < 700 else math.inf)
                acc = sum(w * r for w, r in zip(weights, rows))
                out[bi, si, hi] = acc / total if math.isfinite(total) else acc * 0.0
                lse[bi, si, hi] = m + math.log(denom)
    return out, lse


def fill_cache(layout_name, num_blocks, block_size, gen, device, magnitude=1.0):
    layout = get_layout(layout_name)
    cache = layout.allocate(num_blocks, block_size, device=device)
    n = num_blocks * block_size
    kv = (torch.randn(n, 512, generator=gen) * magnitude).to(torch.bfloat16)
    layout.write(cache, kv.to(device), torch.arange(n, device=device))
    return layout, cache


def random_indices(b, s, k, capacity, gen, skip_fraction=0.25):
    idx = torch.randint(0, capacity, (b, s, k), generator=gen)
    skip = torch.rand(b, s, k, generator=gen) < skip_fraction
    return torch.where(skip, torch.full_like(idx, -1), idx)


def assert_close_to_naive(out, lse, ref_out, ref_lse, atol=2e-5, rtol=2e-5):
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    torch.testing.assert_close(out.double().cpu(), ref_out, atol=atol, rtol=rtol)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse.cpu()), finite)
    assert bool((lse.cpu()[~finite] == math.inf).all())
    torch.testing.assert_close(lse.double().cpu()[finite], ref_lse[finite], atol=atol, rtol=rtol)


@pytest.mark.parametrize("layout_name", sorted(n for n in LAYOUTS if LAYOUTS[n].has_codec))  # the reference dequantizes
def test_matches_naive_loop_with_skips_lengths_sink_and_extra_cache(
    layout_name: str, device: str, gen: torch.Generator
) -> None:
    b, s, h = 2, 2, 3
    layout, cache = fill_cache(layout_name, 3, 8, gen, device)
    _, extra = fill_cache(layout_name, 2, 4, gen, device)
    q = torch.randn(b, s, h, 512, generator=gen).to(torch.bfloat16)
    indices = random_indices(b, s, 10, 24, gen)
    extra_indices = random_indices(b, s, 5, 8, gen)
    topk_length = torch.tensor([7, 10])
    extra_topk_length = torch.tensor([5, 2])
    sink = torch.tensor([0.5, -2.0, 3.0])

    out, lse = sparse_mla_decode(
        q.to(device), cache, layout_name, indices.to(device), SCALE, sink.to(device), topk_length.to(device),
        extra_cache=extra, extra_indices=extra_indices.to(device), extra_topk_length=extra_topk_length.to(device),
    )
    ref_out, ref_lse = naive_decode(
        q, [(cache, layout, indices, topk_length), (extra, layout, extra_indices, extra_topk_length)], SCALE, sink
    )
    assert out.shape == (b, s, h, 512) and lse.shape == (b, s, h)
    assert_close_to_naive(out, lse, ref_out, ref_lse)


def test_all_skipped_rows_give_zero_output_and_infinite_lse(device: str, gen: torch.Generator) -> None:
    layout, cache = fill_cache("fp8_ds_mla", 2, 8, gen, device)
    q = torch.randn(3, 1, 4, 512, generator=gen).to(device)
    indices = torch.randint(0, 16, (3, 1, 6), generator=gen)
    indices[0] = -1  # every entry skipped
    topk_length = torch.tensor([6, 0, 6])  # batch 1: nothing counts
    sink = torch.tensor([0.0, 1.0, -1.0, 5.0], device=device)
    out, lse = sparse_mla_decode(q, cache, layout, indices.to(device), SCALE, sink, topk_length.to(device))
    assert not out[:2].any()
    assert bool((lse[:2] == math.inf).all())
    assert out[2].abs().sum() > 0 and bool(torch.isfinite(lse[2]).all())
    ref_out, ref_lse = naive_decode(q.cpu(), [(cache, layout, indices, topk_length)], SCALE, sink.cpu())
    assert_close_to_naive(out, lse, ref_out, ref_lse)


def test_zero_width_index_table_is_all_skipped(device: str, gen: torch.Generator) -> None:
    layout, cache = fill_cache("bf16_row", 1, 4, gen, device)
    out, lse = sparse_mla_decode(
        torch.randn(1, 1, 2, 512, device=device), cache, layout, torch.empty(1, 1, 0, dtype=torch.long, device=device), SCALE
    )
    assert not out.any() and bool((lse == math.inf).all())


@pytest.mark.parametrize(
    ("q_mag", "kv_mag", "sink"),
    [
        (1e3, 1e3, None),  # logits ~1e6 apart: the softmax is one-hot, no overflow
        (1e-4, 1e-4, None),  # logits ~1e-8: uniform weights
        (1.0, 1.0, 1e4),  # a sink far above every logit: output -> 0, lse untouched
        (1.0, 1.0, -1e4),  # a sink far below: no effect
        (30.0, 30.0, 50.0),  # logits in the hundreds, sink in range
    ],
)
def test_extreme_magnitudes_stay_finite_and_match_naive(q_mag, kv_mag, sink, device, gen) -> None:
    layout, cache = fill_cache("fp8_ds_mla", 2, 16, gen, device, magnitude=kv_mag)
    q = (torch.randn(2, 1, 3, 512, generator=gen) * q_mag).to(torch.bfloat16)
    indices = random_indices(2, 1, 12, 32, gen, skip_fraction=0.1)
    sink_t = None if sink is None else torch.full((3,), float(sink))
    out, lse = sparse_mla_decode(
        q.to(device), cache, layout, indices.to(device), SCALE, None if sink_t is None else sink_t.to(device)
    )
    assert bool(torch.isfinite(out).all()) and bool(torch.isfinite(lse).all())
    ref_out, ref_lse = naive_decode(q, [(cache, layout, indices, None)], SCALE, sink_t)
    # float32 logits of magnitude L carry ~L * 6e-8 absolute error; scale tolerances to the data.
    row_mag = kv_mag * 4
    assert_close_to_naive(out, lse, ref_out, ref_lse, atol=max(1e-5 * row_mag, 1e-9), rtol=1e-4)


def test_sink_scales_the_sink_free_output_by_exp_lse_over_exp_lse_plus_exp_sink(gen: torch.Generator) -> None:
    layout, cache = fill_cache("fp8_ds_mla", 2, 8, gen, "cpu")
    q = torch.randn(2, 2, 4, 512, generator=gen)
    indices = random_indices(2, 2, 9, 16, gen)
    sink = torch.tensor([-1.0, 0.0, 2.0, 8.0])
    plain_out, plain_lse = sparse_mla_decode(q, cache, layout, indices, SCALE)
    sink_out, sink_lse = sparse_mla_decode(q, cache, layout, indices, SCALE, sink)
    factor = torch.exp(plain_lse) / (torch.exp(plain_lse) + torch.exp(sink).view(1, 1, 4))
    torch.testing.assert_close(sink_out, plain_out * factor.unsqueeze(-1), rtol=1e-5, atol=1e-6)
    assert torch.equal(sink_lse, plain_lse), "lse must not include the sink"


def test_two_caches_equal_one_cache_holding_both_token_sets(gen: torch.Generator) -> None:
    layout = get_layout("bf16_row")
    kv = torch.randn(24, 512, generator=gen).to(torch.bfloat16)
    window, compressed, both = layout.allocate(2, 4), layout.allocate(4, 4), layout.allocate(6, 4)
    layout.write(window, kv[:8], torch.arange(8))
    layout.write(compressed, kv[8:], torch.arange(16))
    layout.write(both, kv, torch.arange(24))
    q = torch.randn(2, 1, 2, 512, generator=gen)
    win_idx, comp_idx = random_indices(2, 1, 4, 8, gen), random_indices(2, 1, 6, 16, gen)
    split = sparse_mla_decode(q, window, layout, win_idx, SCALE, extra_cache=compressed, extra_indices=comp_idx)
    merged_idx = torch.cat([win_idx, torch.where(comp_idx >= 0, comp_idx + 8, comp_idx)], dim=-1)
    joined = sparse_mla_decode(q, both, layout, merged_idx, SCALE)
    torch.testing.assert_close(split[0], joined[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(split[1], joined[1], rtol=1e-6, atol=1e-6)


def test_layout_may_be_an_object_or_a_name(gen: torch.Generator) -> None:
    layout, cache = fill_cache("fp8_ds_mla", 1, 8, gen, "cpu")
    q, idx = torch.randn(1, 1, 2, 512, generator=gen), torch.tensor([[[0, 3, 5]]])
    by_name = sparse_mla_decode(q, cache, "fp8_ds_mla", idx, SCALE)
    by_object = sparse_mla_decode(q, cache, layout, idx, SCALE)
    assert torch.equal(by_name[0], by_object[0]) and torch.equal(by_name[1], by_object[1])


def test_fp8_row_scale_outside_the_cache_is_applied(gen: torch.Generator) -> None:
    layout = get_layout("fp8_e4m3_row").with_scale(4.0)
    cache = layout.allocate(1, 4)
    kv = torch.randn(4, 512, generator=gen) * 100
    layout.write(cache, kv, torch.arange(4))
    q, idx = torch.randn(1, 1, 1, 512, generator=gen) * 0.01, torch.tensor([[[0, 1, 2, 3]]])
    out, _ = sparse_mla_decode(q, cache, layout, idx, SCALE)
    ref_out, _ = naive_decode(q, [(cache, layout, idx, None)], SCALE)
    torch.testing.assert_close(out.double(), ref_out, rtol=2e-5, atol=2e-4)
    assert out.abs().max() > 20, "rows must come back at their original magnitude, not value / scale"


def test_bad_arguments_are_rejected(gen: torch.Generator) -> None:
    layout, cache = fill_cache("bf16_row", 1, 4, gen, "cpu")
    q = torch.randn(1, 1, 2, 512)
    with pytest.raises(ValueError, match="q must be"):
        sparse_mla_decode(torch.randn(1, 2, 576), cache, layout, torch.zeros(1, 1, 1, dtype=torch.long), SCALE)
    with pytest.raises(ValueError, match="indices must be"):
        sparse_mla_decode(q, cache, layout, torch.zeros(2, 1, 1, dtype=torch.long), SCALE)
    with pytest.raises(ValueError, match="attn_sink"):
        sparse_mla_decode(q, cache, layout, torch.zeros(1, 1, 1, dtype=torch.long), SCALE, torch.zeros(3))
    with pytest.raises(ValueError, match="together"):
        sparse_mla_decode(q, cache, layout, torch.zeros(1, 1, 1, dtype=torch.long), SCALE, extra_cache=cache)
    with pytest.raises(ValueError, match="slots must be below 4"):
        sparse_mla_decode(q, cache, layout, torch.tensor([[[4]]]), SCALE)


def test_reference_impl_serves_the_reference_in_bf16(device: str, gen: torch.Generator) -> None:
    impl = DeepseekV4ReferenceSparseImpl("fp8_ds_mla", 8)
    assert impl.is_available()[0]
    assert impl.is_available("xpu", None)[0] and impl.is_available("cpu", None)[0]
    cache = impl.allocate_kv_cache(2, device=device)
    impl.write_kv(cache, torch.randn(16, 512, generator=gen).to(device), torch.arange(16, device=device))
    q = torch.randn(2, 1, 4, 512, generator=gen).to(device)
    idx = random_indices(2, 1, 6, 16, gen).to(device)
    sink = torch.zeros(4, device=device)
    got = impl.forward_decode(q, cache, idx, softmax_scale=SCALE, attn_sink=sink)
    out, lse = sparse_mla_decode(q, cache, "fp8_ds_mla", idx, SCALE, sink)
    assert got.out.dtype == torch.bfloat16
    assert torch.equal(got.out, out.to(torch.bfloat16)) and torch.equal(got.lse, lse)
    assert impl.kv_cache_shape(2, 8) == (2, 8, 584)
