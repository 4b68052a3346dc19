"""SGLang 0.5.23's own PD handshake checks, fed by sides with and without the dsv4sel plugin (runs in
.venv-sglang only, one process stubbed as a CUDA GPU).

Usage: ``python sglang_plugin_handshake.py JOB.json`` with ``{"sides": [SIDE], "pairs": [{"id", "prefill",
"decode"}], "ranks": [{"id", "workers": [side id, ...]}]}``, a side ``{"id", "plugin", "point"`` (the SGLang
input the plugin decides: its host space's point) ``, "env"`` (the side's SGLANG_DSV4_* variables)
``, "told"`` (the settings SGLang builds: the decision's for a side without the plugin) ``, "model"}``.

The plugin is loaded as SGLang loads it (``SGLANG_PLUGINS=dsv4sel``, SGLang's ``load_plugins()``: its
entry point, then SGLang's ``HookRegistry`` applies its hooks). For each side, in that side's environment,
the launcher's step after its decision runs: the plugin's ``publish`` of the translation's decision (the
contract computed from SGLang's own ``envs``), or, for a side without dsv4sel, no published decision. Then
SGLang's ``DeepSeekV4TokenToKVPool.pd_kv_layout`` (hooked) gives the side's PD layout string, on a pool
standing in for the one the side builds (its layout, compress ratios and compressed option; the string is
built by SGLang's own method and ``resolve_compressed_kv_layout``).

- a pair: decode's ``CommonKVManager.try_ensure_parallel_info`` on prefill's published info
  (:mod:`sglang_handshake`), ``passes`` or the error it raises;
- ranks: the prefill ranks register, in order, with SGLang's own ``CommonKVBootstrapServer`` (its real
  ``__init__``, no server thread): each ``PUT /route`` answer's status and text, then the answer to
  decode's first ``GET /route``.

Prints ``{"sides": {id: {"kv_layout", "published"}}, "pairs": {...}, "ranks": {...}}`` as JSON.
"""
from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "sglang523"))
sys.path.insert(0, str(HERE))

import stubs  # noqa: E402

RATIOS = {"deepseek_v4": (0, 4, 128), "deepseek_v4_1": (0, 1, 2)}
ENV = ("SGLANG_DSV4_KV_LAYOUT", "SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "SGLANG_DSV4_UNIFIED_KV_FP8",
       "SGLANG_HACK_FLASHMLA_BACKEND")


def _load_plugin() -> None:
    from sglang.srt.plugins import load_plugins

    os.environ["SGLANG_PLUGINS"] = "dsv4sel"
    load_plugins()


