"""The KV wire contract at SGLang 0.5.23's own prefill/decode handshake, without changing its protocol.

The launcher's decision (:func:`dsv4sel.sglang_plugin.decide`) publishes, beside the class and
the layout, the contract of what SGLang builds (:func:`contract_tag`: the
:meth:`~dsv4sel.dsv4.contract.KVContract.wire` form of ``Selection.contract_for("sglang", ...)``,
with the settings SGLang is told and the environment it reads). :func:`register` then puts three
SGLang ``HookRegistry`` hooks in place (``load_plugins()`` applies them, in every process):

- AFTER ``DeepSeekV4TokenToKVPool.pd_kv_layout`` (:data:`PD_LAYOUT_TARGET`): the PD layout string
  every scheduler publishes (prefill registers it with its bootstrap server; decode keeps its own)
  gets ``;dsv4sel contract kv1-... model=... main.fp8=...``. Decode's own comparison of the two
  strings (``CommonKVManager.try_ensure_parallel_info``, a ``RuntimeError`` "KV layout mismatch")
  then refuses any two sides whose contracts differ, and prints both: the differing field by name,
  or, for a peer without dsv4sel, a string without a contract;
- AROUND ``CommonKVBootstrapServer._handle_route_put`` (:data:`REGISTER_TARGET`): a prefill rank
  whose layout string (hence contract) differs from the first rank's is refused with HTTP 400,
  as SGLang refuses ranks whose DSpark layouts differ, and the refusal, naming both ranks and the
  differing fields, is logged as an ERROR by the bootstrap server (SGLang would keep the first
  rank's layout and hand it to decode for every rank);
- AROUND ``CommonKVBootstrapServer._handle_route_get`` (:data:`ROUTE_GET_TARGET`): after such a
  refusal decode's queries get that text (HTTP 400, which decode logs) instead of "not fully
  registered yet".

With no published decision (another model, the plugin not asked for in the launcher, an NPU) the
layout string is SGLang's own; the bootstrap check still compares ranks, which then all agree.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ..dsv4.contract import WIRE_PREFIX, wire_fields
from ..engine.text import escape
from . import scheduler

logger = logging.getLogger(__name__)
PD_LAYOUT_TARGET = "sglang.srt.mem_cache.deepseek_v4_memory_pool.DeepSeekV4TokenToKVPool.pd_kv_layout"
REGISTER_TARGET = "sglang.srt.disaggregation.common.conn.CommonKVBootstrapServer._handle_route_put"
ROUTE_GET_TARGET = "sglang.srt.disaggregation.common.conn.CommonKVBootstrapServer._handle_route_get"
#: between SGLang's own layout and the contract
SEPARATOR = ";"
#: attributes the hooks keep on SGLang's bootstrap server: the first registrant, the refusal
_FIRST, _REFUSED = "_dsv4sel_first_rank", "_dsv4sel_refusal"
#: SGLang 0.5.23's environment variables the contract reads (``dsv4sel.dsv4.contract``)
CONTRACT_ENV = ("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "SGLANG_DSV4_UNIFIED_KV_FP8")


def contract_tag(decision, version: str, env: Mapping[str, str]) -> str:
    """The wire form of the contract SGLang ``version`` builds for ``decision`` (a
    :class:`~dsv4sel.translation.HostDecision`), with ``env`` as :func:`engine_env` reads it."""
    return decision.selection.contract_for("sglang", version, decision.settings, env).wire()


def engine_env() -> dict[str, str]:
    """The contract's SGLang variables as SGLang itself reads them (its ``envs``: the compressed
    layout lower-cased, the unified fp8 switch a boolean, here ``0`` or ``1``)."""
    from sglang.srt.environ import envs

    return {"SGLANG_DSV4_COMPRESSED_KV_LAYOUT": str(envs.SGLANG_DSV4_COMPRESSED_KV_LAYOUT.get()).lower(),
            "SGLANG_DSV4_UNIFIED_KV_FP8": "1" if envs.SGLANG_DSV4_UNIFIED_KV_FP8.get() else "0"}


def tag_pd_layout(result, *args, **kwargs) -> str | None:
    """AFTER ``pd_kv_layout()``: SGLang's layout string and the published contract."""
    decided = scheduler.published()
    if decided is None or not isinstance(result, str):
        return None
    return f"{result}{SEPARATOR}{decided['contract']}"


