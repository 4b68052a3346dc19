"""Differential suite against the real SGLang 0.5.23 (installed in .venv-sglang by `make sglang-env`).

Each platform runs in its own process of the SGLang environment (SGLang fixes its platform on
first import): ``tests/sglang523/differential.py PLATFORM`` enumerates the whole host space there
and asks SGLang's own resolution pipeline, layout function, pool and backend factory, and the
compat rule set; then it loads the dsv4sel plugin the way SGLang does (``SGLANG_PLUGINS=dsv4sel``,
SGLang's ``load_plugins()``) and asks SGLang again on every input. SGLang is imported once per
platform process; each part of a pass and each scenario of ``tests/sglang523/plugin_checks.py``
(the version gate, the scheduler guards, XPU) runs in a forked child of it. The plugin pass runs
again under ``python -O`` (SGLang's asserts gone) on a sample that exercises every shipped rule and
translation row deciding some input; NPU runs in a process stubbed as an Ascend NPU;
``writer_bytes.py`` runs SGLang's own V4 writer and compares record sizes. The assertions here read their
reports. Skipped, with the reason, when the environment is missing (``make test`` builds it
first; a failed build leaves .venv-sglang.log).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from _host_env import env_skip_reason  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
VENV = Path(os.environ.get("DSV4SEL_SGLANG_VENV", ROOT / ".venv-sglang"))
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".dsv4sel-sglang-env"
COMPAT = ROOT / "rules" / "compat" / "sglang-0.5.23"
PLATFORMS = ("cuda", "rocm")
#: the plugin pass runs every input; under python -O every PLUGIN_EVERY_O-th (plus the first of
#: each deciding rule or row the stride misses)
PLUGIN_EVERY_O = 48
#: plugin_checks.py's scenarios, each in a child of the platform's process
SCENARIOS = {"cuda": ["--scenario", "gate-metadata", "--scenario", "gate-version", "--scenario", "guards",
                      "--scenario", "xpu", "--scenario", "roles"],
             "rocm": ["--scenario", "guards"]}
OTHER_SGLANG = "0.5.24"


def _skip_reason() -> str | None:
    return env_skip_reason("SGLang 0.5.23", VENV, STAMP, "sglang-env", "tools/sglang_env.py")


def test_the_compat_generator_is_not_stale():
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_compat.py"), "--host", "sglang", "--version",
                           "0.5.23", "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_compat_set_is_clean():
    from dsv4sel import verify

    report = verify([str(COMPAT)])
    assert report.ok and not report.findings, [f.message for f in report.findings][:5]


needs_env = pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")


def _other_sglang_metadata(root: Path) -> Path:
    """A ``sglang-0.5.24.dist-info`` that ``importlib.metadata`` finds before the installed one
    (the gate's child puts it ahead on sys.path), as a second SGLang install would be."""
    info = root / f"sglang-{OTHER_SGLANG}.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {OTHER_SGLANG}\n")
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every process of the suite, all at once: one per platform (SGLang imported once, then forked
    children for each part of the passes and each plugin scenario: tests/sglang523/forked.py), the
    two ``-O`` plugin passes, NPU and the writer."""
    out = tmp_path_factory.mktemp("sglang523")
    diff = str(ROOT / "tests" / "sglang523" / "differential.py")
    jobs = {}
    for platform in PLATFORMS:
        jobs[platform] = [diff, platform, "--compat", str(COMPAT), "--plugin-every", "1",
                          "--out", str(out / f"{platform}.json"), *SCENARIOS[platform]]
    jobs["cuda"] += ["--other-sglang", str(_other_sglang_metadata(out / "other"))]
    for platform in PLATFORMS:
        jobs[platform + "-O"] = ["-O", diff, platform, "--plugin-only", "--plugin-every", str(PLUGIN_EVERY_O),
                                 "--chunks", "1", "--workers", "1", "--out", str(out / f"{platform}-O.json")]
    jobs["npu"] = [str(ROOT / "tests" / "sglang523" / "plugin_checks.py"), "npu"]
    jobs["writer_bytes"] = [str(ROOT / "tests" / "sglang523" / "writer_bytes.py")]

    def run(name):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        env.pop("SGLANG_PLUGINS", None)
        t0 = time.time()
        # a generous bound: on the shared 2-core machine a process waits for the CPU as much as it runs
        proc = subprocess.run([str(PYTHON), *jobs[name]], capture_output=True, text=True, env=env, cwd=ROOT,
                              timeout=1800)
        assert proc.returncode == 0, f"{name}: failed:\n{proc.stderr[-4000:]}"
        if name in ("npu", "writer_bytes"):
            found = json.loads(proc.stdout.strip().splitlines()[-1])
        else:
            found = json.loads((out / f"{name}.json").read_text())
        return name, {**found, "wall": round(time.time() - t0, 1)}

    t0 = time.time()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        found = dict(pool.map(run, list(jobs)))
    summary = {"wall": round(time.time() - t0, 1)}
    for p in PLATFORMS:
        r, o = found[p], found[p + "-O"]
        summary[p] = {"inputs": r["inputs"], "stages": r["stages"], "compat": {
            "agree": r["compat"]["agree"], "disagree": r["compat"]["disagree"]},
            "plugin": r["plugin"]["counts"], "plugin -O": o["plugin"]["counts"],
            "seconds": r["wall"], "seconds -O": o["wall"]}
    (ROOT / ".pytest_cache").mkdir(exist_ok=True)
    (ROOT / ".pytest_cache" / "sglang523-summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    sys.stderr.write("\nSGLang 0.5.23 differential: " + json.dumps(summary) + "\n")
    return found


@pytest.fixture(scope="module")
def reports(runs):
    return {p: runs[p] for p in PLATFORMS}


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_sglang_decides_every_input_it_was_asked(reports, platform):
    r = reports[platform]
    assert r["inputs"] == sum(r["stages"].values()) > 0
    # SGLang serves some inputs, refuses some at start-up and some only after the weights load
    assert set(r["stages"]) == {"ok", "config", "late"}


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_compat_set_agrees_with_sglang_everywhere(reports, platform):
    c = reports[platform]["compat"]
    assert c["disagree"] == 0, json.dumps(c["examples"][:3], indent=1)
    assert c["agree"] == reports[platform]["inputs"]


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_reusing_sglangs_model_config_changes_no_outcome(reports, platform):
    """The suite hands SGLang the ModelConfig it built for an earlier input of the same model,
    speculative algorithm and device (tests/sglang523/oracle.py says why its result depends on no
    other input): on the first input of every such key and every 32nd input, in both passes,
    SGLang also ran with a ModelConfig built anew, and the outcomes are equal."""
    keys = 2 * 3 * (8 if platform == "cuda" else 9)  # models x (none, EAGLE, DSPARK) x devices
    for checked in (reports[platform]["model_config"], reports[platform]["plugin"]["model_config"]):
        assert checked["differ"] == []
        assert checked["keys"] == keys and checked["inputs"] >= reports[platform]["inputs"] // 32


@needs_env
def test_sglang_records_have_the_geometry_of_dsv4sel_layouts(runs):
    """SGLang's own KVLayout sizes (bytes per token, page bytes at 64/128/256 tokens) equal those of
    the dsv4sel layout that stores the same record; V4.1's two arrangements share one size."""
    sizes = runs["writer_bytes"]["sizes"]
    assert set(sizes) == {"V4", "V41", "V41_NEW", "V41_FP4", "UNIFORM_FP8"}
    for name, row in sizes.items():
        assert row["sglang"] == row["ours"], (name, row)
    assert sizes["V4"]["sglang"][0] == 584 and sizes["V4"]["sglang"][3] == 149_760


