"""DeepSeek-V4.1: the size-only layouts, the three impls, and the shipped rules' names.

The V4.1 records (``fp8_ds_mla_v41``, ``nvfp4_ds_mla``) are known by size
only: these tests pin the sizes the rules and vLLM use, and that every
attempt to encode or decode their bytes fails loudly instead of guessing.
vLLM 0.33 writes the 528-byte record on SM100 only; SM90 (FlashMLA) and SM12x
(FlashInfer) keep V4's 584-byte ``fp8_ds_mla``, and the impls' per-GPU layouts
say so. The impls are checked for their availability answers (no GPU or kernel
library here), the FlashInfer V4.1 argument mapping against a recording fake
``flashinfer.mla`` (call for call the V4 one), and the clear errors of the two
paths dsv4sel cannot call.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import dsv4sel
import dsv4sel.kernels as kernels
from dsv4sel.dsv4.selection import Query
from dsv4sel.kernels.base import SparseMLAImpl
from dsv4sel.kernels.errors import KernelUnavailableError, UnsupportedLayoutError
from dsv4sel.kernels.flashinfer import DeepseekV4FlashInferMLASparseImpl
from dsv4sel.kernels.layouts import LAYOUTS, OpaqueRecordLayout, get_layout
from dsv4sel.kernels.platform import detect_platform
from dsv4sel.kernels.reference import sparse_mla_decode
from dsv4sel.kernels.v41 import (
    DeepseekV41FlashInferMLASparseImpl,
    DeepseekV41FlashMLASparseImpl,
    DeepseekV41MegaAttnImpl,
)

SCALE = 512**-0.5
V41_IMPLS = [DeepseekV41FlashMLASparseImpl, DeepseekV41FlashInferMLASparseImpl, DeepseekV41MegaAttnImpl]
NO_FLASHMLA_ADAPTER = (
    "dsv4sel has no adapter for FlashMLA's V4.1 decode: its Python API is not documented; "
    "vLLM's own DeepSeek-V4.1 layer calls it"
)


def random_indices(b, s, k, capacity, gen, skip_fraction=0.2):
    idx = torch.randint(0, capacity, (b, s, k), generator=gen)
    return torch.where(torch.rand(b, s, k, generator=gen) < skip_fraction, torch.full_like(idx, -1), idx)


# ---------------------------------------------------------------------------
# layouts: sizes from upstream vLLM, no codec
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "bytes_per_token", "page_64", "page_128"),
    [
        ("fp8_ds_mla_v41", 528, 64 * 528, 128 * 528),  # V4.1 fp8 record (SM100, where blocks are 128)
        ("nvfp4_ds_mla", 288, 64 * 288, 128 * 288),  # V4.1 NVFP4 compressed-cache record
    ],
)
def test_v41_layout_sizes(name, bytes_per_token, page_64, page_128) -> None:
    layout = get_layout(name)
    assert isinstance(layout, OpaqueRecordLayout) and layout.has_codec is False
    assert (layout.name, layout.bytes_per_token, layout.torch_dtype_name) == (name, bytes_per_token, "uint8")
    assert layout.alignment == bytes_per_token, "no documented padding: pages are exactly block_size records"
    assert (layout.page_bytes(64), layout.page_bytes(128)) == (page_64, page_128)
    assert layout.cache_bytes(10, 128) == 10 * page_128
    assert layout.kernel_shape(10, 64) == (10, 64, bytes_per_token)
    assert layout.torch_dtype() == torch.uint8
    assert LAYOUTS[name] is layout


@pytest.mark.parametrize("name", ["fp8_ds_mla_v41", "nvfp4_ds_mla"])
def test_v41_cache_allocates_and_views_like_byte_pages(name) -> None:
    layout = get_layout(name)
    cache = layout.allocate(3, 64)
    page = layout.page_bytes(64)
    assert cache.dtype == torch.uint8 and tuple(cache.shape) == (3, page) and not cache.any()
    assert layout.block_size_of(cache) == 64
    view = layout.kernel_view(cache)
    assert tuple(view.shape) == (3, 64, layout.bytes_per_token)
    assert view.stride() == (page, layout.bytes_per_token, 1)
    assert view.data_ptr() == cache.data_ptr()
    view[2, 63, -1] = 7  # the view shares storage and ends exactly at the last byte of the cache
    assert int(cache[2, -1]) == 7


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("fp8_ds_mla_v41", torch.zeros(2, 1000, dtype=torch.uint8)),
        ("fp8_ds_mla_v41", torch.zeros(2, 37440, dtype=torch.uint8)),  # a V4 fp8_ds_mla page of 64 tokens
        ("nvfp4_ds_mla", torch.zeros(2, 33792, dtype=torch.uint8)),  # a V4.1 fp8 page of 64 tokens
        ("nvfp4_ds_mla", torch.zeros(2, 64, 288, dtype=torch.uint8)),
        ("fp8_ds_mla_v41", torch.zeros(2, 33792, dtype=torch.bfloat16)),
    ],
)
def test_v41_layouts_reject_caches_of_another_layout(name, bad) -> None:
    with pytest.raises(ValueError):
        get_layout(name).block_size_of(bad)


@pytest.mark.parametrize("name", ["fp8_ds_mla_v41", "nvfp4_ds_mla"])
def test_v41_layouts_refuse_to_encode_or_decode(name) -> None:
    layout = get_layout(name)
    cache = layout.allocate(2, 64)
    with pytest.raises(UnsupportedLayoutError) as info:
        layout.write(cache, torch.ones(4, 512), torch.arange(4))
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert name in message and str(layout.bytes_per_token) in message
    assert "serving engine's DeepSeek-V4.1 kernels" in message and "no verified codec" in message
    assert not cache.any(), "a refused write must not touch the cache"
    with pytest.raises(UnsupportedLayoutError, match="no verified codec"):
        layout.read(cache, torch.arange(4))


def test_the_reference_decode_refuses_v41_caches(gen) -> None:
    cache = get_layout("fp8_ds_mla_v41").allocate(2, 64)
    q = torch.randn(1, 1, 4, 512, generator=gen)
    with pytest.raises(UnsupportedLayoutError, match="fp8_ds_mla_v41"):
        sparse_mla_decode(q, cache, "fp8_ds_mla_v41", torch.zeros(1, 1, 8, dtype=torch.int64), SCALE)


# ---------------------------------------------------------------------------
# registry and construction
# ---------------------------------------------------------------------------


def test_v41_impls_are_registered_and_load() -> None:
    specs = [spec for spec in kernels.IMPLS if spec.startswith("dsv4sel.kernels.v41:")]
    assert [kernels.load_impl(spec) for spec in specs] == V41_IMPLS
    for cls in V41_IMPLS:
        assert issubclass(cls, SparseMLAImpl) and cls.impl_name == cls.__name__


def test_availability_report_on_a_cpu_machine_reports_the_v41_impls_unavailable(no_libraries) -> None:
    report = {row.spec: row for row in kernels.availability_report("cpu", None)}
    for cls in V41_IMPLS:
        row = report[f"dsv4sel.kernels.v41:{cls.__name__}"]
        assert row.available is False and "not cpu" in row.reason


@pytest.mark.parametrize(
    ("impl", "layout", "width"),
    [
        (DeepseekV41FlashMLASparseImpl, "fp8_ds_mla_v41", 528),  # SM100
        (DeepseekV41FlashMLASparseImpl, "fp8_ds_mla", 584),  # SM90 keeps V4's record
        (DeepseekV41FlashInferMLASparseImpl, "fp8_ds_mla", 584),  # SM12x keeps V4's record
        (DeepseekV41FlashInferMLASparseImpl, "bf16_row", 512),
        (DeepseekV41FlashInferMLASparseImpl, "fp8_e4m3_row", 512),
        (DeepseekV41MegaAttnImpl, "fp8_ds_mla_v41", 528),
        (DeepseekV41MegaAttnImpl, "nvfp4_ds_mla", 288),
    ],
)
def test_v41_kv_cache_shape(impl, layout, width) -> None:
    obj = impl(layout, 64)
    assert obj.kv_cache_shape(10) == (10, 64, width)
    cache = obj.allocate_kv_cache(10)
    assert tuple(obj.kv_cache_view(cache).shape) == (10, 64, width)
    assert cache.numel() * cache.element_size() == 10 * get_layout(layout).page_bytes(64)


@pytest.mark.parametrize(
    ("impl", "layout"),
    [
        (DeepseekV41FlashMLASparseImpl, "nvfp4_ds_mla"),
        (DeepseekV41FlashMLASparseImpl, "bf16_row"),
        # the 528-byte record is written on SM100 only, where FlashInfer reads plain rows
        (DeepseekV41FlashInferMLASparseImpl, "fp8_ds_mla_v41"),
        (DeepseekV41FlashInferMLASparseImpl, "nvfp4_ds_mla"),
        (DeepseekV41MegaAttnImpl, "bf16_row"),
        (DeepseekV41MegaAttnImpl, "fp8_ds_mla"),
    ],
)
def test_v41_impls_reject_layouts_they_do_not_read(impl, layout) -> None:
    with pytest.raises(UnsupportedLayoutError, match=impl.__name__):
        impl(layout, 64)


@pytest.mark.parametrize(
    ("capability", "reads", "refuses"),
    [((9, 0), "fp8_ds_mla", "fp8_ds_mla_v41"), ("10.0", "fp8_ds_mla_v41", "fp8_ds_mla"),
     ("10.3", "fp8_ds_mla_v41", "fp8_ds_mla")],
)
def test_flashmla_v41_reads_the_record_of_the_gpu_it_is_given(capability, reads, refuses) -> None:
    """vLLM 0.33 writes V4.1's 528-byte record only where FlashMLA's SM100 kernels read it; on SM90
    the cache is V4's 584-byte one. The two differ in size, so the other one is refused."""
    impl = DeepseekV41FlashMLASparseImpl(reads, 64, platform="cuda", capability=capability)
    assert impl.layout.name == reads
    with pytest.raises(UnsupportedLayoutError, match=f"read {reads}, not {refuses}$"):
        DeepseekV41FlashMLASparseImpl(refuses, 64, platform="cuda", capability=capability)
    # without a capability either record is accepted: the GPU decides which one the cache holds
    assert DeepseekV41FlashMLASparseImpl(refuses, 64).layout.name == refuses


