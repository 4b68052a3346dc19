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