def _rank(data: Mapping[str, Any]) -> str:
    """A registering prefill rank as SGLang's own log names it, and its address."""
    dp = data.get("attn_dp_rank") if data.get("system_dp_size") == 1 else data.get("system_dp_rank")
    return (f"DP{dp} CP{data.get('attn_cp_rank')} TP{data.get('attn_tp_rank')} PP{data.get('pp_rank')} "
            f"at {data.get('rank_ip')}:{data.get('rank_port')}")


def _differences(layout: Any, who: str, first: Any, first_who: str) -> str:
    """What differs between two ranks' layout strings, in the contract's field names."""
    mine = wire_fields(layout) if isinstance(layout, str) else None
    theirs = wire_fields(first) if isinstance(first, str) else None
    if mine is None or theirs is None:
        lacking = [w for w, fields in ((who, mine), (first_who, theirs)) if fields is None]
        return (f"{' and '.join(lacking)} {'runs' if len(lacking) == 1 else 'run'} without dsv4sel (no "
                f"'{WIRE_PREFIX.strip()}' in the layout), so SGLang decided alone there. ")
    fields = [f"{name} {mine.get(name)} against the first rank's {theirs.get(name)}"
              for name in dict.fromkeys([*theirs, *mine]) if name != "fingerprint" and mine.get(name) != theirs.get(name)]
    return f"They differ in {'; '.join(fields) or 'their fingerprint only'}. "


def rank_refusal(server: Any, data: Mapping[str, Any]) -> str | None:
    """Why the prefill rank registering ``data`` is refused (its layout string is not the first
    registrant's), or None; the first registrant is remembered on ``server``."""
    who, layout = _rank(data), data.get("kv_layout")
    first, first_who = vars(server).setdefault(_FIRST, (layout, who))
    if layout == first:
        return None
    return escape(
        f"dsv4sel: prefill rank {who} registers kv_layout={layout}, but the first prefill rank ({first_who}) "
        f"registered kv_layout={first}: the prefill ranks do not publish one KV layout, and SGLang's bootstrap "
        f"server would give decode the first rank's for every rank. "
        f"{_differences(layout, who, first, first_who)}Launch every prefill rank with the same "
        "--dsv4-attn-backend, --kv-cache-dtype and SGLANG_DSV4_* variables, on GPUs that decide one KV contract, "
        "with dsv4sel on every node (`dsv4sel fleet DEPLOYMENT.yaml` checks a deployment before launch).")


async def check_registration(original, server, request):
    """AROUND the bootstrap server's ``PUT /route``: a rank :func:`rank_refusal` refuses gets HTTP
    400 and is not registered; any other request is SGLang's own."""
    try:
        data = await request.json()
    except ValueError:
        data = None  # not JSON: SGLang's own handler answers it
    refusal = rank_refusal(server, data) if isinstance(data, dict) else None
    if refusal is None:
        return await original(server, request)
    from aiohttp import web

    logger.error("%s", refusal)
    vars(server)[_REFUSED] = refusal
    return web.Response(text=refusal, status=400)


async def answer_refusal(original, server, request):
    """AROUND the bootstrap server's ``GET /route``: once a rank was refused, decode's queries get
    the refusal (HTTP 400, which decode logs) instead of "not fully registered yet"."""
    refusal = vars(server).get(_REFUSED)
    if refusal is None:
        return await original(server, request)
    from aiohttp import web

    return web.Response(text=refusal, status=400)


def register() -> None:
    """Register the three hooks with SGLang's ``HookRegistry`` (``load_plugins()`` applies them)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(PD_LAYOUT_TARGET, tag_pd_layout, HookType.AFTER)
    HookRegistry.register(REGISTER_TARGET, check_registration, HookType.AROUND)
    HookRegistry.register(ROUTE_GET_TARGET, answer_refusal, HookType.AROUND)