def test_write_kv_on_a_v41_record_raises_instead_of_guessing_bytes() -> None:
    impl = DeepseekV41FlashMLASparseImpl("fp8_ds_mla_v41", 64)
    cache = impl.allocate_kv_cache(2)
    with pytest.raises(UnsupportedLayoutError, match="no verified codec"):
        impl.write_kv(cache, torch.ones(1, 512), torch.tensor([0]))


# ---------------------------------------------------------------------------
# availability
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("impl", "platform", "capability", "needle"),
    [
        (DeepseekV41FlashMLASparseImpl, "cpu", None, "not cpu"),
        (DeepseekV41FlashMLASparseImpl, "rocm", "gfx942", "not rocm"),
        (DeepseekV41FlashMLASparseImpl, "cuda", None, "capability"),
        (DeepseekV41FlashMLASparseImpl, "cuda", (12, 0), "on SM12x use FLASHINFER_MLA_SPARSE_DSV41"),
        (DeepseekV41FlashMLASparseImpl, "cuda", (9, 0), "https://github.com/deepseek-ai/FlashMLA"),
        (DeepseekV41FlashMLASparseImpl, "cuda", "10.0", "flash_mla is not importable"),
        (DeepseekV41FlashInferMLASparseImpl, "cpu", None, "not cpu"),
        (DeepseekV41FlashInferMLASparseImpl, "cuda", (9, 0), "FlashInfer DeepSeek-V4.1 sparse decode requires SM10x"),
        (DeepseekV41FlashInferMLASparseImpl, "cuda", (10, 0), "pip install 'dsv4sel[flashinfer]'"),
        (DeepseekV41FlashInferMLASparseImpl, "cuda", (12, 0), "trtllm_batch_decode_sparse_mla_dsv4 is not importable"),
        (DeepseekV41MegaAttnImpl, "cpu", None, "not cpu"),
        (DeepseekV41MegaAttnImpl, "cuda", None, "sm_10x"),
        (DeepseekV41MegaAttnImpl, "cuda", (9, 0), "requires sm_10x GPUs; this GPU is 9.0"),
        (DeepseekV41MegaAttnImpl, "cuda", (12, 0), "requires sm_10x GPUs; this GPU is 12.0"),
        (DeepseekV41MegaAttnImpl, "cuda", "10.0", "built without the mega attention ops"),
        (DeepseekV41MegaAttnImpl, "cuda", "10.3", "torch.ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode"),
    ],
)
def test_v41_is_available_says_what_is_wrong(no_libraries, impl, platform, capability, needle) -> None:
    ok, reason = impl.is_available(platform, capability)
    assert ok is False
    assert needle in reason


