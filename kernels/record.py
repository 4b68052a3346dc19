"""The numbers of DeepSeek-V4's latent KV row and of the fp8_ds_mla record, in one place.

:mod:`~dsv4sel.kernels.layouts` (sizes), :mod:`~dsv4sel.kernels.torch_codecs` and
:mod:`~dsv4sel.kernels.codec_support` read them from here; the Triton kernels spell them out
as literals (576, 448, 8), which the codec tests hold to these. No imports.
"""

HEAD_DIM = 512  # latent KV row: key and value at once
NOPE_DIM = 448
ROPE_DIM = 64
TILE_SIZE = 64  # NoPE values per UE8M0 scale
NUM_TILES = NOPE_DIM // TILE_SIZE  # 7
FP8_E4M3_MAX = 448.0
UE8M0_SCALE_FLOOR = 1e-4  # smallest scale before rounding up: all-zero tiles get 2**-13
UE8M0_BIAS = 127
TOKEN_DATA_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576: fp8 NoPE + bf16 RoPE
SCALE_BYTES = NUM_TILES + 1  # 7 exponents + 1 pad byte

#: Every KV-cache record the layouts store, by layout name, as plain data that a reader may take
#: without importing the layouts (and torch's neighbours): the KV wire contract
#: (``dsv4sel.dsv4.contract``) reads it. Each entry is ``(bytes_per_token, alignment, encoding,
#: arrangement, has_fp8)``: the content bytes of one token's record in one layer, the page padding
#: unit, what the bytes hold, how a page orders them, and whether the record holds fp8 (e4m3)
#: values, whose flavour (OCP e4m3fn or FNUZ) the platform decides. ``tests/kernels`` holds the
#: sizes to :data:`~dsv4sel.kernels.layouts.LAYOUTS`. An arrangement of ``token-interleaved`` is
#: each token's data bytes followed by its scale bytes, as vLLM 0.33 writes V4.1's records
#: (``vllm/models/deepseek_v41/attention.py:131-136``, ``:523-525``).
RECORD_FIELDS = ("bytes_per_token", "alignment", "encoding", "arrangement", "has_fp8")
RECORDS = {
    "fp8_ds_mla": (
        TOKEN_DATA_BYTES + SCALE_BYTES, TOKEN_DATA_BYTES,
        f"{NOPE_DIM} fp8 e4m3 NoPE + {ROPE_DIM} bf16 RoPE, {NUM_TILES} UE8M0 scales (one per {TILE_SIZE} NoPE "
        "values) + 1 pad byte",
        "block-split", True),
    "fp8_ds_mla_v41": (
        528, 528, f"{HEAD_DIM} fp8 e4m3 (RoPE included), 16 UE8M0 scales (one per 32 values)",
        "token-interleaved", True),
    "nvfp4_ds_mla": (
        288, 288, f"{HEAD_DIM} fp4 e2m1 (256 bytes), 32 fp8 e4m3 scales (one per 16 values)",
        "token-interleaved", True),
    "bf16_row": (2 * HEAD_DIM, HEAD_DIM, f"{HEAD_DIM} bf16", "row", False),
    "fp8_e4m3_row": (HEAD_DIM, HEAD_DIM, f"{HEAD_DIM} fp8 e4m3, one per-tensor scale outside the cache", "row", True),
}
