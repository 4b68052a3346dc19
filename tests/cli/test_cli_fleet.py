"""``dsv4sel fleet DEPLOYMENT.yaml`` as a user runs it: exit 0 compatible, 1 not, 2 unusable input;
the text names the differing fields, each side's value, the deciding rules and the fixes; ``--json``
is the report's ``as_dict()``; unusable input is one located error, never a traceback."""

from __future__ import annotations

import json
import re

import pytest

from _cli import run

FLEET = "tests/tools/fleet"


def test_a_compatible_deployment_exits_0_naming_the_shared_contract():
    r = run("fleet", f"{FLEET}/row01_v4_h200_b200_default.yaml")
    assert r.rc == 0 and r.err == "", r
    assert re.search(r"^compatible  every side writes and reads one KV contract, kv1-[0-9a-f]{16}$", r.out, re.M), r.out
    assert "decided by dsv4sel (shipped rules)" in r.out


def test_an_incompatible_one_exits_1_with_each_field_each_value_the_rules_and_the_fix():
    r = run("fleet", f"{FLEET}/row02_v4_decode_flashinfer.yaml", "--as", "engine")
    assert r.rc == 1, r
    out = r.out
    assert "as the engines decide today (each release's compat rule set)" in out
    assert re.search(r"^  main.record +fp8_ds_mla +fp8_e4m3_row$", out, re.M), out
    assert re.search(r"^  decided by +flashmla-fp8 rules/compat/vllm-0.33/flashmla.yaml:\d+ +"
                     r"flashinfer-sm10x-fp8 rules/compat/vllm-0.33/flashinfer.yaml:\d+$", out, re.M), out
    assert re.search(r"^  1\. on decode: attention_backend unset \(selects FLASHMLA_SPARSE_DSV4, flashmla-fp8 "
                     r"rules/compat/vllm-0.33/flashmla.yaml:\d+\) -> kv1-[0-9a-f]{16}$", out, re.M), out


def test_no_setting_that_works_is_said_so_with_what_each_side_can_hold():
    r = run("fleet", f"{FLEET}/row04_v41_decode_flashmla.yaml")
    assert r.rc == 1, r
    assert "  none: no setting makes these sides agree" in r.out
    assert "prefill (vllm 0.33.0 on cuda 9.0) can hold fp8_ds_mla 584 B" in r.out


def test_json_is_the_report_s_as_dict():
    r = run("fleet", f"{FLEET}/row09_sglang_v41_h200_b200_pd.yaml", "--as", "engine", "--json")
    assert r.rc == 1, r
    data = json.loads(r.out)
    assert data["compatible"] is False and data["as"] == "engine"
    assert set(data["sides"]) == {"prefill", "decode"}
    assert data["sides"]["decode"]["decision"]["settings"]["kv_layout"] == "v41"
    assert data["sides"]["prefill"]["contract"]["pools"][0]["record"] == "fp8_ds_mla"
    assert data["differences"][0]["values"] == {"prefill": "fp8_ds_mla", "decode": "fp8_ds_mla_v41"}
    assert data["fixes"][0]["changes"] == {"decode": {"attention_backend": "flashmla"}}


@pytest.mark.parametrize(("file", "says"), [
    ("bad/unknown_release.yaml", "bad/unknown_release.yaml:4:37: side decode: SGLang has no release '0.5.24' that dsv4sel follows"),
    ("bad/bad_value.yaml", "bad/bad_value.yaml:3:74: side prefill: cuda capability '9.5' is not declared"),
    ("bad/env_not_deciding.yaml", "bad/env_not_deciding.yaml:3:110: side prefill: SGLANG_DSV4_KV_LAYOUT does not "
                                  "decide the DeepSeek-V4 cache in vllm"),
])
def test_unusable_input_exits_2_with_one_located_error(file, says):
    r = run("fleet", f"{FLEET}/{file}")
    assert r.rc == 2 and r.out == "", r
    assert r.err.startswith("dsv4sel fleet: error: 1 problem in the deployment (DSV70") and says in r.err, r.err
    doc = json.loads(run("fleet", f"{FLEET}/{file}", "--json").out)
    assert doc["ok"] is False and doc["error"]["kind"] == "input" and doc["error"]["problems"][0]["code"].startswith("DSV70")


def test_a_missing_file_and_a_directory_exit_2():
    for path, says in (("nope.yaml", "cannot read rule file: No such file or directory"),
                       (FLEET, "a directory, not a deployment file")):
        r = run("fleet", path)
        assert r.rc == 2 and says in r.err and "DSV101" in r.err, r


def test_rules_adds_a_pack_and_a_broken_pack_exits_2(tmp_path):
    (tmp_path / "bad.yaml").write_text("kind: backend\nbackends: [X]\nrules: [\n")
    r = run("fleet", f"{FLEET}/row01_v4_h200_b200_default.yaml", "--rules", str(tmp_path))
    assert r.rc == 2 and "DSV102" in r.err, r


def test_help_lists_the_modes_and_an_example():
    r = run("fleet", "--help")
    assert r.rc == 0 and "--as {dsv4sel,engine}" in r.out and "deployment.yaml:" in r.out
    assert "fleet" in run("--help").out
