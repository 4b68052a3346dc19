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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _host_env import env_skip_reason  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
VENV = Path(os.environ.get("DSV4SEL_VLLM_VENV", ROOT / ".venv-vllm"))
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".dsv4sel-vllm-env"
COMPAT = ROOT / "rules" / "compat" / "vllm-0.33"
PLATFORMS = ("cuda", "rocm", "cpu", "xpu")


def _skip_reason() -> str | None:
    return env_skip_reason("vLLM 0.33.0", VENV, STAMP, "vllm-env", "tools/vllm_env.py")


pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


#: The processes of the differential: (platform, model or None for every model). CUDA's space is
#: split by model so that the longest run is not one process; each runs on its own core.
RUNS = (("cuda", "deepseek_v4_1"), ("cuda", "deepseek_v4"), ("rocm", None), ("cpu", None), ("xpu", None))


def _merge(parts: list[dict]) -> dict:
    """One platform's report from its per-model runs (counts added, lists joined)."""
    if len(parts) == 1:
        return parts[0]

    def add(a, b):
        if isinstance(a, dict):
            return {k: add(a.get(k), b.get(k)) if k in a and k in b else (a.get(k) if k in a else b.get(k))
                    for k in {*a, *b}}
        if isinstance(a, list) and isinstance(b, list):
            return a + b if a != b or not all(isinstance(x, str) for x in a) else a
        if isinstance(a, (int, float)) and not isinstance(a, bool):
            return a + b
        return a

    merged = parts[0]
    for part in parts[1:]:
        merged = add(merged, part)
    return merged


