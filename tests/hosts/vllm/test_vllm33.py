"""Differential suite against the real vLLM 0.33.0 (installed in .venv-vllm by `make vllm-env`).

Each platform runs in its own process of the vLLM environment (vLLM fixes its platform on first
import): ``tests/vllm33/differential.py PLATFORM`` enumerates the whole decision space there and
asks vLLM's own selection code, each rule set, and vLLM with the dsv4sel plugin installed. The
assertions here read its report. Skipped, with the reason, when the environment is missing
(``make test`` builds it first; a failed build leaves its log in .venv-vllm.log).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for _vllm33
import _vllm33  # noqa: E402
from _vllm33 import COMPAT, PLATFORMS, PYTHON, ROOT, RUNS  # noqa: E402,F401

_skip_reason = _vllm33.skip_reason
pytestmark = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


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
def reports(request, tmp_path_factory):
    """Each platform's differential report (the processes run side by side: tests/_vllm33.py)."""
    _vllm33.start(request.session, tmp_path_factory)
    done = [(platform, _vllm33.result(f"differential:{platform}:{model}")) for platform, model in RUNS]
    found = {p: _merge([r for q, r in done if q == p]) for p in PLATFORMS}
    summary = {p: {"inputs": r["inputs"], "vllm": r["vllm"], "seconds": r["seconds"],
                   "layers": [r["layers_built"], r["layers_built_with_plugin"]],
                   "sets": {n: {"agree": s["agree"], "disagree": len(s["disagree"]),
                                "undecided": sum(s["undecided"].values())} for n, s in r["sets"].items()},
                   "plugin": {k: (len(v) if k == "disagree" else v) for k, v in r["plugin"].items()
                              if k != "replaced"},
                   "diff": {k: (v if isinstance(v, int) else len(v)) for k, v in r.get("diff", {}).items()}}
               for p, r in found.items()}
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
        "vllm.v1.attention.backends.registry._AttentionBackendEnumMeta.__getitem__",
        "vllm.models.deepseek_v4.attention._resolve_dsv4_kv_cache_dtype",
        "vllm.models.deepseek_v41.attention._resolve_dsv4_kv_cache_dtype"])


@pytest.mark.skipif(not COMPAT.is_dir(), reason="rules/compat/vllm-0.33 is not in this checkout")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_compat_rules_equal_vllm_where_it_decides(reports, platform):
    s = reports[platform]["sets"]["compat"]
    assert s["disagree"] == [], f"{len(s['disagree'])} inputs differ, e.g.:\n{_first(s['disagree'])}"
    assert s["agree"] > 0


@pytest.mark.skipif(not COMPAT.is_dir(), reason="rules/compat/vllm-0.33 is not in this checkout")
@pytest.mark.parametrize("platform", PLATFORMS)
def test_compat_and_shipped_differ_only_by_the_deliberate_fixes(reports, platform):
    """`dsv4sel diff rules/compat/vllm-0.33 rules`, input by input: every changed input is one
    where vLLM decides, the compat set agrees with it and the shipped rules do not (or both reject
    by different rules)."""
    r = reports[platform]
    d = r["diff"]
    assert d["changed_not_a_fix"] == [], d["changed_not_a_fix"][:5]
    assert d["fixes"] == len(r["sets"]["shipped"]["disagree"])  # every shipped/vLLM difference is in the diff


@pytest.fixture(scope="module")
def hostcheck(request, tmp_path_factory):
    _vllm33.start(request.session, tmp_path_factory)
    return _vllm33.result("hostcheck")


def test_check_resolves_every_vllm_class_the_rules_name(hostcheck):
    """`dsv4sel check`'s host check against the installed vLLM 0.33: all 11 classes import
    (on a ROCm platform object, where vLLM's ROCm modules import too)."""
    assert hostcheck["host_findings"] == []
    assert len(hostcheck["classes"]) == 11, hostcheck["classes"]


def test_check_reports_a_vllm_class_that_does_not_exist(hostcheck):
    findings = hostcheck["with_pack"]["host_findings"]
    assert len(findings) == 1 and "has no class 'NoSuchAttention'" in findings[0], findings


def test_the_vocabulary_has_every_backend_and_kv_dtype_of_vllm_033(hostcheck):
    """Vocabulary sync: a new vLLM enum member or cache dtype cannot reach users undecided."""
    assert hostcheck["enum_missing"] == [] and hostcheck["cache_dtype_missing"] == [], hostcheck