@pytest.mark.parametrize("impl", V41_IMPLS)
def test_v41_is_available_never_raises(impl) -> None:
    for platform, capability in [("cuda", "not-a-capability"), ("quantum", None), (None, None), ("cuda", object())]:
        ok, reason = impl.is_available(platform, capability)
        assert isinstance(ok, bool) and isinstance(reason, str) and reason


def test_mega_probe_without_torch_says_so_and_does_not_raise(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)
    ok, reason = DeepseekV41MegaAttnImpl.is_available("cuda", "10.0")
    assert ok is False and "torch is not importable" in reason


def test_flashmla_v41_is_available_with_flash_mla_and_says_dsv4sel_cannot_call_it(fake_module) -> None:
    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                               num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False,
                               indices=None, attn_sink=None):
        raise AssertionError("dsv4sel has no V4.1 adapter: must not be called")

    fake_module("flash_mla", __version__="1.2.3", get_mla_metadata=lambda: (None, None),
                flash_mla_with_kvcache=flash_mla_with_kvcache)
    ok, reason = DeepseekV41FlashMLASparseImpl.is_available("cuda", (9, 0))
    assert ok is True and "flash_mla 1.2.3 importable" in reason and NO_FLASHMLA_ADAPTER in reason
    assert DeepseekV41FlashMLASparseImpl.is_available("cuda", "10.0")[0] is True


