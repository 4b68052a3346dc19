"""The dsv4sel plugin in the real vLLM 0.33.0 (.venv-vllm): as vLLM loads it, logs it and
validates its configuration (issue 22, points 1, 2 and 4).

Every scenario runs ``tests/vllm33/plugin_scenarios.py`` in its own process of the vLLM
environment, with vLLM's own default logging configuration and its real
``load_general_plugins()`` (the plugin comes from its installed entry point), and with its own
dsv4sel cache directory. Skipped, with the reason, when the environment is missing.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from test_vllm33 import PYTHON, _skip_reason  # noqa: E402

pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")
SCENARIOS = ROOT / "tests" / "vllm33" / "plugin_scenarios.py"
ENV_KEYS = ("VLLM_PLUGINS", "DSV4SEL_RULES_PATH", "DSV4SEL_ALLOW_IMPL_MODULES", "VLLM_LOGGING_LEVEL",
            "VLLM_CONFIGURE_LOGGING", "VLLM_LOGGING_CONFIG_PATH")


def scenario(tmp_path, *args, platform="cuda", capability="9.0", **env):
    """Run one scenario process; returns (exit status, its dsv4sel log lines, the JSON results,
    stderr)."""
    clean = {k: v for k, v in os.environ.items() if k not in ENV_KEYS and not k.startswith("DSV4SEL_TEST_")}
    clean.update(PYTHONPATH=str(ROOT), DSV4SEL_CACHE_DIR=str(tmp_path / "cache"), NO_COLOR="1")
    if platform:
        clean.update(DSV4SEL_TEST_PLATFORM=platform, DSV4SEL_TEST_CAPABILITY=capability)
    clean.update({k: str(v) for k, v in env.items()})
    proc = subprocess.run([str(PYTHON), str(SCENARIOS), *map(str, args)], capture_output=True, text=True,
                          env=clean, cwd=ROOT, timeout=300)
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if "dsv4sel" in line and "== config" not in line]
    out = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc.returncode, lines, out, proc.stderr


START = ("dsv4sel: DeepSeek-V4 attention selection of vllm 0.33.0 is decided by dsv4sel "
         "(6 functions replaced on cuda; decided when vLLM validates its config)")


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    """Every scenario process, run side by side (each with its own cache directory)."""
    root = tmp_path_factory.mktemp("plugin")
    models = root / "models"
    for name, arch in (("v4", "DeepseekV4ForCausalLM"), ("llama", "LlamaForCausalLM")):
        proc = subprocess.run([str(PYTHON), str(SCENARIOS), "model", str(models / name), arch],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
    rules, src = _pack(root / "demo")
    pack_env = {"DSV4SEL_RULES_PATH": rules, "PYTHONPATH": f"{ROOT}{os.pathsep}{src}"}
    jobs = {
        # four engine configurations in one process (vLLM loads the plugins once per process)
        "configs": (("config", models / "v4", "+", models / "v4", "--kv-cache-dtype", "bfloat16", "+",
                     models / "v4", "--attention-backend", "CUTLASS_MSA", "+", models / "llama"), {}),
        "no-platform": (("load",), {"platform": None}),
        "no-platform-asked": (("load",), {"platform": None, "VLLM_PLUGINS": "dsv4sel"}),
        "version": (("load",), {"DSV4SEL_TEST_FAKE_VERSION": "0.34.0"}),
        "version-asked": (("load",), {"DSV4SEL_TEST_FAKE_VERSION": "0.34.0", "VLLM_PLUGINS": "dsv4sel"}),
        "pack": (("config", models / "v4"), pack_env),
        "pack-allowed": (("config", models / "v4"), {**pack_env, "DSV4SEL_ALLOW_IMPL_MODULES": "demo_dsv4_kernels"}),
    }

    def run(item):
        name, (args, env) = item
        directory = root / name
        directory.mkdir()
        return name, scenario(directory, *args, **env)

    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        return dict(pool.map(run, jobs.items()))


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


def _pack(tmp_path):
    tmp_path.mkdir(parents=True, exist_ok=True)
    """A rule pack whose backend's impl lives in the pack's own module (not dsv4sel.kernels)."""
    module = tmp_path / "src" / "demo_dsv4_kernels"
    module.mkdir(parents=True)
    (module / "__init__.py").write_text("class DemoSparseImpl:\n    '''A pack's own kernel.'''\n")
    rules = tmp_path / "pack"
    rules.mkdir()
    (rules / "demo.yaml").write_text(textwrap.dedent("""\
        kind: backend
        backends: [DEMO_MLA_SPARSE_DSV4]
        hit_policy: first
        defaults:
          impl: demo_dsv4_kernels:DemoSparseImpl
          layout: fp8_ds_mla
          cache_dtype: fp8_ds_mla
          torch_dtype: uint8
          bytes_per_token: 584
          block_size: 256
          hosts:
            vllm: {class: "vllm.models.deepseek_v4.nvidia.flashmla:DeepseekV4FlashMLAAttention", versions: ">=0.33.0,<0.34"}
        rules:
          - id: demo-sm90
            when: {model: deepseek_v4, platform: cuda, capability: 9.x, kv_cache_dtype: [auto, fp8]}
            select: {rewrites: {cache_dtype: fp8_ds_mla}}
          - id: demo-other
            reject: {reason: DEMO_MLA_SPARSE_DSV4 serves deepseek_v4 on SM90 with auto or fp8 only.}
        """))
    (rules / "defaults.yaml").write_text(textwrap.dedent("""\
        kind: default
        hit_policy: first
        rules:
          - id: demo-default-sm90
            override: true
            when: {model: deepseek_v4, platform: cuda, capability: "9.0"}
            use: DEMO_MLA_SPARSE_DSV4
        """))
    return rules, tmp_path / "src"


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
