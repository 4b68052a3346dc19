"""A process's role under prefill/decode disaggregation is an input a rule pack may declare
(dsv4sel/dsv4/roles.py): the compiler holds its declaration to the values every host sends,
a rule set that declares it decides by it, and one that does not decides as before.
``tests/packs/pd_roles`` is such a pack (a site's policy for its PD pools); the engines' own
readings of the role are tested against the real vLLM and SGLang in tests/hosts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.dsv4 import roles
from dsv4sel.errors import RuleError
from dsv4sel.tools.deployment import DeploymentError, load_deployment
from dsv4sel.tools.fleet import decide_fleet

PACK = Path(__file__).resolve().parents[1] / "packs" / "pd_roles" / "rules"
B200_V4 = dict(platform="cuda", capability="10.0", model="deepseek_v4")


@pytest.fixture(scope="module")
def pack_rules():
    return dsv4sel.load_rules(extra=[str(PACK)])


@pytest.mark.parametrize("role,backend,layout", [
    ("none", "FLASHMLA_SPARSE_DSV4", "fp8_ds_mla"), ("prefill", "FLASHINFER_MLA_SPARSE_DSV4", "bf16_row"),
    ("decode", "FLASHINFER_MLA_SPARSE_DSV4", "bf16_row"), ("both", "FLASHINFER_MLA_SPARSE_DSV4", "bf16_row")])
def test_a_pack_that_declares_the_role_decides_by_it(pack_rules, role, backend, layout):
    sel = pack_rules.select(**B200_V4, extra={"disaggregation": role})
    assert (sel.backend, sel.layout) == (backend, layout)
    assert sel.path[0].id == ("pd-v4-sm100-flashinfer" if role != "none" else "default-cuda-sm9x-sm10x")


def test_a_query_that_does_not_pass_the_role_is_decided_outside_disaggregation(pack_rules):
    assert pack_rules.select(**B200_V4).backend == "FLASHMLA_SPARSE_DSV4"


def test_the_shipped_rules_do_not_read_the_role_so_both_pools_of_one_config_decide_alike():
    rules = dsv4sel.default_rules()
    assert roles.INPUT not in rules.plain_inputs
    query = {"extra": {"mega_attn": "available"}}
    assert roles.with_role(dict(query), rules.plain_inputs, "decode") == query


def test_hosts_give_the_role_only_to_a_rule_set_that_declares_it(pack_rules):
    assert roles.with_role({"extra": {}}, pack_rules.plain_inputs, "decode") == {"extra": {"disaggregation": "decode"}}
    assert roles.with_role({"extra": {}}, pack_rules.plain_inputs, None) == {"extra": {"disaggregation": "none"}}


@pytest.mark.parametrize("declaration", [
    "values: [none, prefill, decode]\n    default: none",  # a role a host sends is missing
    "values: [none, prefill, decode, both, mixed]\n    default: none",  # a role no host sends
    "values: [none, prefill, decode, both]\n    default: prefill",
    "by: model\n    default: none\n    values: {deepseek_v4: [none, prefill, decode, both], deepseek_v4_1: [none]}",
], ids=["missing", "extra", "default", "scoped"])
def test_a_role_declared_otherwise_than_the_hosts_send_it_is_one_located_error(tmp_path, declaration):
    (tmp_path / "vocabulary.yaml").write_text(f"kind: vocabulary\ninputs:\n  disaggregation:\n    {declaration}\n")
    with pytest.raises(RuleError) as caught:
        dsv4sel.load_rules(extra=[str(tmp_path)])
    problems = [p for p in caught.value.problems if "disaggregation" in p.message]
    assert [(p.code, Path(p.file).name, p.line) for p in problems] == [("DSV305", "vocabulary.yaml", 3)], \
        caught.value.problems
    assert "declare it with `values: [none, prefill, decode, both]` and `default: none`" in problems[0].message


# ------------------------------------------------------------------ dsv4sel fleet

def _deployment(tmp_path, prefill_role: str | None, decode_role: str | None, engine: str = "vllm") -> Path:
    version = "0.33.0" if engine == "vllm" else "0.5.23"

    def side(role):
        text = f"{{engine: {engine}, version: \"{version}\", platform: cuda, capability: \"10.0\""
        return text + (f", disaggregation: {role}}}" if role else "}")
    path = tmp_path / "pools.yaml"
    path.write_text(f"model: deepseek_v4\nsides:\n  prefill: {side(prefill_role)}\n  decode: {side(decode_role)}\n")
    return path


def test_fleet_decides_each_side_by_its_role(tmp_path, pack_rules):
    report = decide_fleet(load_deployment(str(_deployment(tmp_path, "prefill", "decode"))), pack_rules)
    assert report.compatible and [s.outcome.selection.backend for s in report.sides] == [
        "FLASHINFER_MLA_SPARSE_DSV4"] * 2
    assert report.sides[0].outcome.notes == ()  # the role was read: no "decides nothing" note


def test_fleet_finds_a_pool_whose_role_was_left_out(tmp_path, pack_rules):
    # the decode side forgot its role: it keeps FlashMLA's 584-byte record, prefill writes bf16 rows
    report = decide_fleet(load_deployment(str(_deployment(tmp_path, "prefill", None))), pack_rules)
    assert not report.compatible
    assert {d.field: dict(d.values) for d in report.differences}["main.record"] == {
        "prefill": "bf16_row", "decode": "fp8_ds_mla"}
    assert json.loads(json.dumps(report.as_dict()))["sides"]["prefill"]["disaggregation"] == "prefill"


def test_an_sglang_side_cannot_be_both_roles(tmp_path, pack_rules):
    with pytest.raises(DeploymentError) as caught:
        decide_fleet(load_deployment(str(_deployment(tmp_path, "both", "decode", engine="sglang"))), pack_rules)
    (problem,) = caught.value.problems
    assert problem.code == "DSV702" and (problem.line, problem.column) == (3, 100) and \
        "'both' is vLLM's kv_both" in problem.message, problem