# ---------------------------------------------------------------------------
# the mega_attn probe on this machine and through `dsv4sel doctor`
# ---------------------------------------------------------------------------


def test_mega_probe_answers_for_this_machine() -> None:
    platform, capability = detect_platform()
    ok, reason = DeepseekV41MegaAttnImpl.is_available()
    if platform != "cuda":
        assert (ok, f"not {platform}" in reason) == (False, True), reason
    elif capability[0] != 10:
        assert (ok, "requires sm_10x GPUs" in reason) == (False, True), reason
    else:
        pytest.skip(f"an SM10x GPU: the answer depends on the FlashMLA build installed ({reason})")


def test_doctor_fills_mega_attn_from_the_probe() -> None:
    from dsv4sel.dsv4.platform import probe_inputs

    rules = dsv4sel.default_rules()
    (probe,) = [p for p in probe_inputs(rules, "cuda", "10.0") if p.name == "mega_attn"]
    assert probe.impl == "dsv4sel.kernels.v41:DeepseekV41MegaAttnImpl" and probe.asked
    assert probe.value == "unavailable"  # no FlashMLA build with the mega ops here
    assert probe.reason == DeepseekV41MegaAttnImpl.is_available("cuda", "10.0")[1]
    # where mega_attn decides nothing (off SM10x) the probe is not asked: its default stands
    (off,) = [p for p in probe_inputs(rules, "cpu", None) if p.name == "mega_attn"]
    assert (off.value, off.asked, off.reason) == ("unavailable", False, "not probed: it decides nothing on cpu")


# A FlashMLA build with the mega ops, as far as the probe can tell: importing
# it registers the op in torch's registry (the real package does this from C++).
_FAKE_FLASH_MLA = """
import torch

_lib = torch.library.Library("_flashmla_C", "DEF")
_lib.define("fused_norm_rope_attn_rope_cast_decode(Tensor q) -> Tensor[]")
"""

_PROBE_SCRIPT = """
import sys
import dsv4sel
from dsv4sel.dsv4.platform import probe_inputs
from dsv4sel.kernels.v41 import DeepseekV41MegaAttnImpl as M

sys.modules["vllm"] = None  # only the fake flash_mla may register the op
ok, reason = M.is_available("cuda", "10.0")
print(ok)
print(reason)
rules = dsv4sel.default_rules()
(probe,) = [p for p in probe_inputs(rules, "cuda", "10.0") if p.name == "mega_attn"]
print(probe.value)
sel = dsv4sel.select(platform="cuda", capability="10.0", model="deepseek_v4_1", mega_attn=probe.value)
print(sel.backend)
print(M.is_available("cuda", "9.0")[0])
"""


def test_mega_probe_finds_the_op_once_a_provider_registers_it(tmp_path) -> None:
    (tmp_path / "flash_mla").mkdir()
    (tmp_path / "flash_mla" / "__init__.py").write_text(textwrap.dedent(_FAKE_FLASH_MLA))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run(
        [sys.executable, "-c", _PROBE_SCRIPT], capture_output=True, text=True, timeout=300, env=env
    )
    assert result.returncode == 0, result.stderr
    ok, reason, value, backend, on_sm90 = result.stdout.strip().splitlines()
    assert ok == "True"
    assert "torch.ops._flashmla_C.fused_norm_rope_attn_rope_cast_decode importable; cuda 10.0 supported" in reason
    assert "no adapter for FlashMLA's V4.1 mega-attention decode" in reason
    assert (value, backend) == ("available", "FLASHMLA_MEGA_ATTN_DSV41")
    assert on_sm90 == "False", "the op alone is not enough: mega attention is SM10x only"


