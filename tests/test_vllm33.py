"""Differential suite against the real vLLM 0.33.0 (installed in .venv-vllm by `make vllm-env`).

Each platform runs in its own process of the vLLM environment (vLLM fixes its platform on first
import): ``tests/vllm33/differential.py PLATFORM`` enumerates the whole decision space there and
asks vLLM's own selection code, each rule set, and vLLM with the dsv4sel plugin installed. The
assertions here read its report. Skipped, with the reason, when the environment is missing
(``make test`` builds it first; a failed build leaves its log in .venv-vllm.log).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("DSV4SEL_VLLM_VENV", ROOT / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".dsv4sel-vllm-env"
COMPAT = ROOT / "rules" / "compat" / "vllm-0.33"
PLATFORMS = ("cuda", "rocm", "cpu", "xpu")


def _skip_reason() -> str | None:
    if not STAMP.exists():
        log = ROOT / ".venv-vllm.log"
        why = f"; its build log: {log}" if log.exists() else ""
        return (f"the vLLM 0.33.0 test environment {VENV} is not built (run `make vllm-env`: "
                f"`python3 tools/vllm_env.py`){why}")
    return None


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm33")
    rules = ["--rules", f"compat={COMPAT}"] if COMPAT.is_dir() else []

    def run(platform):
        path = out / f"{platform}.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run([str(PYTHON), str(ROOT / "tests" / "vllm33" / "differential.py"), platform,
                               *rules, "--out", str(path)], capture_output=True, text=True, env=env,
                              cwd=ROOT, timeout=1200)
        assert proc.returncode == 0, f"{platform}: differential run failed:\n{proc.stderr[-4000:]}"
        return platform, json.loads(path.read_text())

    def build(platform):
        path = out / f"{platform}-construct.json"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run([str(PYTHON), str(ROOT / "tests" / "vllm33" / "construct.py"), platform,
                               "--out", str(path)], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
        assert proc.returncode == 0, f"{platform}: layer construction run failed:\n{proc.stderr[-4000:]}"
        return platform, json.loads(path.read_text())

    with ThreadPoolExecutor(max_workers=2) as pool:
        found = dict(pool.map(run, PLATFORMS))
        built = dict(pool.map(build, PLATFORMS))
    for platform, report in built.items():
        found[platform]["construct"] = report
    summary = {p: {"inputs": r["inputs"], "vllm": r["vllm"], "seconds": r["seconds"],
                   "sets": {n: {"agree": s["agree"], "disagree": len(s["disagree"]),
                                "sizes_compared": s["sizes_compared"], "sizes_not_compared": s["sizes_not_compared"]}
                            for n, s in r["sets"].items()},
                   "plugin": {k: (len(v) if k == "disagree" else v) for k, v in r["plugin"].items()
                              if k != "replaced"},
                   "diff": {k: (v if isinstance(v, int) else len(v)) for k, v in r.get("diff", {}).items()}}
               for p, r in found.items()}
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)
    (ROOT / ".pytest_cache" / "vllm33-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    sys.stderr.write("\nvLLM 0.33 differential: " + json.dumps(summary) + "\n")
    return found


def _first(rows, n=5):
    return "\n".join(json.dumps(r, sort_keys=True) for r in rows[:n])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vllm_decides_on_every_platform(reports, platform):
    r = reports[platform]
    assert r["inputs"] > 0
    # vLLM's own code was really consulted: it selects classes and refuses inputs on every platform
    assert r["vllm"].get("select", 0) > 0, r["vllm"]
    assert r["vllm"].get("reject", 0) + r["vllm"].get("refused", 0) > 0, r["vllm"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_plugin_builds_what_the_shipped_rules_name(reports, platform):
    """With the plugin installed, vLLM's own call path returns the class the shipped rules name
    for vLLM, the Selection's cache dtype and torch dtype and the rewritten cache config, or
    raises SelectionError with the cache config untouched -- on every input vLLM's config accepts."""
    p = reports[platform]["plugin"]
    assert p["disagree"] == [], f"{len(p['disagree'])} inputs differ, e.g.:\n{_first(p['disagree'])}"
    assert p["selects"] > 0 and p["rejects"] > 0, p
    assert p["agree"] + p["refused"] + p.get("vllm_raises_first", 0) == reports[platform]["inputs"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_plugin_replaces_the_functions_vllm_033_decides_in(reports, platform):
    replaced = reports[platform]["plugin"]["replaced"]
    assert "vllm.models.deepseek_v4.attention._resolve_dsv4_kv_cache_dtype" in replaced
    assert "vllm.models.deepseek_v41.attention._resolve_dsv4_kv_cache_dtype" in replaced
    select = {"cuda": ["vllm.models.deepseek_v4.nvidia.model._select_dsv4_attn_cls",
                       "vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls"],
              "rocm": ["vllm.models.deepseek_v41.amd.model._select_dsv4_attn_cls"],
              "cpu": ["vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls"],
              "xpu": ["vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls"]}[platform]
    assert sorted(replaced) == sorted(select + ["vllm.models.deepseek_v4.attention._resolve_dsv4_kv_cache_dtype",
                                                "vllm.models.deepseek_v41.attention._resolve_dsv4_kv_cache_dtype"])


@pytest.mark.skipif(not COMPAT.is_dir(), reason="rules/compat/vllm-0.33 is not in this checkout")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_compat_rules_equal_vllm_where_it_decides(reports, platform):
    s = reports[platform]["sets"]["compat"]
    assert s["disagree"] == [], f"{len(s['disagree'])} inputs differ, e.g.:\n{_first(s['disagree'])}"
    assert s["agree"] > 0


@pytest.mark.skipif(not COMPAT.is_dir(), reason="rules/compat/vllm-0.33 is not in this checkout")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_kv_record_and_block_size_are_compared_wherever_vllm_decides_them(reports, platform):
    """Every selection the compat set shares with vLLM had its KV record and kernel block size
    compared, except on CUDA with no capability (vLLM reads both from the GPU it runs on); the
    plugin's path had them compared too."""
    r = reports[platform]
    s = r["sets"]["compat"]
    assert s["sizes_compared"] + s["sizes_not_compared"] == r["vllm"]["select"]
    assert s["sizes_compared"] > 0 and r["plugin"]["sizes_compared"] > 0
    if platform != "cuda":
        assert s["sizes_not_compared"] == 0


#: Names vLLM 0.33's AttentionConfig refuses although dsv4sel's default path uses them as table
#: names: the compat set shares their tables with the platform default, so its fp8 rewrite shows
#: through them too.
DEFAULT_PATH_NAMES = {"CPU_V4_MLA_SPARSE", "XPU_V4_MLA_SPARSE"}


@pytest.mark.skipif(not COMPAT.is_dir(), reason="rules/compat/vllm-0.33 is not in this checkout")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_compat_and_shipped_differ_only_by_the_deliberate_fixes(reports, platform):
    """`dsv4sel diff rules/compat/vllm-0.33 rules`, input by input: every changed input is one
    where vLLM decides, the compat set agrees with vLLM and the shipped rules do not."""
    d = reports[platform]["diff"]
    assert d["changed_not_a_fix"] == [], d["changed_not_a_fix"][:5]
    assert all(row[2] in DEFAULT_PATH_NAMES for row in d["changed_where_vllm_decides_nothing"]), \
        [row for row in d["changed_where_vllm_decides_nothing"] if row[2] not in DEFAULT_PATH_NAMES][:5]
    shipped = reports[platform]["sets"]["shipped"]
    assert d["fixes"] == len(shipped["disagree"])  # every shipped/vLLM difference is in the diff


@pytest.mark.parametrize("platform", PLATFORMS)
def test_real_layers_are_the_class_the_rules_name(reports, platform):
    """Real construction (VllmConfig, gloo group, set_current_vllm_config, the layer's __init__)
    for a sample of inputs: the built layer is the rule's vLLM class with the Selection's cache
    dtype and torch dtype, its sliding-window cache spec has the Selection's bytes per token and
    vLLM's engine sets the Selection's block size, or SelectionError came first with the cache
    config untouched."""
    c = reports[platform]["construct"]
    bad = [row for row in c["rows"] if not row["ok"]]
    assert bad == [], bad[:5]
    assert c["counts"]["built"] > 0 and c["counts"]["rejected"] > 0
    classes = {row["got"][0] for row in c["rows"] if row["result"] == "built"}
    expected = {"cuda": 6, "rocm": 2, "cpu": 1, "xpu": 1}[platform]  # V4.0 and V4.1 classes the sample reaches
    assert len(classes) >= expected, classes


def _hostcheck(*args):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(PYTHON), str(ROOT / "tests" / "vllm33" / "hostcheck.py"), "rocm", *args],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_check_resolves_every_vllm_class_the_rules_name():
    """`dsv4sel check`'s host check against the installed vLLM 0.33: all 11 classes import
    (on a ROCm platform object, where vLLM's ROCm modules import too)."""
    out = _hostcheck()
    assert out["host_findings"] == []
    assert len(out["classes"]) == 11, out["classes"]


def test_check_reports_a_vllm_class_that_does_not_exist(tmp_path):
    (tmp_path / "x.yaml").write_text(
        "kind: backend\nbackends: [X_DSV4]\nhit_policy: first\nrules:\n  - id: x-any\n    select:\n"
        "      impl: dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl\n      layout: fp8_ds_mla\n"
        "      cache_dtype: fp8_ds_mla\n      torch_dtype: uint8\n      bytes_per_token: 584\n      block_size: 256\n"
        "      hosts:\n        vllm: {class: \"vllm.models.deepseek_v4.nvidia.flashmla:NoSuchAttention\", "
        "versions: \">=0.33.0,<0.34\"}\n")
    out = _hostcheck("--rules", str(tmp_path))
    assert len(out["host_findings"]) == 1 and "has no class 'NoSuchAttention'" in out["host_findings"][0]


def test_the_vocabulary_has_every_backend_and_kv_dtype_of_vllm_033():
    """Vocabulary sync: a new vLLM enum member or cache dtype cannot reach users undecided."""
    out = _hostcheck()
    assert out["enum_missing"] == [] and out["cache_dtype_missing"] == [], out
