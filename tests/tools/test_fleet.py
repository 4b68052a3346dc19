"""``dsv4sel fleet``'s value (dsv4sel.tools.fleet): a deployment decided as a whole.

Every row of shared/fleet.md's table of hazardous deployments is a case of ``fleet/cases.yaml``, run
both ways (as the engines decide, as dsv4sel makes them decide); the remaining tests state the
behaviour a user relies on beyond the table: the ``--json`` shape, one refusal per kind of bad input,
who decides a side, and the search for fixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.engine.load import load_file
from dsv4sel.tools.deployment import DeploymentError, load_deployment
from dsv4sel.tools.fleet import decide_fleet

HERE = Path(__file__).resolve().parent / "fleet"


def _cases() -> list[dict]:
    loaded, problems = load_file(str(HERE / "cases.yaml"), "cases.yaml")
    assert loaded is not None and not problems, problems
    return loaded.data["cases"]


CASES = _cases()


@pytest.fixture(scope="module")
def rules():
    return dsv4sel.default_rules()


def test_every_row_of_fleet_md_s_table_is_a_case():
    assert sorted({case["row"] for case in CASES}) == list(range(1, 18))
    files = {p.name for p in HERE.glob("row*.yaml")}
    assert files == {case["file"] for case in CASES}


@pytest.mark.parametrize("mode", ["engine", "dsv4sel"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["file"].removesuffix(".yaml"))
def test_fleet_gives_each_row_its_verdict(case, mode, rules, monkeypatch):
    monkeypatch.chdir(HERE)
    want = case["fleet"][mode]
    try:
        report = decide_fleet(load_deployment(case["file"]), rules, mode)
    except DeploymentError as exc:
        assert want["exit"] == 2 and [p.code for p in exc.problems] == want["problems"], exc
        return
    assert (0 if report.compatible else 1) == want["exit"], report.as_dict()
    assert [d.field for d in report.differences] == want.get("differ", []), report.as_dict()
    assert [s.name for s in report.sides if s.outcome.contract is None] == want.get("refused", [])
    if "fix" in want:
        assert report.fixes, report.no_fix
        assert {side: dict(changes) for side, changes in report.fixes[0].changes} == want["fix"]
        _the_fix_works(case["file"], report.fixes[0], rules, mode)
    elif want["exit"] == 1:
        assert report.fixes == () and want["no_fix"] in report.no_fix, report.no_fix
    else:
        assert report.fixes == () and report.no_fix is None


def _the_fix_works(file: str, fix, rules, mode: str) -> None:
    """A fix's changes, written into the deployment file, make it compatible with that contract."""
    from dsv4sel.tools import fleet_sides

    deployment = load_deployment(file)
    for report_side in decide_fleet(deployment, rules, mode, search=False).sides:
        changes = dict(dict(fix.changes).get(report_side.name, ()))
        outcome = fleet_sides.decide(report_side.side, report_side.decided_by, _rules(report_side, rules),
                                     report_side.model, changes)
        assert outcome.contract == fix.contract, (report_side.name, changes)


def _rules(report_side, shipped):
    from dsv4sel.tools.fleet import RuleSets, _rules_for

    return _rules_for(report_side.side, report_side.decided_by, RuleSets(shipped))[0]


# ------------------------------------------------------------------ the value and its JSON