@needs_env
def test_sglangs_own_v4_writer_and_dsv4sel_codec_write_the_same_record(runs):
    """SGLang's ROCm V4 writer (a Triton kernel, run by Triton's interpreter on CPU) and dsv4sel's
    fp8_ds_mla codec put every byte of a 256-token page in the same place, write the same bf16
    RoPE bytes, and the same UE8M0 scale wherever a tile's amax is at least 448 x 1e-4; below
    that, SGLang's exponent is its amax floor's (the documented difference, docs/kernels.md)."""
    r = runs["writer_bytes"]
    assert r["fp8"] == "float8_e4m3fn"
    assert r["untouched_bytes_zero"] and r["rope_bytes_same"] and r["scale_pad_bytes_same"]
    assert r["big_tiles_same_scale"] == r["tiles_amax_at_least_0.0448"] > 0
    small = r["tiles"] - r["tiles_amax_at_least_0.0448"]
    assert r["small_tiles_sglang_exponent_is_amax_floored"] == small > 0
    assert r["small_tiles_same_scale"] < small  # the floors differ below 0.0448
    assert r["dsv4sel_reads_back_sglang_rope"]


def _plugin_agrees(report, whole: bool):
    p = report["plugin"]
    if whole:  # every input of the space the SGLang pass asked, not a sample
        assert p["inputs"] == report["inputs"] > 0
    assert p["counts"].get("wrong", 0) == 0, json.dumps(p["wrong"][:3], indent=1)
    assert sum(p["counts"].values()) == p["inputs"] > 0
    # SGLang serves some sampled inputs and dsv4sel refuses others, before the weights load
    assert p["counts"]["built the rules' class and settings"] > 0
    assert p["counts"]["refused before the weights load"] > 0
    # every rule and translation row that decides some input of the space was exercised
    assert p["covered"] == p["in_space"]


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_with_the_plugin_sglang_builds_the_rules_choice_or_stops_before_the_weights_load(reports, platform):
    p = reports[platform]["plugin"]
    # loaded by SGLang's own loader: its resolution hook wraps the step, its guards are applied
    assert p["resolution_hooks"] == ["dsv4sel.sglang_plugin.register.<locals>.hook"]
    assert len(p["guarded"]) == 3
    _plugin_agrees(reports[platform], whole=True)


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_plugin_gives_the_same_answers_under_python_O(runs, platform):
    """SGLang's asserts vanish under -O (it then accepts fp8_e5m2, bf16, mega and trtllm on SM90);
    the plugin decides without asserts, so SGLang still builds exactly the rules' choice (fix S5)."""
    r = runs[platform + "-O"]
    assert r["optimize"] == 1
    _plugin_agrees(r, whole=False)