# ---------------------------------------------------------------------------
# FlashMLA V4.1 and mega-attention decode: one clear error, never a guess
# ---------------------------------------------------------------------------


def _v41_decode_args(layout="fp8_ds_mla_v41", heads=64):
    cache = get_layout(layout).allocate(2, 64)
    q = torch.zeros(1, 1, heads, 512, dtype=torch.bfloat16)
    return q, cache, torch.zeros(1, 1, 8, dtype=torch.int64)


@pytest.mark.parametrize("library", ["absent", "present"])
@pytest.mark.parametrize("fallback", ["error", "reference"])
def test_flashmla_v41_decode_raises_that_dsv4sel_has_no_adapter(fake_module, no_libraries, caplog, library, fallback):
    if library == "present":
        fake_module("flash_mla")
    q, cache, idx = _v41_decode_args()
    impl = DeepseekV41FlashMLASparseImpl("fp8_ds_mla_v41", 64, fallback=fallback, platform="cuda", capability=(10, 0))
    with caplog.at_level(logging.WARNING), pytest.raises(KernelUnavailableError) as info:
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE)
    assert info.value.impl == "DeepseekV41FlashMLASparseImpl"
    assert info.value.reason.startswith(NO_FLASHMLA_ADAPTER)
    if fallback == "reference":
        assert "fallback='reference' cannot stand in" in info.value.reason
        assert "fp8_ds_mla_v41" in info.value.reason
    assert not [r for r in caplog.records if "running the torch reference" in r.getMessage()]


@pytest.mark.parametrize("fallback", ["error", "reference"])
def test_flashmla_v41_on_sm90_has_no_adapter_either(caplog, fallback) -> None:
    """SM90's cache is V4's fp8_ds_mla, which the reference could decode, but V4.1's FlashMLA decode
    has no documented API: no answer is produced rather than one from another model's path."""
    q, cache, idx = _v41_decode_args("fp8_ds_mla")
    impl = DeepseekV41FlashMLASparseImpl("fp8_ds_mla", 64, fallback=fallback, platform="cuda", capability=(9, 0))
    with caplog.at_level(logging.WARNING), pytest.raises(KernelUnavailableError) as info:
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE)
    assert info.value.reason == NO_FLASHMLA_ADAPTER
    assert not [r for r in caplog.records if "running the torch reference" in r.getMessage()]


@pytest.mark.parametrize("layout", ["fp8_ds_mla_v41", "nvfp4_ds_mla"])
@pytest.mark.parametrize("fallback", ["error", "reference"])
def test_mega_decode_raises_that_dsv4sel_has_no_adapter(no_libraries, layout, fallback) -> None:
    q, cache, idx = _v41_decode_args(layout)
    impl = DeepseekV41MegaAttnImpl(layout, 64, fallback=fallback, platform="cuda", capability=(10, 0))
    with pytest.raises(KernelUnavailableError) as info:
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE)
    assert "no adapter for FlashMLA's V4.1 mega-attention decode" in info.value.reason
    assert "fused_norm_rope_attn_rope_cast_decode" in info.value.reason
    assert ("cannot stand in" in info.value.reason) == (fallback == "reference")


# ---------------------------------------------------------------------------
# FlashInfer V4.1 mapping: the V4 calls, on SM12x over V4's 584-byte record
# ---------------------------------------------------------------------------


def _recording_trtllm_dsv4(query, swa_kv_cache, workspace_buffer, **kwargs):
    """flashinfer.mla.trtllm_batch_decode_sparse_mla_dsv4, recording exactly the arguments passed.

    For the SM12x packed convention it also computes what the kernel returns on its default
    record, V4's fp8_ds_mla (the torch reference over the pages behind the views), so a wrong
    view, stride or length makes the numbers differ. A ``kv_cache_format`` other than that
    default names another record, which these caches do not hold: the fake refuses it, as the
    kernel would read garbage. On SM10x (plain rows) it returns the marker ``2 * query``.
    """
    _recording_trtllm_dsv4.calls.append({"query": query, "swa_kv_cache": swa_kv_cache,
                                         "workspace_buffer": workspace_buffer, **kwargs})
    if kwargs.get("kv_cache_format", "fp8") != "fp8":
        raise AssertionError(f"kv_cache_format={kwargs['kv_cache_format']!r}: these pages hold V4's fp8_ds_mla record")
    if swa_kv_cache.dtype != torch.uint8:
        return (query.float() * 2).to(torch.bfloat16)
    b, s = query.shape[:2]
    layout = get_layout("fp8_ds_mla")
    extra = {}
    if kwargs.get("compressed_kv_cache") is not None:
        comp = kwargs["compressed_kv_cache"]
        extra = dict(extra_cache=pages_from_view(comp, layout.page_bytes(comp.shape[1])),
                     extra_indices=kwargs["extra_sparse_indices"],
                     extra_topk_length=kwargs["extra_sparse_topk_lens"].view(b, s)[:, 0])
    out, _ = sparse_mla_decode(
        query, pages_from_view(swa_kv_cache, layout.page_bytes(swa_kv_cache.shape[1])), layout,
        kwargs["sparse_indices"], kwargs["bmm1_scale"], kwargs.get("sinks"), kwargs["swa_topk_lens"].view(b, s)[:, 0],
        **extra,
    )
    return out.to(torch.bfloat16)


