"""KV-cache layouts: sizes, byte placement, and codec exactness.

The fp8_ds_mla checks decode the cache with a byte-level decoder written here
in plain Python (no torch casts), so a wrong offset, scale or rounding in the
layout module shows up as a byte mismatch.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
import struct
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4sel.kernels.errors import UnknownLayoutError
from dsv4sel.kernels.layouts import SlotRangeError, raise_slot_errors, slot_errors
from dsv4sel.kernels.layouts import LAYOUTS, get_layout

# ---------------------------------------------------------------------------
# An independent byte-level codec (plain Python)
# ---------------------------------------------------------------------------


def e4m3_value(byte: int) -> float:
    """float8_e4m3fn byte -> value (bias 7, no infinities, 0x7f/0xff are NaN)."""
    sign = -1.0 if byte & 0x80 else 1.0
    exp, man = (byte >> 3) & 0xF, byte & 0x7
    if exp == 0xF and man == 0x7:
        return math.nan
    if exp == 0:
        return sign * (man / 8.0) * 2.0**-6
    return sign * (1.0 + man / 8.0) * 2.0 ** (exp - 7)


# Non-negative finite e4m3 values, ascending, with their bytes.
_E4M3 = sorted((e4m3_value(b), b) for b in range(0x7F))
_E4M3_VALUES = [v for v, _ in _E4M3]


def e4m3_nearest_byte(x: float) -> int:
    """Round-to-nearest-even e4m3 encoding of ``x``, saturating at +-448; keeps the sign of zero."""
    mag = min(abs(x), 448.0)
    i = bisect.bisect_left(_E4M3_VALUES, mag)
    if i == len(_E4M3_VALUES):
        i -= 1
    candidates = [j for j in (i - 1, i) if 0 <= j < len(_E4M3)]
    best = min(candidates, key=lambda j: (abs(_E4M3_VALUES[j] - mag), _E4M3[j][1] & 1))
    byte = _E4M3[best][1]
    return byte | 0x80 if math.copysign(1.0, x) < 0 else byte


def bf16_value(lo: int, hi: int) -> float:
    return struct.unpack("<f", bytes([0, 0, lo, hi]))[0]


def f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def expected_exponent(tile: list[float]) -> int:
    """ceil(log2(max(amax / 448, 1e-4))) with the division rounded to float32."""
    amax = max(abs(v) for v in tile)
    return math.ceil(math.log2(max(f32(f32(amax) / 448.0), f32(1e-4))))


def decode_token(page: bytes, block_size: int, offset: int) -> tuple[list[float], list[int], int]:
    """(512 values, 7 exponent bytes, pad byte) of one token in a raw fp8_ds_mla page."""
    data = page[offset * 576 : offset * 576 + 576]
    scale_bytes = page[block_size * 576 + offset * 8 : block_size * 576 + offset * 8 + 8]
    values = []
    for tile in range(7):
        scale = 2.0 ** (scale_bytes[tile] - 127)
        values += [e4m3_value(b) * scale for b in data[tile * 64 : tile * 64 + 64]]
    values += [bf16_value(data[448 + 2 * i], data[449 + 2 * i]) for i in range(64)]
    return values, list(scale_bytes[:7]), scale_bytes[7]


def page_bytes_of(cache: torch.Tensor, block: int) -> bytes:
    return bytes(cache[block].cpu().tolist())


# ---------------------------------------------------------------------------
# Sizes and identity: what `dsv4sel check` relies on
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "block_size", "expected"),
    [
        ("fp8_ds_mla", 64, 37440),  # C4 main / SWA page, vLLM test_contiguous_kv_packing
        ("fp8_ds_mla", 2, 1728),  # C128 page
        ("fp8_ds_mla", 256, 149760),  # 256 * 584 = 149504 -> 260 * 576
        ("fp8_ds_mla", 1, 1152),  # 584 -> 2 * 576
        ("fp8_ds_mla", 16, 9792),  # 9344 -> 17 * 576
        ("bf16_row", 64, 65536),
        ("bf16_row", 256, 262144),
        ("fp8_e4m3_row", 64, 32768),
        ("fp8_e4m3_row", 256, 131072),
    ],
)
def test_page_bytes(name: str, block_size: int, expected: int) -> None:
    assert get_layout(name).page_bytes(block_size) == expected


@pytest.mark.parametrize(
    ("name", "bytes_per_token", "dtype_name", "alignment"),
    [
        ("fp8_ds_mla", 584, "uint8", 576),
        ("bf16_row", 1024, "bfloat16", 512),
        ("fp8_e4m3_row", 512, "float8_e4m3fn", 512),
    ],
)
def test_layout_identity(name: str, bytes_per_token: int, dtype_name: str, alignment: int) -> None:
    layout = get_layout(name)
    assert (layout.name, layout.bytes_per_token, layout.torch_dtype_name, layout.alignment) == (
        name,
        bytes_per_token,
        dtype_name,
        alignment,
    )
    assert layout.torch_dtype() == getattr(torch, dtype_name)


def test_layouts_mapping_enumerates_exactly_the_five_layouts_read_only() -> None:
    assert set(LAYOUTS) == {"fp8_ds_mla", "bf16_row", "fp8_e4m3_row", "fp8_ds_mla_v41", "nvfp4_ds_mla"}
    assert {name for name in LAYOUTS if LAYOUTS[name].has_codec} == {"fp8_ds_mla", "bf16_row", "fp8_e4m3_row"}
    assert all(LAYOUTS[name].name == name for name in LAYOUTS)
    with pytest.raises(TypeError):
        LAYOUTS["x"] = LAYOUTS["bf16_row"]  # type: ignore[index]


def test_the_record_table_the_wire_contract_reads_states_every_layout_s_sizes() -> None:
    # kernels/record.py's RECORDS is what dsv4sel.dsv4.contract reads without importing the layouts:
    # the same layouts, the same sizes, and fp8 exactly where the cache holds e4m3 values
    from dsv4sel.kernels.record import RECORD_FIELDS, RECORDS

    assert set(RECORDS) == set(LAYOUTS)
    for name, layout in LAYOUTS.items():
        record = dict(zip(RECORD_FIELDS, RECORDS[name]))
        assert (record["bytes_per_token"], record["alignment"]) == (layout.bytes_per_token, layout.alignment), name
        assert record["has_fp8"] == (name != "bf16_row"), name
        assert record["arrangement"] == ("row" if name.endswith("_row") else
                                         "block-split" if name == "fp8_ds_mla" else "token-interleaved"), name


def test_layouts_are_frozen_values() -> None:
    layout = get_layout("fp8_ds_mla")
    with pytest.raises(dataclasses.FrozenInstanceError):
        layout.bytes_per_token = 656  # type: ignore[misc]
    assert get_layout("fp8_e4m3_row").with_scale(2.0) == get_layout("fp8_e4m3_row").with_scale(2.0)
    assert get_layout("fp8_e4m3_row").with_scale(2.0) != get_layout("fp8_e4m3_row")
    assert get_layout("fp8_e4m3_row").scale == 1.0


@pytest.mark.parametrize("bad", ["fp8", "FP8_DS_MLA", "", None, 584])
def test_unknown_layout_is_a_value_error_listing_valid_names(bad: object) -> None:
    with pytest.raises(UnknownLayoutError) as info:
        get_layout(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, ValueError)
    for name in ("fp8_ds_mla", "bf16_row", "fp8_e4m3_row"):
        assert name in str(info.value)


@pytest.mark.parametrize("bad", [0, -64, 64.0, True])
def test_page_bytes_rejects_bad_block_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        get_layout("fp8_ds_mla").page_bytes(bad)  # type: ignore[arg-type]


def test_sizes_and_impl_modules_import_without_torch_or_kernel_libraries() -> None:
    code = (
        "import sys\n"
        "import dsv4sel.kernels, dsv4sel.kernels.layouts as L\n"
        "import dsv4sel.kernels.flashmla, dsv4sel.kernels.flashinfer, dsv4sel.kernels.rocm, dsv4sel.kernels.reference\n"
        "import dsv4sel.kernels.v41\n"
        "assert [L.get_layout(n).page_bytes(64) for n in L.LAYOUTS] == [37440, 65536, 32768, 33792, 18432]\n"
        "assert [L.LAYOUTS[n].torch_dtype_name for n in L.LAYOUTS] == ['uint8', 'bfloat16', 'float8_e4m3fn', 'uint8', 'uint8']\n"
        "from dsv4sel.kernels.v41 import DeepseekV41MegaAttnImpl as M\n"
        "ok, reason = M.is_available('cuda', '9.0')\n"
        "assert not ok and 'sm_10x' in reason\n"
        "from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl as F\n"
        "ok, reason = F.is_available('cpu', None)\n"
        "assert not ok and 'cuda' in reason\n"
        "loaded = sorted(m for m in ('torch', 'flash_mla', 'flashinfer', 'aiter') if m in sys.modules)\n"
        "print(loaded)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------
# allocate
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_allocate_gives_zeroed_pages_back_to_back(name: str, device: str) -> None:
    layout = get_layout(name)
    cache = layout.allocate(3, 64, device=device)
    assert cache.dtype == getattr(torch, layout.torch_dtype_name)
    assert cache.device.type == device
    assert cache.is_contiguous()
    assert cache.numel() * cache.element_size() == 3 * layout.page_bytes(64)
    assert cache.untyped_storage().nbytes() == 3 * layout.page_bytes(64)
    assert not cache.view(torch.uint8).any()
    assert layout.block_size_of(cache) == 64


def test_fp8_ds_mla_kernel_view_addresses_pages() -> None:
    layout = get_layout("fp8_ds_mla")
    cache = layout.allocate(5, 64)
    view = layout.kernel_view(cache)
    assert view.shape == (5, 64, 584)
    assert view.stride() == (37440, 584, 1)
    assert view.dtype == torch.uint8
    assert view.data_ptr() == cache.data_ptr()
    assert layout.kernel_shape(5, 64) == (5, 64, 584)
    assert get_layout("bf16_row").kernel_shape(5, 64) == (5, 64, 512)


# ---------------------------------------------------------------------------
# fp8_ds_mla codec, byte by byte
# ---------------------------------------------------------------------------


def _varied_kv(n: int, gen: torch.Generator) -> torch.Tensor:
    """bf16 rows whose 64-wide tiles span many magnitudes (1e-6 .. 1e4), plus a zero tile."""
    kv = torch.randn(n, 512, generator=gen)
    tile_scale = 10.0 ** torch.randint(-6, 5, (n, 8), generator=gen).float()
    kv = (kv.view(n, 8, 64) * tile_scale.unsqueeze(-1)).view(n, 512)
    kv[0, 64:128] = 0.0  # an all-zero tile takes the 1e-4 floor
    return kv.to(torch.bfloat16)


def test_fp8_ds_mla_bytes_match_independent_decoder(device: str, gen: torch.Generator) -> None:
    layout = get_layout("fp8_ds_mla")
    block_size, num_blocks, n = 16, 3, 20
    kv = _varied_kv(n, gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:n]
    cache = layout.allocate(num_blocks, block_size, device=device)
    layout.write(cache, kv.to(device), slots.to(device))

    written = {int(s): i for i, s in enumerate(slots)}
    page_size = layout.page_bytes(block_size)
    for block in range(num_blocks):
        page = page_bytes_of(cache, block)
        assert len(page) == page_size
        assert not any(page[block_size * 584 :]), "page padding must stay zero"
        for offset in range(block_size):
            slot = block * block_size + offset
            if slot not in written:
                assert not any(page[offset * 576 : offset * 576 + 576])
                assert not any(page[block_size * 576 + offset * 8 : block_size * 576 + offset * 8 + 8])
                continue
            row = kv[written[slot]].float().tolist()
            values, exponents, pad = decode_token(page, block_size, offset)
            assert pad == 0
            assert [e - 127 for e in exponents] == [expected_exponent(row[t * 64 : t * 64 + 64]) for t in range(7)]
            data = page[offset * 576 : offset * 576 + 448]
            for i in range(448):
                scale = 2.0 ** (exponents[i // 64] - 127)
                assert data[i] == e4m3_nearest_byte(row[i] / scale), (slot, i)
            assert values[448:] == row[448:], "RoPE must be stored as the exact bf16 input"

    # read() must return exactly what the independent decoder sees.
    got = layout.read(cache, slots.to(device)).cpu()
    assert got.dtype == torch.bfloat16 and got.shape == (n, 512)
    for i, slot in enumerate(slots.tolist()):
        page = page_bytes_of(cache, slot // block_size)
        values, _, _ = decode_token(page, block_size, slot % block_size)
        assert got[i].float().tolist() == torch.tensor(values).to(torch.bfloat16).float().tolist()


@pytest.mark.parametrize(
    ("amax", "exponent"),
    [
        (0.0, -13),  # floor 1e-4 -> 2**-13
        (448 * 2.0**-20, -13),  # below the floor
        (448 * 2.0**-3, -3),  # exact powers of two keep their exponent
        (448.0, 0),
        (448 * 2.0**5, 5),
        (448 * 2.0**5 * (1 + 2.0**-7), 6),  # just above rounds the scale up
    ],
)
def test_fp8_ds_mla_tile_scale_edges(amax: float, exponent: int, device: str) -> None:
    layout = get_layout("fp8_ds_mla")
    kv = torch.zeros(1, 512)
    kv[0, 0] = amax
    kv[0, 1] = -amax / 2
    cache = layout.allocate(1, 2, device=device)
    layout.write(cache, kv.to(device), torch.tensor([1], device=device))
    page = page_bytes_of(cache, 0)
    _, exponents, _ = decode_token(page, 2, 1)
    assert exponents[0] - 127 == exponent
    assert exponents[1:] == [127 - 13] * 6
    if amax:
        assert page[576] == e4m3_nearest_byte(amax / 2.0**exponent)
        assert page[577] == e4m3_nearest_byte(-amax / 2 / 2.0**exponent)


def test_write_touches_only_its_token_bytes(device: str, gen: torch.Generator) -> None:
    layout = get_layout("fp8_ds_mla")
    block_size = 8
    cache = layout.allocate(3, block_size, device=device)
    layout.write(cache, _varied_kv(24, gen).to(device), torch.arange(24, device=device))
    before = cache.cpu().clone()
    layout.write(cache, torch.full((1, 512), 3.0, device=device), torch.tensor([13], device=device))
    changed = (cache.cpu() != before).nonzero().tolist()
    block, offset = divmod(13, block_size)
    data = range(offset * 576, offset * 576 + 576)
    scales = range(block_size * 576 + offset * 8, block_size * 576 + offset * 8 + 8)
    assert changed and all(b == block and (col in data or col in scales) for b, col in changed)


@settings(max_examples=60, deadline=None)
@given(
    tile_exponents=st.lists(st.integers(-14, 14), min_size=8, max_size=8),
    seed=st.integers(0, 2**31 - 1),
    heavy_tail=st.booleans(),
)
def test_fp8_ds_mla_roundtrip_error_is_within_half_an_fp8_step(
    tile_exponents: list[int], seed: int, heavy_tail: bool
) -> None:
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(4, 8, 64, generator=gen)
    if heavy_tail:  # a few outliers per tile push most values into fp8 subnormals
        base = base ** 3
    kv = (base * torch.exp2(torch.tensor(tile_exponents, dtype=torch.float32)).view(1, 8, 1)).view(4, 512)
    kv = kv.to(torch.bfloat16)
    layout = get_layout("fp8_ds_mla")
    cache = layout.allocate(1, 4)
    slots = torch.arange(4)
    layout.write(cache, kv, slots)
    got = layout.read(cache, slots).float()
    x = kv.float()
    assert torch.equal(got[:, 448:], x[:, 448:])
    nope, back = x[:, :448].view(-1, 7, 64), got[:, :448].view(-1, 7, 64)
    scale = torch.exp2(torch.clamp_min(nope.abs().amax(-1) / 448, 1e-4).log2().ceil()).unsqueeze(-1)
    # e4m3: 3 mantissa bits (half step 2**-4 relative); subnormal step 2**-9 * scale.
    # The bf16 result adds at most 2**-9 relative.
    bound = torch.maximum(nope.abs() * (2.0**-4 + 2.0**-8), scale * 2.0**-10)
    assert bool(((back - nope).abs() <= bound).all())


# ---------------------------------------------------------------------------
# Row layouts
# ---------------------------------------------------------------------------


def test_bf16_row_roundtrip_is_exact(device: str, gen: torch.Generator) -> None:
    layout = get_layout("bf16_row")
    kv = torch.randn(10, 512, generator=gen).to(torch.bfloat16)
    cache = layout.allocate(2, 8, device=device)
    slots = torch.tensor([0, 3, 7, 8, 9, 10, 11, 12, 14, 15], device=device)
    layout.write(cache, kv.to(device), slots)
    assert torch.equal(layout.read(cache, slots).cpu(), kv)
    assert torch.equal(cache.view(16, 512)[slots].cpu(), kv)


def test_fp8_e4m3_row_stores_value_over_scale(device: str, gen: torch.Generator) -> None:
    layout = get_layout("fp8_e4m3_row").with_scale(2.0)
    kv = torch.randn(4, 512, generator=gen) * 50
    kv[0, :3] = torch.tensor([5000.0, -5000.0, 896.0])  # beyond 448 * scale saturates
    cache = layout.allocate(1, 4, device=device)
    layout.write(cache, kv.to(device), torch.arange(4, device=device))
    raw = cache.view(torch.uint8).cpu().view(4, 512)
    for r in range(4):
        assert raw[r].tolist() == [e4m3_nearest_byte(v / 2.0) for v in kv[r].tolist()]
    got = layout.read(cache, torch.arange(4, device=device)).cpu().float()
    assert got[0, :3].tolist() == [896.0, -896.0, 896.0]
    expected = torch.tensor([[e4m3_value(b) * 2.0 for b in row] for row in raw.tolist()]).to(torch.bfloat16).float()
    assert torch.equal(got, expected)


# ---------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------


CODECS = sorted(n for n in LAYOUTS if LAYOUTS[n].has_codec)


def _bytes(cache: torch.Tensor) -> torch.Tensor:
    return cache.view(torch.uint8).cpu()


@pytest.mark.parametrize("name", CODECS)
def test_slots_past_the_cache_are_reported_and_skipped_and_negative_slots_skipped(name: str, device: str) -> None:
    layout = get_layout(name)
    cache = layout.allocate(2, 4, device=device)
    kv = torch.ones(1, 512, device=device)
    for bad in (8, 100):
        for backend in ("auto", "torch"):
            if device == "cpu":  # no device to wait for: the call raises
                with pytest.raises(ValueError, match="slots must be below 8"):
                    layout.write(cache, kv, torch.tensor([bad], device=device), backend=backend)
                with pytest.raises(ValueError, match="slots must be below 8"):
                    layout.read(cache, torch.tensor([bad], device=device), backend=backend)
                continue
            # CUDA: no host sync in the call; the device's status reports it when asked
            layout.write(cache, kv.expand(2, 512), torch.tensor([3, bad], device=device), backend=backend)
            assert not layout.read(cache, torch.tensor([bad], device=device), backend=backend).any()
            with pytest.raises(SlotRangeError, match=f"slots must be below 8 .*2 slot.*the largest {bad}") as err:
                raise_slot_errors(device)
            assert isinstance(err.value, ValueError) and err.value.errors == (2, bad, 8)
            raise_slot_errors(device)  # cleared by the check
            assert slot_errors(device).count == 0
            cache.zero_()
    assert not _bytes(cache).any(), "a rejected write must not touch the cache"
    layout.write(cache, torch.ones(2, 512, device=device), torch.tensor([-1, 8], device=device), check=False)
    assert not _bytes(cache).any(), "skipped slots must not touch the cache"
    if device != "cpu":
        assert slot_errors(device).count == 0, "check=False records nothing"

    kv = (torch.arange(3 * 512, dtype=torch.float32).view(3, 512) / 100).to(device)
    layout.write(cache, kv, torch.tensor([-1, 5, -7], device=device))
    alone = layout.allocate(2, 4, device=device)
    layout.write(alone, kv[1:2], torch.tensor([5], device=device))
    assert torch.equal(_bytes(cache), _bytes(alone)) and _bytes(alone).any()
    got = layout.read(cache, torch.tensor([5, -1, 8, 5], device=device), check=False).cpu()
    assert not got[1:3].any(), "negative and (unchecked) out-of-range slots read zeros"
    assert torch.equal(got[0], got[3]) and torch.equal(got[0], layout.read(alone, torch.tensor([5], device=device)).cpu()[0])


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("n", [600, 3000], ids=["in-kernel-election", "scratch-election"])
def test_duplicate_slots_the_last_row_wins_whole(name: str, device: str, gen: torch.Generator, n: int) -> None:
    layout = get_layout(name)
    capacity = 64  # many rows per slot: a torn or first-wins write would show
    cache = layout.allocate(capacity // 16, 16, device=device)
    for _ in range(2):  # twice: the scratch election leaves its array as it found it
        kv = _varied_kv(n, gen)
        slots = torch.randint(0, capacity, (n,), generator=gen)
        slots[::7] = -1
        slots[-5:] = slots[0]  # the last row of a slot may be in another program than the first
        layout.write(cache, kv.to(device), slots.to(device))
        last = {}
        for i, slot in enumerate(slots.tolist()):
            if slot >= 0:
                last[slot] = i
        expected = layout.allocate(capacity // 16, 16, device=device)
        winners = torch.tensor(sorted(last.values()))
        layout.write(expected, kv[winners].to(device), slots[winners].to(device), unique=True)
        assert torch.equal(_bytes(cache), _bytes(expected))


def test_backend_argument(gen: torch.Generator) -> None:
    layout = get_layout("bf16_row")
    cache = layout.allocate(1, 4)
    with pytest.raises(ValueError, match="backend must be one of"):
        layout.write(cache, torch.ones(1, 512), torch.tensor([0]), backend="cuda")
    with pytest.raises(ValueError, match="backend='triton' cannot run here: the fused codecs run on CUDA"):
        layout.read(cache, torch.tensor([0]), backend="triton")
    layout.write(cache, torch.ones(1, 512), torch.tensor([0]), backend="torch")
    assert layout.read(cache, torch.tensor([0]), backend="auto").float().eq(1).all()


# ---------------------------------------------------------------------------
# The fused Triton codecs (CUDA): byte-exact with the torch codec
# ---------------------------------------------------------------------------


def _fused_or_skip() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device visible to torch: the fused Triton codecs run on CUDA")
    from dsv4sel.kernels.layouts import _fused_unavailable

    why = _fused_unavailable(torch.device("cuda"))
    if why is not None:
        pytest.skip(f"the fused Triton codecs cannot run here: {why}")


def _codec_cases():
    return [
        pytest.param("fp8_ds_mla", 1.0, id="fp8_ds_mla"),
        pytest.param("bf16_row", 1.0, id="bf16_row"),
        pytest.param("fp8_e4m3_row", 1.0, id="fp8_e4m3_row"),
        pytest.param("fp8_e4m3_row", 0.37, id="fp8_e4m3_row-scale0.37"),
        pytest.param("fp8_e4m3_row", 2.0**-3, id="fp8_e4m3_row-scale2^-3"),
    ]


def _edge_kv(n: int, gen: torch.Generator) -> torch.Tensor:
    """fp32 rows with tile maxima at, just above and just below 448 * 2**k, zeros, signed zeros and subnormals."""
    kv = _varied_kv(n, gen).float()
    k = torch.randint(-20, 20, (n, 8), generator=gen).float()
    nudge = torch.tensor([1.0, 1 + 2.0**-23, 1 - 2.0**-24, 1 + 2.0**-7, 1 - 2.0**-8])
    pick = nudge[torch.randint(0, len(nudge), (n, 8), generator=gen)]
    kv.view(n, 8, 64)[:, :, 0] = 448.0 * torch.exp2(k) * pick
    kv[1, :64] = -0.0
    kv[2, 64:128] = 1e-40  # float32 subnormals
    kv[3, 128:192] = torch.where(torch.arange(64) % 2 == 0, 3.0e38, -3.0e38)
    return kv


@pytest.mark.gpu
@pytest.mark.parametrize(("name", "scale"), _codec_cases())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_write_and_read_are_byte_exact_with_the_torch_codec(name, scale, dtype, gen) -> None:
    _fused_or_skip()
    layout = get_layout(name) if scale == 1.0 else get_layout(name).with_scale(scale)
    n, block_size, num_blocks = 3000, 64, 40
    kv = (_edge_kv(n, gen) if dtype == torch.float32 else _varied_kv(n, gen)).to(dtype).cuda()
    slots = torch.randint(0, num_blocks * block_size, (n,), generator=gen)
    slots[::11] = -1
    slots = slots.cuda()
    fused, ref = (layout.allocate(num_blocks, block_size, device="cuda") for _ in range(2))
    layout.write(fused, kv, slots, backend="triton")
    layout.write(ref, kv, slots, backend="torch")
    diff = (_bytes(fused) != _bytes(ref)).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} bytes differ, first at {diff[:5].tolist()}"
    read_slots = torch.cat([slots, torch.tensor([-1, 5], device="cuda")])
    a = layout.read(fused, read_slots, backend="triton")
    b = layout.read(fused, read_slots, backend="torch")
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    # unique=True (no election) writes the same bytes when the slots are unique
    uniq = torch.randperm(num_blocks * block_size, generator=gen)[:n // 2].cuda()
    fused2, ref2 = (layout.allocate(num_blocks, block_size, device="cuda") for _ in range(2))
    layout.write(fused2, kv[: n // 2], uniq, backend="triton", unique=True)
    layout.write(ref2, kv[: n // 2], uniq, backend="torch")
    assert torch.equal(_bytes(fused2), _bytes(ref2))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["fp8_ds_mla", "fp8_e4m3_row"])
def test_fused_read_decodes_every_byte_like_the_torch_codec(name, gen) -> None:
    """Caches of random bytes: every e4m3 value and every UE8M0 exponent (0..255), NaN encodings too."""
    _fused_or_skip()
    layout = get_layout(name)
    block_size, num_blocks = 64, 64
    cache = layout.allocate(num_blocks, block_size, device="cuda")
    raw = torch.randint(0, 256, (cache.numel() * cache.element_size(),), generator=gen, dtype=torch.uint8)
    cache.view(torch.uint8).view(-1).copy_(raw.cuda())
    slots = torch.arange(num_blocks * block_size, device="cuda")
    a = layout.read(cache, slots, backend="triton").float()
    b = layout.read(cache, slots, backend="torch").float()
    both_nan = torch.isnan(a) & torch.isnan(b)
    assert bool((both_nan | (a.view(torch.int32) == b.view(torch.int32))).all())


@pytest.mark.gpu
@pytest.mark.parametrize("check", [False, True], ids=["unchecked", "checked"])
def test_fused_codecs_run_under_cuda_graph_capture(gen, check) -> None:
    _fused_or_skip()
    layout = get_layout("fp8_ds_mla")
    cache = layout.allocate(16, 64, device="cuda")
    kv = torch.zeros(256, 512, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(256, dtype=torch.int64, device="cuda")
    out = torch.zeros(256, 512, dtype=torch.bfloat16, device="cuda")
    layout.write(cache, kv, slots, check=check)  # compile outside the capture
    layout.read(cache, slots, check=check)
    raise_slot_errors("cuda")
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        layout.write(cache, kv, slots, check=check)
        out.copy_(layout.read(cache, slots, check=check))
    for step in range(3):
        new_kv = _varied_kv(256, gen).cuda()
        new_slots = torch.randperm(16 * 64, generator=gen)[:256].cuda()
        new_slots[:3] = -1
        if step == 2:
            new_slots[3] = 16 * 64 + 7  # past the cache: skipped, and reported when checked
        kv.copy_(new_kv)
        slots.copy_(new_slots)
        graph.replay()
        expected = layout.allocate(16, 64, device="cuda")
        expected.copy_(cache)
        layout.write(expected, new_kv, new_slots, backend="torch", check=False)
        assert torch.equal(_bytes(cache), _bytes(expected))
        assert torch.equal(out, layout.read(cache, new_slots, backend="torch", check=False))
    if check:
        with pytest.raises(SlotRangeError, match=f"slots must be below 1024.*the largest {16 * 64 + 7}"):
            raise_slot_errors("cuda")
    assert slot_errors("cuda").count == 0


@pytest.mark.gpu
@pytest.mark.parametrize("launcher", ["cached", "triton"])
@pytest.mark.parametrize("name", CODECS)
def test_small_writes_and_reads_are_byte_exact_through_either_launcher(name, launcher, gen, monkeypatch) -> None:
    """Decode-step sizes (1 row: Triton makes n a constant; 17, 64, 200), each twice: the second
    launch of a specialization goes through the cached launcher, whose key must keep them apart."""
    _fused_or_skip()
    from dsv4sel.kernels import triton_codecs, triton_launch

    monkeypatch.setattr(triton_launch, "STATE", [launcher == "cached"])
    launchers = (triton_codecs._write_ds, triton_codecs._read_ds, triton_codecs._write_rows, triton_codecs._read_rows)
    direct_before = sum(lau.fast for lau in launchers)
    layout = get_layout(name)
    for n in (1, 17, 64, 200, 1, 64):
        fused, ref = (layout.allocate(8, 64, device="cuda") for _ in range(2))
        kv = _varied_kv(n, gen).cuda()
        slots = torch.randint(-1, 8 * 64, (n,), generator=gen).cuda()
        layout.write(fused, kv, slots)  # random slots: duplicates and -1 among them
        layout.write(ref, kv, slots, backend="torch")
        assert torch.equal(_bytes(fused), _bytes(ref)), n
        got = layout.read(fused, slots)
        assert torch.equal(got.view(torch.int16), layout.read(fused, slots, backend="torch").view(torch.int16))
        # a kv view with another row stride and an int32 slot tensor: other specializations
        wide = torch.zeros(n, 520, dtype=torch.bfloat16, device="cuda")
        wide[:, :512] = kv
        fused.zero_()
        uniq = torch.randperm(8 * 64, generator=gen)[:n].int().cuda()
        layout.write(fused, wide[:, :512], uniq, unique=True)
        ref.zero_()
        layout.write(ref, kv, uniq.long(), backend="torch")
        assert torch.equal(_bytes(fused), _bytes(ref)), n
    raise_slot_errors("cuda")
    direct = sum(lau.fast for lau in launchers) - direct_before
    # Repeated specializations must take the direct path (a launch-hook check that always said
    # "hooked" once sent every launch back through Triton), and none may when it is off.
    assert direct > 0 if launcher == "cached" else direct == 0


def test_bad_kv_and_cache_are_rejected() -> None:
    layout = get_layout("fp8_ds_mla")
    cache = layout.allocate(1, 4)
    with pytest.raises(ValueError, match=r"\[n, 512\]"):
        layout.write(cache, torch.ones(1, 576), torch.tensor([0]))
    with pytest.raises(ValueError, match="slots must have shape"):
        layout.write(cache, torch.ones(2, 512), torch.tensor([0]))
    with pytest.raises(ValueError, match="dtype uint8"):
        layout.read(get_layout("bf16_row").allocate(1, 4), torch.tensor([0]))
    with pytest.raises(ValueError, match="page size"):
        layout.read(torch.zeros(1, 1000, dtype=torch.uint8), torch.tensor([0]))