@pytest.fixture(scope="module")
def reports(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm33")
    rules = ["--rules", f"compat={COMPAT}"] if COMPAT.is_dir() else []

    def run(job):
        platform, model = job
        path = out / f"{platform}-{model or 'all'}.json"
        # its own cache directory: no run reads or writes the user's or another run's entries
        env = dict(os.environ, PYTHONPATH=str(ROOT), DSV4SEL_CACHE_DIR=str(out / f"cache-{platform}-{model}"))
        for name in ("DSV4SEL_RULES_PATH", "DSV4SEL_ALLOW_IMPL_MODULES", "VLLM_PLUGINS"):
            env.pop(name, None)
        proc = subprocess.run([str(PYTHON), str(ROOT / "tests" / "vllm33" / "differential.py"), platform,
                               *(["--model", model] if model else []), *rules, "--out", str(path)],
                              capture_output=True, text=True, env=env, cwd=ROOT)
        assert proc.returncode == 0, f"{platform}: differential run failed:\n{proc.stderr[-4000:]}"
        return platform, json.loads(path.read_text())

    # all at once: measured faster than two at a time on the 2-core machine (imports wait on the disk)
    with ThreadPoolExecutor(max_workers=len(RUNS)) as pool:
        done = list(pool.map(run, RUNS))
    found = {p: _merge([r for q, r in done if q == p]) for p in PLATFORMS}
    summary = {p: {"inputs": r["inputs"], "vllm": r["vllm"], "seconds": r["seconds"],
                   "layers": [r["layers_built"], r["layers_built_with_plugin"]],
                   "sets": {n: {"agree": s["agree"], "disagree": len(s["disagree"]),
                                "undecided": sum(s["undecided"].values())} for n, s in r["sets"].items()},
                   "plugin": {k: (len(v) if k == "disagree" else v) for k, v in r["plugin"].items()
                              if k != "replaced"},
                   "diff": {k: (v if isinstance(v, int) else len(v)) for k, v in r.get("diff", {}).items()}}
               for p, r in found.items()}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    sys.stderr.write("\nvLLM 0.33 differential: " + json.dumps(summary) + "\n")
    return found


def _first(rows, n=5):
    return "\n".join(json.dumps(r, sort_keys=True) for r in rows[:n])


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vllm_decides_on_every_platform(reports, platform):
    r = reports[platform]
    assert r["inputs"] > 0
    # vLLM's own code was really consulted: it builds layers and refuses inputs on every platform,
    # in its config classes, in its selection function or in the layer's __init__
    assert r["vllm"].get("select", 0) > 0 and r["layers_built"] > 0, r["vllm"]
    assert r["vllm"].get("reject_at_config", 0) > 0 and r["vllm"].get("reject_at_layer", 0) > 0, r["vllm"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_plugin_builds_what_the_shipped_rules_name(reports, platform):
    """With the plugin installed, every rejection comes when vLLM validates its config (before any
    layer, the cache config untouched), and on every other input vLLM's own call path builds the
    class the shipped rules name, with their cache dtype, torch dtype, rewrite, bytes per token
    (the real KV-cache spec) and block size (the platform's) -- on every input vLLM's config accepts."""
    p = reports[platform]["plugin"]
    assert p["disagree"] == [], f"{len(p['disagree'])} inputs differ, e.g.:\n{_first(p['disagree'])}"
    assert p["selects"] > 0 and p["rejects"] > 0, p
    assert p["agree"] + p["refused"] + p.get("vllm_raises_first", 0) == reports[platform]["inputs"]


@pytest.mark.parametrize("platform", PLATFORMS)
def test_plugin_replaces_the_functions_vllm_033_decides_in(reports, platform):
    replaced = reports[platform]["plugin"]["replaced"]
    select = {"cuda": ["vllm.models.deepseek_v4.nvidia.model._select_dsv4_attn_cls",
                       "vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls"],
              "rocm": ["vllm.models.deepseek_v41.amd.model._select_dsv4_attn_cls"],
              "cpu": ["vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls"],
              "xpu": ["vllm.models.deepseek_v41.nvidia.model._select_dsv4_attn_cls"]}[platform]
    hooks = [name for name in replaced if name.endswith(".check_and_update_config")]
    assert len(hooks) == 1 and hooks[0].startswith("vllm.platforms."), replaced
    assert sorted(set(replaced) - set(hooks)) == sorted(select + [
        "vllm.config.attention.AttentionConfig.__post_init__",
        "vllm.models.deepseek_v4.attention._resolve_dsv4_kv_cache_dtype",
        "vllm.models.deepseek_v41.attention._resolve_dsv4_kv_cache_dtype"])


def known_compat_difference(row) -> bool:
    """The inputs where the compat set cannot equal vLLM 0.33, and why (docs/vllm.md, "Not done"):

    * V4.0 FlashInfer's SM10x row layer given ``fp8_ds_mla`` or ``nvfp4_ds_mla``: vLLM keeps the
      rows' torch dtype (e4m3 or bf16) but sizes the KV-cache spec by the string (584 bytes): no
      consistent selection states that (``dsv4sel check`` refuses it, DSV408);
    * ``CPU_V4_MLA_SPARSE`` / ``XPU_V4_MLA_SPARSE`` named explicitly, which vLLM's AttentionConfig
      refuses: in the rules they are also the tables the platform default uses, and a table
      cannot tell an explicit name from the default (DSV309).
    """
    i, v = row["input"], row["vllm"]
    if (i["model"] == "deepseek_v4" and i["kv"] in ("fp8_ds_mla", "nvfp4_ds_mla") and v["kind"] == "select"
            and v["class"].endswith("nvidia.flashinfer_sparse:DeepseekV4FlashInferMLAAttention")):
        return True
    return i["backend"] in ("CPU_V4_MLA_SPARSE", "XPU_V4_MLA_SPARSE") and v.get("at") == "config"


@pytest.mark.skipif(not COMPAT.is_dir(), reason="rules/compat/vllm-0.33 is not in this checkout")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_compat_rules_equal_vllm_where_it_decides(reports, platform):
    s = reports[platform]["sets"]["compat"]
    other = [row for row in s["disagree"] if not known_compat_difference(row)]
    assert other == [], f"{len(other)} inputs differ, e.g.:\n{_first(other)}"
    assert s["agree"] > 0


@pytest.mark.skipif(not COMPAT.is_dir(), reason="rules/compat/vllm-0.33 is not in this checkout")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_compat_and_shipped_differ_only_by_the_deliberate_fixes(reports, platform):
    """`dsv4sel diff rules/compat/vllm-0.33 rules`, input by input: every changed input is one
    where vLLM decides, the compat set agrees with it and the shipped rules do not (or both reject
    by different rules), except the known compat differences."""
    r = reports[platform]
    d = r["diff"]
    known = {(row["input"]["model"], row["input"]["capability"], row["input"]["backend"], row["input"]["kv"])
             for row in r["sets"]["compat"]["disagree"] if known_compat_difference(row)}
    other = [row for row in d["changed_not_a_fix"] if tuple(row[:4]) not in known]
    assert other == [], other[:5]
    shipped = [row for row in r["sets"]["shipped"]["disagree"]
               if (row["input"]["model"], row["input"]["capability"], row["input"]["backend"],
                   row["input"]["kv"]) not in known]
    assert d["fixes"] == len(shipped)  # every shipped/vLLM difference is in the diff


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
