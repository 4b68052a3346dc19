"""SGLang 0.5.23's DeepSeek-V4 KV record geometry next to dsv4sel's layouts (run in .venv-sglang).

Prints JSON: for each SGLang ``KVLayout`` that has a dsv4sel counterpart, SGLang's bytes per token
and page bytes (its own ``KVLayout.bytes_per_token`` / ``page_bytes``) and dsv4sel's
(``dsv4sel.kernels.layouts.LAYOUTS``), for 64-, 128- and 256-token pages. Sizes only; the suite
calls :func:`sizes` from ``writer_bytes.py``, which compares the bytes SGLang's ROCm V4 writer
puts in a page.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stubs  # noqa: E402

#: SGLang's KVLayout -> dsv4sel's layout with the same record (docs/sglang.md, "The bytes")
COUNTERPART = {"V4": "fp8_ds_mla", "V41": "fp8_ds_mla_v41", "V41_NEW": "fp8_ds_mla_v41",
               "V41_FP4": "nvfp4_ds_mla", "UNIFORM_FP8": "fp8_e4m3_row"}


def sizes() -> dict:
    """SGLang's and dsv4sel's sizes per SGLang KVLayout (SGLang already imported and stubbed)."""
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import KVLayout

    from dsv4sel.kernels.layouts import LAYOUTS

    out = {}
    for name, ours in COUNTERPART.items():
        theirs, mine = KVLayout[name], LAYOUTS[ours]
        out[name] = {"dsv4sel": ours,
                     "sglang": [theirs.bytes_per_token] + [theirs.page_bytes(n) for n in (64, 128, 256)],
                     "ours": [mine.bytes_per_token] + [mine.page_bytes(n) for n in (64, 128, 256)]}
    return out


def main() -> int:
    stubs.install("cuda", (10, 0))
    print(json.dumps(sizes()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