@needs_env
@pytest.mark.parametrize("how", ["gate-metadata", "gate-version"])
def test_another_sglang_version_is_one_clear_error_and_nothing_is_patched(runs, how):
    r = runs["cuda"]["scenarios"][how]
    other = OTHER_SGLANG if how == "gate-metadata" else "0.5.22"
    # only the refusing resolution hook: no scheduler guard registered or applied
    assert r["resolution_hooks"] == ["register.<locals>.refuse"] and r["registered"] == r["patched"] == []
    assert r["stage"] == "config" and r["error"] == "PluginError"
    assert r["message"] == (f"dsv4sel's SGLang plugin supports sglang >=0.5.23,<0.5.24; this is sglang {other}. "
                            "Unset SGLANG_PLUGINS=dsv4sel or install a supported SGLang.")
    # the server args are the user's: no declaration, the layout variable as set, nothing published
    assert r["declared"] == [] and r["layout_env"] == "v41" and r["published"] is None


@needs_env
@pytest.mark.parametrize("platform", PLATFORMS)
def test_the_scheduler_guards_check_what_sglang_builds(runs, platform):
    r = runs[platform]["scenarios"]["guards"]
    assert r["registered"] == r["patched"] and len(r["patched"]) == 3
    assert r["untouched"]["stage"] == "ok" and r["untouched"]["cls"] == r["decided"]["class"]
    # the layout SGLang's own select_dsv4_kv_layout() returns is checked against the decision
    assert r["layout_restored"] == {"ok": repr(r["decided"]["kv_layout"].upper())}
    changed = r["layout_changed"]
    assert changed["error"] == "SelectionError" and r["decided"]["location"] in changed["message"]
    assert "the scheduler built the KV layout" in changed["message"]
    # the class SGLang's factory builds is checked against the decision
    changed = r["class_changed"]
    assert changed["error"] == "SelectionError" and "the scheduler built the attention backend" in changed["message"]


@needs_env
def test_a_pack_that_reads_the_role_under_disaggregation_gets_it_from_sglangs_disaggregation_mode(runs):
    r = runs["cuda"]["scenarios"]["roles"]
    # alone: the shipped default (FlashMLA, V4 pages); under PD the pack's rule sends it to FlashInfer's
    # bf16 rows, which SGLang cannot build: one refusal naming the rule's file, nothing published
    assert r["single"]["error"] is None and r["single"]["published"]["kv_layout"] == "v4", r["single"]
    assert r["single"]["published"]["class"].endswith("deepseek_v4_backend:DeepseekV4AttnBackend"), r["single"]
    pd = r["pd"]
    assert pd["stage"] == "config" and pd["error"] == "SelectionError", pd
    assert "the rules select FLASHINFER_MLA_SPARSE_DSV4 with the bf16_row cache" in pd["message"], pd
    assert pd["published"] is None, pd


@needs_env
def test_on_xpu_the_plugin_says_it_does_not_decide_and_leaves_sglang_alone(runs):
    r = runs["cuda"]["scenarios"]["xpu"]
    from dsv4sel.sglang_plugin import NOT_DECIDED

    assert ("WARNING", NOT_DECIDED % "xpu") in [tuple(x) for x in r["logged"]]
    assert r["declared"] == [] and r["published"] is None


@needs_env
def test_on_npu_sglang_decides_alone_through_its_own_npu_branch(runs):
    """A process stubbed as one Ascend NPU (``torch.npu``; ``torch_npu`` and Ascend's kernel packages
    stubbed): SGLang detects the NPU itself, its DeepSeek-V4 override takes its NPU branch (page size
    128, a bf16 cache, dsv4 for both phases) and its factory builds the Ascend class; the plugin,
    loaded by SGLang's loader, logs its one WARNING, declares and publishes nothing, and registers
    no scheduler guard (so SGLang has no hook to fail to apply)."""
    from dsv4sel.sglang_plugin import NOT_DECIDED

    r = runs["npu"]
    assert r["is_npu"] is True and r["device"] == "npu"
    assert r["logged"] == [["WARNING", NOT_DECIDED % "npu"]]
    assert r["declared"] == [] and r["published"] is None
    assert r["resolution_hooks"] == ["register.<locals>.hook"] and r["registered"] == r["patched"] == []
    assert r["hook_errors"] == []
    assert (r["page_size"], r["kv_cache_dtype"]) == (128, "bfloat16")
    assert r["attention_backend"] == r["prefill_attention_backend"] == r["decode_attention_backend"] == "dsv4"
    assert r["class"] == "sglang.srt.hardware_backend.npu.attention.ascend_dsv4_backend:DeepseekV4AscendAttnBackend"
