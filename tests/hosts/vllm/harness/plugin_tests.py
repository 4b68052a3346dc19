"""The dsv4sel plugin in a real vLLM release, as vLLM loads it, logs it and validates its
configuration (issue 22, points 1, 2 and 4), written once; each release folder's ``test_plugin.py``
imports these tests and so runs them for its release.

Every scenario runs ``harness/plugin_scenarios.py`` in its own process of the release's
environment, with vLLM's own default logging configuration and its real
``load_general_plugins()`` (the plugin comes from its installed entry point), and with its own
dsv4sel cache directory. Skipped, with the reason, when the environment is missing.
"""
from __future__ import annotations

import re

import pytest

from harness import runner
from harness.differential_tests import release, skip_without_env
from harness.releases import VllmRelease

from dsv4sel.dsv4.host_registry import HOSTS

__all__ = [
    "ran", "release", "skip_without_env", "test_a_minimax_alias_vllm_erases_is_still_an_explicit_backend",
    "test_a_model_that_is_not_deepseek_v4_is_left_alone_in_one_line",
    "test_a_pack_that_reads_the_role_under_disaggregation_gets_it_from_vllms_kv_transfer_config",
    "test_a_pack_with_its_own_impl_module_works_under_the_plugin_when_allowed",
    "test_a_rejection_comes_when_vllm_validates_its_config", "test_another_vllm_version_asked_for_is_one_plugin_error",
    "test_another_vllm_version_installed_is_one_warning_line",
    "test_each_decision_is_one_line_with_its_rules_and_the_explain_command",
    "test_no_platform_patches_nothing_in_one_line_and_is_never_an_error",
    "test_the_start_up_line_shows_with_vllms_own_logging_config",
    "test_a_forked_vllm_process_configures_torchs_compiler_as_a_plain_one",
    "test_vllm_serve_logs_the_start_up_line_in_the_api_server_and_the_engine_core",
]
#: The vLLM releases the plugin is written for, as its messages name them (the registry's).
PLUGIN_RANGE = HOSTS["vllm"].supported


#: vLLM's log prefix, ``(APIServer pid=4813) INFO 12-01 21:34:32 [state.py:42] ``
PREFIX = re.compile(r"^\((?P<proc>\w+) pid=\d+\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d \[")


def normalised(line: str) -> str:
    """A log line with its pid and time normalised (as docs/vllm.md shows them)."""
    return PREFIX.sub(lambda m: f"({m['proc']} pid=N) {m['level']} MM-DD hh:mm:ss [", line)


def serve_log(ran) -> list[str]:
    """The dsv4sel lines `vllm serve` printed, in order, normalised."""
    return [normalised(line) for line in ran["serve"][1] if PREFIX.match(line) and "] dsv4sel: " in line]


def start_line(release: VllmRelease) -> str:
    return (f"dsv4sel: DeepSeek-V4 attention selection of vllm {release.version} is decided by dsv4sel "
            "(7 functions replaced on cuda; decided when vLLM validates its config)")


@pytest.fixture(scope="module")
def ran(request, tmp_path_factory, release):
    """Every scenario process, run side by side (each with its own directory and cache: harness/runner.py)."""
    runner.start(request, tmp_path_factory)
    return {name: runner.result(release, f"scenario:{name}") for name in runner.SCENARIOS}


def test_the_start_up_line_shows_with_vllms_own_logging_config(ran, release):
    rc, lines, _, err = ran["configs"]
    assert rc == 0, err[-3000:]
    start = start_line(release)
    assert lines[0].endswith(start) and sum(start in line for line in lines) == 1, lines
    # vLLM's handler and format wrote it: "(MainProcess pid=N) INFO MM-DD hh:mm:ss [file:line] ..."
    assert "(MainProcess pid=" in lines[0] and " INFO " in lines[0], lines


def test_vllm_serve_logs_the_start_up_line_in_the_api_server_and_the_engine_core(ran, release):
    """vLLM's own `vllm serve` (its CLI, argument parsing and default logging): the start-up line
    first in the API server, and again in the engine core process it starts."""
    got = serve_log(ran)
    start = start_line(release)
    assert [line.split("] ", 1)[1] for line in got if line.startswith("(APIServer")][:1] == [start], got
    assert any(line.startswith("(EngineCore") and line.endswith(start) for line in got), got


def test_each_decision_is_one_line_with_its_rules_and_the_explain_command(ran):
    rc, lines, results, err = ran["configs"]
    assert rc == 0 and results[0] == {"ok": True}, err[-3000:]
    decision = [line for line in lines if "attention FLASHMLA_SPARSE_DSV4 ->" in line]
    assert len(decision) == 1, lines
    line = decision[0]
    for part in ("vllm.models.deepseek_v4.nvidia.flashmla.DeepseekV4FlashMLAAttention",
                 "kv cache fp8_ds_mla (fp8_ds_mla, 584 B/token, block 256)", "rewrites cache_dtype auto -> fp8_ds_mla",
                 "decided by default-cuda-sm9x-sm10x (rules/defaults.yaml:", "then flashmla-fp8 (rules/flashmla.yaml:",
                 "`dsv4sel explain --platform cuda --capability 9.0 --kv-cache-dtype auto` shows why"):
        assert part in line, (part, line)


