"""SGLang 0.5.23's own prefill/decode handshake, fed with what each side publishes (runs in .venv-sglang only).

Usage: ``python sglang_handshake.py PAIRS.json`` with ``{"platform": P, "arch": A, "pairs": [{"id",
"prefill": SIDE, "decode": SIDE}]}``, a side ``{"page_size", "kv_cache_dtype", "kv_layout", "kv_pool",
"compressed": SGLANG_DSV4_COMPRESSED_KV_LAYOUT, "model"}`` (what it is told: the settings its decision
gives). The process is stubbed as one GPU of the platform (:mod:`tests/sglang523/stubs`). For each pair:

- each side's ``kv_layout`` as SGLang publishes it for PD, built by SGLang's own code: ``KVLayout``,
  ``resolve_compressed_kv_layout`` per compress ratio of the model (DeepSeek-V4: 4 and 128; V4.1: 1 and
  2), joined as ``DeepSeekV4TokenToKVPool.pd_kv_layout`` joins them (``uniform_fp8`` for TRT-LLM's pool);
- decode's check of prefill's info: SGLang's own ``CommonKVManager.try_ensure_parallel_info``, with
  prefill's bootstrap answer in place of the HTTP request and decode's fields on a stand-in manager;
  ``"passes"`` once it reads past its checks, else the error it raises.

It also prints the platform's DeepSeek-V4 cache fp8 dtype as SGLang's HIP backend reads it
(``hip_flash_mla.FP8_DTYPE``; on CUDA SGLang's e4m3fn). Prints JSON.
"""
from __future__ import annotations

import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "sglang523"))

import stubs  # noqa: E402

RATIOS = {"deepseek_v4": (4, 128), "deepseek_v4_1": (1, 2)}


class PastTheChecks(Exception):
    """The receiver read a field its checks do not: every check passed."""


class _DecodeManager:
    """Decode's KV manager as the checks read it; any other attribute means the checks are behind it."""

    def __init__(self, side: dict, kv_layout: str):
        self.prefill_info_table: dict = {}
        self.kv_args = types.SimpleNamespace(page_size=side["page_size"], state_types=())
        self.kv_cache_dtype_str = side["kv_cache_dtype"]
        self.attn_tp_size = 1
        self.kv_layout = kv_layout
        self.dsv41_spec_layout = None

    def __getattr__(self, name):
        raise PastTheChecks(name)


def pd_kv_layout(side: dict) -> str:
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import resolve_compressed_kv_layout

    if side.get("kv_pool") == "uniform_fp8":
        return KVLayout.UNIFORM_FP8.value
    main = KVLayout(side["kv_layout"])
    option = None if side.get("compressed", "auto") == "auto" else side["compressed"]
    compressed = [f"c{r}:{resolve_compressed_kv_layout(main, r, option).value}" for r in RATIOS[side["model"]]]
    return ",".join([main.value, *compressed])


def handshake(prefill: dict, decode: dict) -> dict:
    from sglang.srt.disaggregation.common import conn

    published = {"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": prefill["page_size"],
                 "kv_cache_dtype": prefill["kv_cache_dtype"], "follow_bootstrap_room": True,
                 "kv_layout": pd_kv_layout(prefill)}

    class _Answer:
        status_code = 200

        @staticmethod
        def json():
            return published

    conn.requests.get = lambda *a, **k: _Answer()
    receiver = _DecodeManager(decode, pd_kv_layout(decode))
    try:
        conn.CommonKVManager.try_ensure_parallel_info(receiver, "prefill:8998")
    except PastTheChecks:
        verdict = "passes"
    except RuntimeError as exc:
        verdict = f"RuntimeError: {exc}"
    else:
        verdict = "passes"
    return {"prefill_layout": published["kv_layout"], "decode_layout": receiver.kv_layout, "verdict": verdict}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    capability = tuple(job.get("capability", (9, 4) if job["platform"] == "rocm" else (9, 0)))
    stubs.install(job["platform"], capability, job.get("arch"))
    out: dict = {"pairs": {p["id"]: handshake(p["prefill"], p["decode"]) for p in job["pairs"]}}
    if job["platform"] == "rocm":
        from sglang.srt.layers.attention import hip_flash_mla

        out["fp8_dtype"] = str(hip_flash_mla.FP8_DTYPE).removeprefix("torch.")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