def pages_from_view(view, page_bytes):
    """What a kernel sees through a page view: the uint8 pages from its base pointer and page stride."""
    raw = view.view(torch.uint8)
    return raw.as_strided((view.shape[0], page_bytes), (view.stride(0), 1), raw.storage_offset())


def _filled(layout, num_blocks, block_size, gen):
    cache = layout.allocate(num_blocks, block_size)
    n = num_blocks * block_size
    layout.write(cache, torch.randn(n, 512, generator=gen), torch.arange(n))
    return cache


@pytest.fixture
def recording_flashinfer(fake_module):
    _recording_trtllm_dsv4.calls = []
    return fake_module("flashinfer.mla", trtllm_batch_decode_sparse_mla_dsv4=_recording_trtllm_dsv4)


def _old_trtllm_dsv4(query, swa_kv_cache, workspace_buffer, sparse_indices=None, compressed_kv_cache=None,
                     sparse_topk_lens=None, seq_lens=None, out=None, bmm1_scale=1.0, bmm2_scale=1.0, sinks=None,
                     kv_layout="HND", swa_topk_lens=None, extra_sparse_indices=None, extra_sparse_topk_lens=None):
    """A FlashInfer from before kv_cache_format existed (V4's 584-byte record only)."""
    return (query.float() * 2).to(torch.bfloat16)


def test_flashinfer_v41_layouts_per_gpu_are_v4s() -> None:
    assert DeepseekV41FlashInferMLASparseImpl.layouts_by_major == {
        10: {"bf16_row", "fp8_e4m3_row"}, 12: {"fp8_ds_mla"},
    }
    assert DeepseekV41FlashInferMLASparseImpl.layouts_by_major == DeepseekV4FlashInferMLASparseImpl.layouts_by_major


def test_flashinfer_v41_sm12x_needs_no_kv_cache_format_keyword(fake_module) -> None:
    """V4's record is FlashInfer's default format, so a FlashInfer without the keyword serves SM12x."""
    fake_module("flashinfer.mla", trtllm_batch_decode_sparse_mla_dsv4=_old_trtllm_dsv4)
    for capability in ((12, 0), "12.1", (10, 0)):
        ok, reason = DeepseekV41FlashInferMLASparseImpl.is_available("cuda", capability)
        assert ok is True and "supported" in reason, (capability, reason)
    q, cache, idx = _v41_decode_args("fp8_ds_mla", heads=8)
    impl = DeepseekV41FlashInferMLASparseImpl("fp8_ds_mla", 64, platform="cuda", capability=(12, 0), workspace_bytes=64)
    got = impl.forward_decode(q, cache, idx, softmax_scale=SCALE)
    assert torch.equal(got.out, (q.float() * 2).to(torch.bfloat16))