def test_json_has_the_issue_s_shape(rules, monkeypatch):
    monkeypatch.chdir(HERE)
    data = json.loads(json.dumps(decide_fleet(load_deployment("row02_v4_decode_flashinfer.yaml"), rules).as_dict()))
    assert list(data) == ["version", "file", "as", "compatible", "sides", "differences", "fixes", "no_fix"]
    assert data["compatible"] is False and data["as"] == "dsv4sel"
    decode = data["sides"]["decode"]
    assert decode["decision"]["backend"] == "FLASHINFER_MLA_SPARSE_DSV4" and decode["decision"]["status"] == "selected"
    assert decode["contract"]["pools"][0]["record"] == "fp8_e4m3_row"
    assert decode["decided_by"] == "dsv4sel" and decode["rules"] == "shipped rules"
    first = data["differences"][0]
    assert first["field"] == "main.record" and first["values"] == {"prefill": "fp8_ds_mla", "decode": "fp8_e4m3_row"}
    assert first["rules"]["decode"]["location"].startswith("rules/flashinfer.yaml:")
    assert data["fixes"][0]["changes"] == {"decode": {"attention_backend": None}}
    assert data["fixes"][0]["contract"] == data["sides"]["prefill"]["contract"]["fingerprint"]


def test_a_side_its_rules_refuse_is_reported_with_the_rule_and_the_deployment_is_incompatible(rules, tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("sides:\n"
                    "  a: {engine: vllm, version: \"0.33.0\", platform: cuda, capability: \"9.0\", kv_cache_dtype: bfloat16}\n"
                    "  b: {engine: vllm, version: \"0.33.0\", platform: cuda, capability: \"9.0\"}\n")
    report = decide_fleet(load_deployment(str(path)), rules)
    refused = report.sides[0].outcome
    assert not report.compatible and refused.selection is None and refused.rule.id == "flashmla-unsupported-dtype"
    assert "bfloat16" in refused.reason and report.differences == ()
    assert {side: dict(ch) for side, ch in report.fixes[0].changes} == {"a": {"kv_cache_dtype": "auto"}}


def test_different_releases_or_models_have_no_setting_that_fixes_them(rules, tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text("sides:\n"
                    "  a: {engine: vllm, version: \"0.33.0\", platform: cuda, capability: \"9.0\"}\n"
                    "  b: {engine: vllm, version: \"0.33.0\", platform: cuda, capability: \"9.0\", model: deepseek_v4_1}\n"
                    "  c: {engine: sglang, version: \"0.5.23\", platform: cuda, capability: \"9.0\"}\n")
    report = decide_fleet(load_deployment(str(path)), rules)
    assert [d.field for d in report.differences][:2] == ["model", "engine"]
    assert report.fixes == () and "different models (a deepseek_v4, b deepseek_v4_1, c deepseek_v4)" in report.no_fix
    assert "different engines (a vllm, b vllm, c sglang)" in report.no_fix


def test_a_side_says_who_decides_it_and_a_release_no_plugin_serves_is_its_engine_s(rules, monkeypatch):
    monkeypatch.chdir(HERE)
    report = decide_fleet(load_deployment("row16_dsv4sel_on_one_node.yaml"), rules, "dsv4sel")
    assert [(s.name, s.decided_by, s.rules) for s in report.sides] == [
        ("node0", "engine", "rules/compat/sglang-0.5.23"), ("node1", "dsv4sel", "shipped rules")]
    assert report.sides[0].outcome.selection.backend == "FLASHMLA"  # SGLang's own table names
    assert report.sides[1].outcome.selection.backend == "FLASHMLA_SPARSE_DSV41"


def test_an_engine_mode_vllm_fix_is_only_a_setting_whose_kernel_runs(rules, monkeypatch):
    # vLLM 0.33 builds FlashInfer's layer on an H200 (its kernel is SM100-only): that is no fix
    monkeypatch.chdir(HERE)
    report = decide_fleet(load_deployment("row02_v4_decode_flashinfer.yaml"), rules, "engine")
    assert all(dict(changes).get("attention_backend") != "FLASHINFER_MLA_SPARSE_DSV4"
               for fix in report.fixes for side, changes in fix.changes if side == "prefill")


def test_disaggregation_that_no_rule_reads_is_said_so(rules, monkeypatch):
    monkeypatch.chdir(HERE)
    report = decide_fleet(load_deployment("row01_v4_h200_b200_default.yaml"), rules)
    assert report.sides[0].outcome.notes == ("disaggregation prefill decides nothing in these rules (no rule reads it)",)


# ------------------------------------------------------------------ unusable deployment files

@pytest.mark.parametrize(("text", "code", "at"), [
    ("sides: {a: {engine: vllm, version: \"0.33.0\", platform: cuda}}\n", "DSV201", "d.yaml:1:8"),
    ("sides:\n  a: {engine: vllm, version: 0.33, platform: cuda}\n  b: {engine: vllm, version: \"0.33.0\", platform: cuda}\n",
     "DSV202", "d.yaml:2:30"),
    ("sides:\n  a: {engine: tgi, version: \"1.0\", platform: cuda}\n  b: {engine: vllm, version: \"0.33.0\", platform: cuda}\n",
     "DSV201", "d.yaml:2:15"),
    ("sides:\n  a: {engine: vllm, version: \"0.33.0\"}\n  b: {engine: vllm, version: \"0.33.0\", platform: cuda}\n",
     "DSV204", "d.yaml:2:6"),
    ("sides:\n  a: {engine: vllm, version: \"0.33.0\", platform: cuda, a: 1, a: 2}\n", "DSV106", "d.yaml:2:62"),
    ("kind: tests\nsides: {}\n", "DSV201", "d.yaml:1:7"),
    ("sides: [\n", "DSV102", "d.yaml:2:1"),
])
def test_a_bad_deployment_file_is_refused_at_its_line_and_column_with_a_code(text, code, at, tmp_path, monkeypatch,
                                                                             rules):
    monkeypatch.chdir(tmp_path)
    Path("d.yaml").write_text(text)
    with pytest.raises(DeploymentError) as exc:
        decide_fleet(load_deployment("d.yaml"), rules)
    assert [(p.code, str(p.loc)) for p in exc.value.problems][:1] == [(code, at)], exc.value


@pytest.mark.parametrize(("side", "code", "key_says"), [
    ("{engine: vllm, version: \"0.35.1\", platform: cuda}", "DSV701", "vLLM has no release '0.35.1' that dsv4sel follows; known releases: 0.33 (0.33.0), 0.34 (0.34.0)"),
    ("{engine: vllm, version: \"0.33.0\", platform: cuda, mega: available}", "DSV702", "unknown input 'mega'"),
    ("{engine: sglang, version: \"0.5.23\", platform: cuda, capability: \"9.0\", attention_backend: fa3}", "DSV702",
     "attention_backend (--dsv4-attn-backend) 'fa3' is not one of SGLang 0.5.23's: auto, flashmla, flashmla_mega, "
     "trtllm"),
    ("{engine: sglang, version: \"0.5.23\", platform: cuda, env: {SGLANG_DSV4_KV_LAYOUT: v5}}", "DSV702",
     "SGLANG_DSV4_KV_LAYOUT='v5' is not one of v4, auto, v41, v41_new"),
    ("{engine: sglang, version: \"0.5.23\", platform: cuda, env: {VLLM_ATTENTION_BACKEND: X}}", "DSV703",
     "the variables that do: SGLANG_DSV4_KV_LAYOUT, SGLANG_DSV4_COMPRESSED_KV_LAYOUT"),
])
def test_what_a_side_s_rules_do_not_know_is_refused_at_the_side(side, code, key_says, tmp_path, monkeypatch, rules):
    monkeypatch.chdir(tmp_path)
    Path("d.yaml").write_text(f"sides:\n  a: {side}\n  b: {{engine: vllm, version: \"0.33.0\", platform: cuda}}\n")
    with pytest.raises(DeploymentError) as exc:
        decide_fleet(load_deployment("d.yaml"), rules, "engine" if code == "DSV701" else "dsv4sel")
    (problem,) = exc.value.problems
    assert problem.code == code and problem.line == 2 and key_says in problem.message, problem
    # located at the key or value it is about, not only at the side
    assert problem.column > 6 if code != "DSV701" else problem.column == side.index("\"0.3") + 6, problem
    assert problem.message.startswith("side a: ")