def _side(side: dict) -> dict:
    from sglang.kernels.ops.attention.dsv4.kv_layout import KVLayout
    from sglang.srt.mem_cache.deepseek_v4_memory_pool import DeepSeekV4TokenToKVPool

    import dsv4sel.sglang_plugin as plugin
    from dsv4sel import SelectionError
    from dsv4sel.sglang_plugin import scheduler
    from dsv4sel.sglang_plugin.translation import decide

    for name in ENV:
        os.environ.pop(name, None)
    os.environ.update(side["env"])
    told = side["told"]
    if side["plugin"]:
        try:
            decision = decide(side["point"])
        except SelectionError as exc:  # the plugin refuses the side when it decides: the launcher stops
            return {"refused": str(exc)}
        plugin.publish(decision)
        told = decision.settings
    else:
        scheduler.forget()
    option = os.environ.get("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "auto").lower()
    pool = types.SimpleNamespace(uniform_fp8=told.get("kv_pool") == "uniform_fp8",
                                 kv_layout=KVLayout(told.get("kv_layout", "v4")),
                                 compressed_kv_layout_option=None if option == "auto" else option,
                                 compression_ratios=RATIOS[side["model"]])
    pool.compressed_kv_layout = functools.partial(DeepSeekV4TokenToKVPool.compressed_kv_layout, pool)
    return {"kv_layout": DeepSeekV4TokenToKVPool.pd_kv_layout(pool), "published": scheduler.published(),
            "page_size": told.get("page_size", 256), "kv_cache_dtype": told.get("kv_cache_dtype", "fp8_e4m3")}


def _pair(pair: dict, sides: dict) -> dict:
    from sglang.srt.disaggregation.common import conn

    from sglang_handshake import PastTheChecks, _DecodeManager

    prefill, decode = sides[pair["prefill"]], sides[pair["decode"]]
    published = {"attn_tp_size": 1, "attn_cp_size": 1, "dp_size": 1, "pp_size": 1, "page_size": prefill["page_size"],
                 "kv_cache_dtype": prefill["kv_cache_dtype"], "follow_bootstrap_room": True,
                 "kv_layout": prefill["kv_layout"]}

    class _Answer:
        status_code = 200

        @staticmethod
        def json():
            return published

    conn.requests.get = lambda *a, **k: _Answer()
    receiver = _DecodeManager(decode, decode["kv_layout"])
    try:
        conn.CommonKVManager.try_ensure_parallel_info(receiver, "prefill:8998")
    except PastTheChecks:
        return {"verdict": "passes"}
    except RuntimeError as exc:
        return {"verdict": f"RuntimeError: {exc}"}
    return {"verdict": "passes"}


class _Request:
    """What the bootstrap server's handlers read of an aiohttp request."""

    def __init__(self, method: str, body: dict | None = None, query: dict | None = None):
        self.method, self._body, self.query = method, body, query or {}

    async def json(self):
        return self._body


def _registration(rank: int, side: dict) -> dict:
    return {"attn_tp_size": 2, "attn_tp_rank": rank, "attn_cp_size": 1, "attn_cp_rank": 0, "attn_dp_size": 1,
            "attn_dp_rank": 0, "pp_size": 1, "pp_rank": 0, "system_dp_size": 1, "system_dp_rank": 0,
            "rank_ip": f"10.0.0.{rank + 1}", "rank_port": 17000 + rank, "page_size": side["page_size"],
            "kv_cache_dtype": side["kv_cache_dtype"], "kv_layout": side["kv_layout"]}


def _ranks(job: dict, sides: dict) -> dict:
    from sglang.srt.disaggregation.common.conn import CommonKVBootstrapServer

    class Quiet(CommonKVBootstrapServer):
        def run(self):  # SGLang's own __init__, without its HTTP server thread
            pass

    async def go() -> dict:
        server = Quiet("127.0.0.1", 0)
        registered = []
        for rank, name in enumerate(job["workers"]):
            answer = await server._handle_route_put(_Request("PUT", _registration(rank, sides[name])))
            registered.append({"status": answer.status, "text": answer.text})
        query = {"prefill_dp_rank": "-1", "prefill_cp_rank": "-1", "target_tp_rank": "-1", "target_pp_rank": "-1"}
        answer = await server._handle_route_get(_Request("GET", query=query))
        return {"registered": registered, "route": {"status": answer.status, "text": answer.text},
                "kept_kv_layout": server.kv_layout}

    return asyncio.run(go())


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    stubs.install("cuda", (9, 0))
    _load_plugin()
    from sglang.srt.plugins.hook_registry import HookRegistry

    from dsv4sel.sglang_plugin import handshake

    ours = (handshake.PD_LAYOUT_TARGET, handshake.REGISTER_TARGET, handshake.ROUTE_GET_TARGET)
    sides = {side["id"]: _side(side) for side in job["sides"]}
    print(json.dumps({"hooked": sorted(t for t in HookRegistry._patched if t in ours), "sides": sides,
                      "pairs": {p["id"]: _pair(p, sides) for p in job["pairs"]},
                      "ranks": {r["id"]: _ranks(r, sides) for r in job["ranks"]}}))


if __name__ == "__main__":
    main()
