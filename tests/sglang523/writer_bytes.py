"""SGLang 0.5.23's own V4-record writer against dsv4sel's codec, byte for byte (run in .venv-sglang).

SGLang's ROCm writer of the 584-byte V4 record is a Triton kernel
(``sglang.kernels.ops.kvcache.triton_store_cache.triton_fused_store_flashmla``, what
``fused_store_cache`` calls on HIP); Triton's interpreter (``TRITON_INTERPRET=1``) runs it on
CPU unchanged. This writes one 256-token page with it (stubbed as gfx950, whose fp8 is e4m3fn)
and the same tokens with dsv4sel's ``fp8_ds_mla`` codec, and prints JSON comparing the bytes:
the geometry (which bytes each token's data, RoPE and scales occupy; everything else zero), the
bf16 RoPE bytes, and the UE8M0 scale bytes per 64-value tile, split at amax = 448 x 1e-4. SGLang
floors the tile amax (at 1e-8 in this writer; its CUDA writer at 1e-4), dsv4sel floors the scale
at 1e-4 as FlashMLA's quantizer does: at or above that amax the scales are equal, below it
SGLang's exponent is ceil(log2(max(amax, 1e-8) / 448)). The fp8 data bytes are not compared: on
CPU they are the Triton interpreter's float32 -> e4m3 cast, which is not the GPU's (it rounds ties
away from zero and loses the carry into the exponent), so they say nothing about SGLang's bytes.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stubs

PAGE, TOKENS, NOPE, TILE = 256, 96, 448, 64


def _untouched(page, slots) -> bool:
    """Every byte outside the written tokens' data and scale rows is still zero."""
    rest = page.clone()
    rest[0, : PAGE * 576].view(PAGE, 576)[slots] = 0
    rest[0, PAGE * 576: PAGE * 584].view(PAGE, 8)[slots] = 0
    return not rest.any()


def main() -> int:
    stubs.install("rocm", (9, 5), "gfx950")
    import torch
    from dsv4sel.kernels.layouts import LAYOUTS
    from sglang.kernels.ops.kvcache.triton_store_cache import (
        _FP8_DTYPE,
        triton_fused_store_flashmla,
    )
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import KVLayout

    ours = LAYOUTS["fp8_ds_mla"]
    page_bytes = KVLayout.V4.page_bytes(PAGE)
    assert page_bytes == ours.page_bytes(PAGE) == 149_760
    g = torch.Generator().manual_seed(20)
    kv = torch.randn(TOKENS, 512, generator=g)
    # tile magnitudes from 1e-7 to 10: a third of the tiles below 0.0448, where the floors differ
    magnitudes = torch.logspace(-7, 1, TOKENS * 7)[torch.randperm(TOKENS * 7, generator=g)].view(TOKENS, 7, 1)
    kv[:, :NOPE] = (kv[:, :NOPE].reshape(TOKENS, 7, TILE) * magnitudes).reshape(TOKENS, NOPE)
    kv[5:8, :NOPE] = 0.0  # all-zero tiles
    kv = kv.to(torch.bfloat16)
    slots = torch.randperm(PAGE, generator=g)[:TOKENS].to(torch.int64)

    theirs = torch.zeros(1, page_bytes, dtype=torch.uint8)
    triton_fused_store_flashmla(kv, theirs, slots.to(torch.int32), PAGE)
    mine = torch.zeros(1, page_bytes, dtype=torch.uint8)
    ours.write(mine, kv, slots)

    amax = kv[:, :NOPE].float().view(TOKENS, 7, TILE).abs().amax(-1)
    big = amax >= 448 * 1e-4
    data_t = theirs[0, : PAGE * 576].view(PAGE, 576)[slots]
    data_m = mine[0, : PAGE * 576].view(PAGE, 576)[slots]
    sc_t = theirs[0, PAGE * 576: PAGE * 584].view(PAGE, 8)[slots]
    sc_m = mine[0, PAGE * 576: PAGE * 584].view(PAGE, 8)[slots]
    tile_data_same = (data_t[:, :NOPE].view(TOKENS, 7, TILE) == data_m[:, :NOPE].view(TOKENS, 7, TILE)).all(-1)
    scale_same = sc_t[:, :7] == sc_m[:, :7]
    # SGLang's exponent where dsv4sel's floor holds: ceil(log2(max(amax, 1e-8) / 448))
    want_small = torch.ceil(torch.log2(torch.clamp_min(amax, 1e-8) / 448)).to(torch.int32) + 127
    # both readers decode SGLang's page: dsv4sel's reader gives back the tokens SGLang stored
    back = ours.read(theirs, slots).float()
    out = {
        "fp8": str(_FP8_DTYPE).replace("torch.", ""), "tokens": TOKENS, "tiles": TOKENS * 7,
        "tiles_amax_at_least_0.0448": int(big.sum()),
        "big_tiles_same_scale": int(scale_same[big].sum()),
        # the fp8 data bytes are the interpreter's float32 -> e4m3 cast, not the GPU's: it rounds
        # ties away from zero and loses the carry into the exponent (31.5 -> 16); counted, not compared
        "tiles_same_data_bytes": int(tile_data_same.sum()),
        "small_tiles_same_scale": int(scale_same[~big].sum()),
        "small_tiles_sglang_exponent_is_amax_floored": int((sc_t[:, :7].to(torch.int32) == want_small)[~big].sum()),
        "rope_bytes_same": bool((data_t[:, NOPE:] == data_m[:, NOPE:]).all()),
        "scale_pad_bytes_same": bool((sc_t[:, 7] == sc_m[:, 7]).all()),
        "untouched_bytes_zero": bool(_untouched(theirs, slots) and _untouched(mine, slots)),
        "dsv4sel_reads_back_sglang_rope": bool((back[:, NOPE:] == kv[:, NOPE:].float()).all()),
    }
    import bytes as sizes  # SGLang's KVLayout sizes next to dsv4sel's (platform-independent)

    out["sizes"] = sizes.sizes()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
