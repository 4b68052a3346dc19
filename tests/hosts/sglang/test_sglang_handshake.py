"""The SGLang plugin's handshake hooks on their own (no SGLang needed): the contract SGLang's PD layout
string carries, and the bootstrap server's refusal of prefill ranks that differ
(:mod:`dsv4sel.sglang_plugin.handshake`). The same hooks in SGLang's own code: ``tests/hosts/fleet/test_fleet_engines.py``."""
from __future__ import annotations

import types

import pytest

from dsv4sel.dsv4.contract import wire_fields
from dsv4sel.sglang_plugin import handshake, scheduler
from dsv4sel.sglang_plugin.translation import decide

POINT = {"model": "deepseek_v4", "platform": "cuda", "capability": "9.0", "dsv4_attn_backend": "auto",
         "kv_cache_dtype": "auto", "kv_layout_env": "unset", "deployment": "pd"}
ENV = {"SGLANG_DSV4_COMPRESSED_KV_LAYOUT": "auto", "SGLANG_DSV4_UNIFIED_KV_FP8": "0"}


def _tag(**point) -> str:
    return handshake.contract_tag(decide({**POINT, **point}), "0.5.23", ENV)


def test_the_pd_layout_carries_the_published_contract_and_is_sglang_s_own_without_one(monkeypatch):
    monkeypatch.delenv(scheduler.DECISION_ENV, raising=False)
    assert handshake.tag_pd_layout("v4,c4:v4,c128:v4") is None  # no decision: SGLang's own string
    tag = _tag()
    scheduler.publish("a:B", {"kv_layout": "v4"}, "r", "rules/r.yaml:1", tag)
    assert handshake.tag_pd_layout("v4,c4:v4,c128:v4") == f"v4,c4:v4,c128:v4;{tag}"
    fields = wire_fields(tag)
    assert fields is not None and (fields["engine"], fields["release"], fields["main.fp8"]) == ("sglang", "0.5.23", "ocp")
    # the same layout string on gfx942, where SGLang reads the cache as e4m3fnuz: another contract
    assert wire_fields(_tag(platform="rocm", capability="gfx942", hip_kernel="auto"))["main.fp8"] == "fnuz"


def _rank(tp: int, kv_layout) -> dict:
    return {"attn_tp_rank": tp, "attn_cp_rank": 0, "attn_dp_rank": 0, "pp_rank": 0, "system_dp_size": 1,
            "rank_ip": "10.0.0.1", "rank_port": 17000 + tp, "kv_layout": kv_layout}


def test_a_prefill_rank_is_refused_when_its_layout_is_not_the_first_rank_s():
    server = types.SimpleNamespace()
    hopper, gfx942 = f"v4,c4:v4,c128:v4;{_tag()}", f"v4,c4:v4,c128:v4;{_tag(platform='rocm', capability='gfx942', hip_kernel='auto')}"
    assert handshake.rank_refusal(server, _rank(0, hopper)) is None
    assert handshake.rank_refusal(server, _rank(1, hopper)) is None
    refusal = handshake.rank_refusal(server, _rank(2, gfx942))
    assert refusal is not None
    assert refusal.startswith("dsv4sel: prefill rank DP0 CP0 TP2 PP0 at 10.0.0.1:17002 registers kv_layout=")
    assert "but the first prefill rank (DP0 CP0 TP0 PP0 at 10.0.0.1:17000) registered" in refusal
    assert "They differ in main.fp8 fnuz against the first rank's ocp; compressed.fp8 fnuz against the first " \
           "rank's ocp." in refusal


@pytest.mark.parametrize("first,then,lacking", [
    ("with", "without", "DP0 CP0 TP1 PP0 at 10.0.0.1:17001 runs without dsv4sel"),
    ("without", "with", "DP0 CP0 TP0 PP0 at 10.0.0.1:17000 runs without dsv4sel"),
])
def test_a_prefill_rank_without_dsv4sel_is_refused_saying_which(first, then, lacking):
    layouts = {"with": f"v4,c4:v4,c128:v4;{_tag()}", "without": "v4,c4:v4,c128:v4"}
    server = types.SimpleNamespace()
    assert handshake.rank_refusal(server, _rank(0, layouts[first])) is None
    refusal = handshake.rank_refusal(server, _rank(1, layouts[then]))
    assert refusal is not None and f"{lacking} (no 'dsv4sel contract' in the layout)" in refusal