def test_a_rejection_comes_when_vllm_validates_its_config(ran):
    result = ran["configs"][2][1]
    assert result["error"] == "SelectionError" and "flashmla-unsupported-dtype" in result["message"], result


def test_a_minimax_alias_vllm_erases_is_still_an_explicit_backend(ran):
    # vLLM's AttentionConfig turns CUTLASS_MSA into "no backend"; the plugin sees the name the user gave
    result = ran["configs"][2][2]
    assert result["error"] == "SelectionError" and "no selection for CUTLASS_MSA" in result["message"], result


def test_a_model_that_is_not_deepseek_v4_is_left_alone_in_one_line(ran):
    _, lines, results, err = ran["configs"]
    assert results[3] == {"ok": True}, err[-3000:]
    assert [line.split("] ", 1)[1] for line in lines if "LlamaForCausalLM" in line] == [
        "dsv4sel: LlamaForCausalLM is not a DeepSeek-V4 model; dsv4sel decides nothing for it"], lines


@pytest.mark.parametrize("name", ["no-platform", "no-platform-asked"])
def test_no_platform_patches_nothing_in_one_line_and_is_never_an_error(ran, name):
    rc, lines, _, err = ran[name]
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and lines[0].endswith(
        "dsv4sel: vLLM found no platform dsv4sel decides for (UnspecifiedPlatform); DeepSeek-V4 attention "
        "selection stays vLLM's own, nothing was patched"), lines


def test_another_vllm_version_installed_is_one_warning_line(ran, release):
    rc, lines, _, err = ran["version"]
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and " WARNING " in lines[0] and f"written for vllm {PLUGIN_RANGE} and this is vllm " \
        f"{release.other_version}; it patched nothing" in lines[0] and "uninstall dsv4sel or set VLLM_PLUGINS" in \
        lines[0], lines


def test_another_vllm_version_asked_for_is_one_plugin_error(ran, release):
    rc, _, _, err = ran["version-asked"]
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("dsv4sel.vllm_plugin.PluginError: dsv4sel's vLLM plugin is written for vllm "
                           f"{PLUGIN_RANGE} and this is vllm {release.other_version}") and "take it out" in last, last
    assert err.count("Traceback") == 1 and "During handling" not in err, err[-3000:]


def test_a_pack_with_its_own_impl_module_works_under_the_plugin_when_allowed(ran):
    # not allowed: one RuleError, when vLLM validates its config, naming the impl and the module list
    rc, _, results, err = ran["pack"]
    assert rc == 0 and results[0]["error"] == "RuleError", (results, err[-2000:])
    assert "demo_dsv4_kernels:DemoSparseImpl" in results[0]["message"] and "outside the allowed modules" in \
        results[0]["message"], results
    rc, lines, results, err = ran["pack-allowed"]
    assert rc == 0 and results == [{"ok": True}], (results, err[-3000:])
    decision = [line for line in lines if "attention DEMO_MLA_SPARSE_DSV4 ->" in line]
    assert len(decision) == 1 and "decided by demo-default-sm90 (" in decision[0] and \
        "then demo-sm90 (" in decision[0], lines




def test_a_pack_that_reads_the_role_under_disaggregation_gets_it_from_vllms_kv_transfer_config(ran):
    rc, lines, results, err = ran["pd-roles"]
    assert rc == 0 and results == [{"ok": True}] * 3, (results, err[-3000:])
    decisions = [line.split("dsv4sel: ", 1)[1] for line in lines if "deepseek_v4 attention " in line]
    assert len(decisions) == 3, lines
    # no KV connector: not disaggregated, the shipped default; kv_consumer: decode; kv_both: both
    assert decisions[0].startswith("deepseek_v4 attention FLASHMLA_SPARSE_DSV4 ->") and \
        "decided by default-cuda-sm9x-sm10x (" in decisions[0], decisions
    for line, role in zip(decisions[1:], ("decode", "both")):
        assert line.startswith("deepseek_v4 attention FLASHINFER_MLA_SPARSE_DSV4 ->") and \
            "decided by pd-v4-sm100-flashinfer (" in line and f"--input disaggregation={role}` shows why" in line, line


def test_a_forked_vllm_process_configures_torchs_compiler_as_a_plain_one(ran):
    """The suite's vLLM processes are forked from a zygote that imported torch's compiler before
    vLLM was (harness/zygote.py): with vLLM's plugins loaded, every value of torch._dynamo's and
    torch._inductor's configuration, and the variables vLLM sets, are those of a plain process."""
    found = {}
    for how in ("forked", "plain"):
        rc, _, results, err = ran[f"compiler-{how}"]
        assert rc == 0 and len(results) == 1, err[-3000:]
        found[how] = results[0]
    forked, plain = found["forked"], found["plain"]
    assert forked["env"] == plain["env"] and forked["env"]["TORCHINDUCTOR_COMPILE_THREADS"] == "1", found
    for config in ("dynamo", "inductor"):
        assert len(plain[config]) > 50, plain[config]
        differ = {k: (forked[config].get(k), v) for k, v in plain[config].items() if forked[config].get(k) != v}
        assert differ == {} and forked[config].keys() == plain[config].keys(), (config, differ)
