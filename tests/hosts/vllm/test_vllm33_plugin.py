"""The dsv4sel plugin in the real vLLM 0.33.0 (.venv-vllm): as vLLM loads it, logs it and
validates its configuration (issue 22, points 1, 2 and 4).

Every scenario runs ``tests/vllm33/plugin_scenarios.py`` in its own process of the vLLM
environment, with vLLM's own default logging configuration and its real
``load_general_plugins()`` (the plugin comes from its installed entry point), and with its own
dsv4sel cache directory. Skipped, with the reason, when the environment is missing.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for _vllm33
import _vllm33  # noqa: E402
from _vllm33 import ROOT  # noqa: E402

pytestmark = pytest.mark.skipif(_vllm33.skip_reason() is not None, reason=_vllm33.skip_reason() or "")
START = ("dsv4sel: DeepSeek-V4 attention selection of vllm 0.33.0 is decided by dsv4sel "
         "(7 functions replaced on cuda; decided when vLLM validates its config)")


@pytest.fixture(scope="module")
def ran(request, tmp_path_factory):
    """Every scenario process, run side by side (each with its own directory and cache: tests/_vllm33.py)."""
    _vllm33.start(request.session, tmp_path_factory)
    return {name: _vllm33.result(f"scenario:{name}") for name in _vllm33.SCENARIOS}


def test_the_start_up_line_shows_with_vllms_own_logging_config(ran):
    rc, lines, _, err = ran["configs"]
    assert rc == 0, err[-3000:]
    assert lines[0].endswith(START) and sum(START in line for line in lines) == 1, lines
    # vLLM's handler and format wrote it: "(MainProcess pid=N) INFO MM-DD hh:mm:ss [file:line] ..."
    assert "(MainProcess pid=" in lines[0] and " INFO " in lines[0], lines


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


def test_another_vllm_version_installed_is_one_warning_line(ran):
    rc, lines, _, err = ran["version"]
    assert rc == 0 and "Traceback" not in err, err[-3000:]
    assert len(lines) == 1 and " WARNING " in lines[0] and "written for vllm >=0.33.0,<0.34 and this is vllm " \
        "0.34.0; it patched nothing" in lines[0] and "uninstall dsv4sel or set VLLM_PLUGINS" in lines[0], lines


def test_another_vllm_version_asked_for_is_one_plugin_error(ran):
    rc, _, _, err = ran["version-asked"]
    assert rc == 1
    last = err.strip().splitlines()[-1]
    assert last.startswith("dsv4sel.vllm_plugin.PluginError: dsv4sel's vLLM plugin is written for vllm "
                           ">=0.33.0,<0.34 and this is vllm 0.34.0") and "take it out" in last, last
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


# ------------------------------------------------------------------ the log samples in docs/vllm.md
DOC = ROOT / "docs" / "vllm.md"
#: vLLM's log prefix, ``(APIServer pid=4813) INFO 12-01 21:34:32 [state.py:42] ``: the doc shows the
#: pid and the time normalised, everything else as vLLM printed it.
PREFIX = re.compile(r"^\((?P<proc>\w+) pid=\d+\) (?P<level>[A-Z]+) \d\d-\d\d \d\d:\d\d:\d\d \[")


def normalised(line: str) -> str:
    return PREFIX.sub(lambda m: f"({m['proc']} pid=N) {m['level']} MM-DD hh:mm:ss [", line)


def doc_block(marker: str) -> list[str]:
    """The lines of the fenced block that follows ``<!-- generated: MARKER ... -->`` in docs/vllm.md."""
    lines = DOC.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"<!-- generated: {marker} "))
    start = lines.index("```text", at) + 1
    return lines[start:lines.index("```", start)]


def serve_log(ran) -> list[str]:
    """The dsv4sel lines `vllm serve` printed, in order, normalised."""
    return [normalised(line) for line in ran["serve"][1] if PREFIX.match(line) and "] dsv4sel: " in line]


def rejection_sample(ran) -> list[str]:
    """How vLLM reports the rejected config (`--kv-cache-dtype bfloat16` on SM90): pydantic's
    ValidationError as vLLM raises it, its input echo cut to ``...``."""
    text = ran["configs"][2][1]["text"].splitlines()
    return [re.sub(r"\[type=value_error, .*\]$", "[type=value_error, ...]", line) for line in text[:3]]


def test_vllm_serve_shows_the_start_up_and_decision_lines_as_the_doc_does(ran):
    """`vllm serve` with vLLM's own CLI and default logging: the start-up line, the decision line and
    the rules' message in the API server, the start-up line again in the engine core process; the
    doc's block is exactly that (run `python tests/hosts/vllm/test_vllm33_plugin.py --write` to refresh it)."""
    got = serve_log(ran)
    assert [line.split("] ", 1)[1] for line in got if line.startswith("(APIServer")][:1] == [START], got
    assert any(line.startswith("(EngineCore") and line.endswith(START) for line in got), got
    assert got == doc_block("vllm serve"), "docs/vllm.md's `vllm serve` block is stale:\n" + "\n".join(got)


def test_the_rejection_sample_in_the_doc_is_what_vllm_raises(ran):
    assert rejection_sample(ran) == doc_block("rejection"), "\n".join(rejection_sample(ran))


def _write_doc() -> None:
    """Rewrite the two generated blocks of docs/vllm.md from a fresh run of the scenarios."""
    import tempfile

    _vllm33.launch({"test_vllm33_plugin"}, Path(tempfile.mkdtemp(prefix="dsv4sel-vllm-doc-")))
    ran = {name: _vllm33.result(f"scenario:{name}") for name in ("serve", "configs")}
    text = DOC.read_text()
    for marker, block in (("vllm serve", serve_log(ran)), ("rejection", rejection_sample(ran))):
        old = doc_block(marker)
        text = text.replace("```text\n" + "\n".join(old) + "\n```", "```text\n" + "\n".join(block) + "\n```", 1)
    DOC.write_text(text)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    _write_doc()
