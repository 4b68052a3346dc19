"""One validation of decode inputs: the reference function and every impl refuse alike."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dsv4sel.kernels.reference import DeepseekV4ReferenceSparseImpl, sparse_mla_decode  # noqa: E402


def _args(**bad):
    impl = DeepseekV4ReferenceSparseImpl("bf16_row", 8)
    q = torch.zeros(2, 1, 4, 512)
    args = dict(q=q, indices=torch.zeros(2, 1, 3, dtype=torch.int32), softmax_scale=0.1,
                topk_length=None, attn_sink=None)
    args.update(bad)
    return impl, impl.allocate_kv_cache(1), args


@pytest.mark.parametrize("bad, needle", [
    (dict(indices=torch.zeros(2, 1, 3)), "indices must be an integer [2, 1, topk] tensor"),
    (dict(indices=torch.zeros(2, 1, 3, dtype=torch.bool)), "indices must be an integer"),
    (dict(topk_length=torch.zeros(3, dtype=torch.int32)), "topk_length must be an integer [2] tensor"),
    (dict(attn_sink=torch.zeros(5)), "attn_sink must be a [4] tensor"),
    (dict(softmax_scale=True), "softmax_scale must be a float"),
])
def test_the_function_and_the_impl_refuse_the_same_inputs_with_the_same_words(bad, needle):
    impl, cache, args = _args(**bad)
    with pytest.raises(ValueError) as by_function:
        sparse_mla_decode(args["q"], cache, "bf16_row", args["indices"], args["softmax_scale"],
                          args["attn_sink"], args["topk_length"])
    with pytest.raises(ValueError) as by_impl:
        impl.forward_decode(args["q"], cache, args["indices"], softmax_scale=args["softmax_scale"],
                            attn_sink=args["attn_sink"], topk_length=args["topk_length"])
    assert needle in str(by_function.value) and str(by_function.value) == str(by_impl.value)