def test_flashinfer_v41_sm12x_is_the_v4_packed_call_over_584_byte_pages(recording_flashinfer, gen) -> None:
    block_size, b, s, heads = 64, 2, 2, 20
    layout = get_layout("fp8_ds_mla")
    swa, comp = _filled(layout, 2, block_size, gen), _filled(layout, 3, block_size, gen)
    args = dict(
        q=torch.randn(b, s, heads, 512, generator=gen).to(torch.bfloat16), kv_cache=swa,
        indices=random_indices(b, s, 128, 2 * block_size, gen), softmax_scale=SCALE,
        attn_sink=torch.randn(heads, generator=gen), topk_length=torch.tensor([128, 40]), extra_kv_cache=comp,
        extra_indices=random_indices(b, s, 30, 3 * block_size, gen), extra_topk_length=torch.tensor([7, 30]),
    )
    outputs = [cls("fp8_ds_mla", block_size, platform="cuda", capability="12.0", workspace_bytes=64).forward_decode(**args)
               for cls in (DeepseekV4FlashInferMLASparseImpl, DeepseekV41FlashInferMLASparseImpl)]
    v4, v41 = _recording_trtllm_dsv4.calls
    assert "kv_cache_format" not in v41, "FlashInfer's default format is V4's record, the one V4.1 keeps on SM12x"
    assert v41.keys() == v4.keys()
    for key, value in v4.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == v41[key].dtype and torch.equal(value, v41[key]), key
        else:
            assert value == v41[key], key
    page = layout.page_bytes(block_size)
    for name, cache, blocks in (("swa_kv_cache", swa, 2), ("compressed_kv_cache", comp, 3)):
        view = v41[name]
        assert view.dtype == torch.uint8 and view.shape == (blocks, block_size, 584), name
        assert view.stride() == (page, 584, 1) and view.data_ptr() == cache.data_ptr(), name
    assert v41["query"].shape == (b, s, 32, 512) and not v41["query"][:, :, heads:].any(), "padded heads are zero"
    out, _ = sparse_mla_decode(
        args["q"], swa, "fp8_ds_mla", args["indices"], SCALE, args["attn_sink"], args["topk_length"],
        extra_cache=comp, extra_indices=args["extra_indices"], extra_topk_length=args["extra_topk_length"],
    )
    assert outputs[1].lse is None
    torch.testing.assert_close(outputs[1].out.float(), out, atol=1e-2, rtol=1e-2)
    assert torch.equal(outputs[0].out, outputs[1].out)


@pytest.mark.parametrize("layout", ["bf16_row", "fp8_e4m3_row"])
def test_flashinfer_v41_sm10x_is_the_v4_trtllm_gen_call(recording_flashinfer, gen, layout) -> None:
    block_size = 64
    lay = get_layout(layout)
    swa, comp = _filled(lay, 2, block_size, gen), _filled(lay, 3, block_size, gen)
    n_swa, n_comp = 2 * block_size, 3 * block_size
    args = dict(
        q=torch.randn(2, 1, 16, 512, generator=gen).to(torch.bfloat16), kv_cache=swa,
        indices=random_indices(2, 1, 128, n_swa, gen), softmax_scale=SCALE, attn_sink=torch.randn(16, generator=gen),
        topk_length=torch.tensor([128, 70]), extra_kv_cache=comp, extra_indices=random_indices(2, 1, 30, n_comp, gen),
        extra_topk_length=torch.tensor([30, 11]), seq_lens=torch.tensor([900, 70]),
    )
    for cls in (DeepseekV4FlashInferMLASparseImpl, DeepseekV41FlashInferMLASparseImpl):
        cls(layout, block_size, platform="cuda", capability=(10, 0), workspace_bytes=64).forward_decode(**args)
    v4, v41 = _recording_trtllm_dsv4.calls
    assert "kv_cache_format" not in v41, "SM10x passes no format keyword: FlashInfer's default applies"
    assert v41.keys() == v4.keys()
    for key, value in v4.items():
        if isinstance(value, torch.Tensor):
            assert value.dtype == v41[key].dtype and torch.equal(value.view(torch.uint8), v41[key].view(torch.uint8)), key
        else:
            assert value == v41[key], key


@pytest.mark.parametrize(
    ("layout", "capability", "needle"),
    [("fp8_ds_mla", (10, 0), "plain"), ("bf16_row", (12, 0), "packed fp8_ds_mla layout")],
)
def test_flashinfer_v41_layout_must_match_the_gpu_generation(recording_flashinfer, layout, capability, needle) -> None:
    q, cache, idx = _v41_decode_args(layout, heads=8)
    impl = DeepseekV41FlashInferMLASparseImpl(layout, 64, platform="cuda", capability=capability, workspace_bytes=64)
    with pytest.raises(UnsupportedLayoutError, match=needle):
        impl.forward_decode(q, cache, idx, softmax_scale=SCALE, seq_lens=torch.tensor([64]))
    assert _recording_trtllm_dsv4.calls == []


@pytest.mark.parametrize("layout", ["fp8_ds_mla", "bf16_row"])
def test_flashinfer_v41_reference_fallback_serves_the_records_it_reads(no_libraries, gen, caplog, layout) -> None:
    """Both are layouts with a codec (SM12x's is V4's record), so the torch reference can stand in."""
    lay = get_layout(layout)
    cache = _filled(lay, 2, 8, gen)
    q = torch.randn(1, 1, 4, 512, generator=gen)
    idx = random_indices(1, 1, 6, 16, gen)
    impl = DeepseekV41FlashInferMLASparseImpl(layout, 8, fallback="reference")
    with caplog.at_level(logging.WARNING):
        got = impl.forward_decode(q, cache, idx, softmax_scale=SCALE)  # CPU tensors: FlashInfer cannot run
    out, lse = sparse_mla_decode(q, cache, layout, idx, SCALE)
    assert torch.equal(got.out, out.to(torch.bfloat16)) and torch.equal(got.lse, lse)
    assert [r for r in caplog.records if "running the torch reference" in r.getMessage()]


# ---------------------------------------------------------------------------
# every impl and layout the shipped rules select resolves, with the rules' sizes
# ---------------------------------------------------------------------------


def _shipped_selections():
    """One Selection per distinct (impl, layout, torch dtype, bytes, block size) the shipped rules select."""
    rules = dsv4sel.default_rules()
    first = {}
    for key, index in rules.items():
        row = rules.rows[index]
        if row.kind == "select":
            first.setdefault((row.impl, row.layout, row.cache_dtype, row.torch_dtype, row.bytes_per_token,
                              row.block_size), key)
    out = []
    for key in first.values():
        model, platform, capability, backend, kv, *extra = key
        query = Query(model, platform, capability, backend, kv, tuple(zip(rules.extra_inputs, extra)))
        out.append(rules.outcome(query))
    return out


def test_every_selection_of_the_shipped_rules_resolves_to_an_impl_that_reads_its_layout() -> None:
    selections = _shipped_selections()
    seen_impls, seen_layouts = set(), set()
    for sel in selections:
        assert isinstance(sel, dsv4sel.Selection), sel
        cls = sel.load_impl()
        assert issubclass(cls, SparseMLAImpl), sel.impl
        layout = get_layout(sel.layout)
        assert (layout.bytes_per_token, layout.torch_dtype_name) == (sel.bytes_per_token, sel.torch_dtype_name), sel
        impl = cls(sel.layout, sel.block_size)  # raises UnsupportedLayoutError if the impl cannot read it
        assert impl.kv_cache_shape(1)[-1] == (layout.bytes_per_token if layout.torch_dtype_name == "uint8" else 512)
        seen_impls.add(sel.impl)
        seen_layouts.add(sel.layout)
    assert {f"dsv4sel.kernels.v41:{cls.__name__}" for cls in V41_IMPLS} <= seen_impls
    # nvfp4_ds_mla is the compressed cache's record: the rules name it as a cache dtype, not a layout
    assert "fp8_ds_mla_v41" in seen_layouts


def test_every_v41_cuda_selection_names_the_record_its_gpu_reads() -> None:
    """vLLM 0.33's sizes, per GPU: the 528-byte V4.1 record on SM100 only (FlashMLA, 128-token
    blocks); SM90 FlashMLA keeps V4's 584-byte record in blocks of 64; SM12x FlashInfer keeps it
    in blocks of 128; SM100 FlashInfer reads plain rows. Every selecting CUDA input of the shipped
    rules names a layout the impl reads on that GPU, with that layout's size."""
    rules = dsv4sel.default_rules()
    seen = set()
    for key, index in rules.items():
        row = rules.rows[index]
        model, platform, capability = key[:3]
        if row.kind != "select" or model != "deepseek_v4_1" or platform != "cuda" or capability == "unknown":
            continue
        cls = kernels.load_impl(row.impl)
        major = int(capability.split(".")[0])
        by_major = getattr(cls, "layouts_by_major", {major: cls.supported_layouts})
        assert row.layout in by_major[major], (key, row.impl, row.layout)
        assert get_layout(row.layout).bytes_per_token == row.bytes_per_token, (key, row.layout, row.bytes_per_token)
        seen.add((cls.__name__, major, row.layout, row.bytes_per_token, row.block_size))
    assert seen == {
        ("DeepseekV41FlashMLASparseImpl", 9, "fp8_ds_mla", 584, 64),
        ("DeepseekV41FlashMLASparseImpl", 10, "fp8_ds_mla_v41", 528, 128),
        ("DeepseekV41MegaAttnImpl", 10, "fp8_ds_mla_v41", 528, 128),
        ("DeepseekV41FlashInferMLASparseImpl", 10, "bf16_row", 1024, 128),
        ("DeepseekV41FlashInferMLASparseImpl", 10, "fp8_e4m3_row", 512, 128),
        ("DeepseekV41FlashInferMLASparseImpl", 12, "fp8_ds_mla", 584, 128),
    }
