"""`dsv4sel doctor` on this machine (a CPU box: DSV4SEL_PLATFORM=cpu or --platform)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

import dsv4sel

from _cli import REPO, environ, run

CPU = environ(DSV4SEL_PLATFORM="cpu", CUDA_VISIBLE_DEVICES="")


def test_doctor_on_this_cpu_machine():
    r = run("doctor", env=CPU)
    assert r.rc == 0, r
    assert r.err == ""
    out = r.out
    assert re.search(r"^  platform\s+cpu \(from DSV4SEL_PLATFORM\)$", out, re.M), out
    assert re.search(r"^  torch\s+\d+\.\d+", out, re.M)
    # the rules' choice for auto (listed first) and for every other kv dtype
    selection = out[out.index("selection on cpu"):out.index("\nkernels")].splitlines()
    assert re.match(r"\s+auto\s+CPU_V4_MLA_SPARSE\s+fp8_ds_mla\s+fp8_ds_mla\s+cpu-fp8\s+rules/cpu\.yaml:\d+$",
                    selection[2]), selection
    rules = dsv4sel.load_rules()
    assert len(selection) == 2 + len(rules.values("kv_cache_dtype")) + 1  # title, header, one per dtype, hint
    assert re.search(r"^\s+bfloat16\s+rejected\s", out, re.M)
    # every impl of the rules, with a verdict and a reason
    assert re.search(r"^  ok\s+dsv4sel\.kernels\.reference:DeepseekV4ReferenceSparseImpl\s+CPU_V4_MLA_SPARSE",
                     out, re.M), out
    assert re.search(r"^  unavailable\s+dsv4sel\.kernels\.flashmla:DeepseekV4FlashMLASparseImpl", out, re.M)
    assert "runs on NVIDIA GPUs" in out
    assert out.rstrip().splitlines()[-1].startswith("ok: CPU_V4_MLA_SPARSE")


def test_doctor_json_agrees_with_the_exit_status():
    r = run("doctor", "--json", env=CPU)
    data = json.loads(r.out)
    assert list(data) == ["version", "ok", "machine", "query", "probes", "messages", "selections", "impls"]
    assert data["machine"]["platform"] == "cpu" and data["machine"]["source"] == "DSV4SEL_PLATFORM"
    assert data["selections"][0]["kv_cache_dtype"] == "auto"
    assert data["selections"][0]["backend"] == "CPU_V4_MLA_SPARSE"
    ref = next(i for i in data["impls"] if i["impl"].endswith(":DeepseekV4ReferenceSparseImpl"))
    assert ref["available"] is True and data["ok"] is True and r.rc == 0
    for probe in data["probes"]:  # pack inputs filled from their probe class, with the reason
        assert probe["value"] and probe["reason"]


def test_asking_about_another_machine():
    r = run("doctor", "--platform", "cuda", "--capability", "9.0", "--json", env=CPU)
    data = json.loads(r.out)
    assert data["machine"]["platform"] == "cuda" and data["machine"]["source"] == "--platform"
    auto = data["selections"][0]
    assert (auto["kv_cache_dtype"], auto["backend"]) == ("auto", "FLASHMLA_SPARSE_DSV4")
    flashmla = next(i for i in data["impls"] if i["impl"] == auto["impl"])
    # exit 0 exactly when the chosen impl can run (FlashMLA is not installed on a CPU box)
    assert data["ok"] is flashmla["available"] and r.rc == (0 if flashmla["available"] else 1)
    text = run("doctor", "--platform", "cuda", "--capability", "9.0", env=CPU)
    assert "kernels (for cuda 9.0)" in text.out and "selection on cuda 9.0" in text.out


def test_an_undetectable_platform_is_reported_not_crashed():
    r = run("doctor", env=environ(CUDA_VISIBLE_DEVICES="", HIP_VISIBLE_DEVICES=""))
    if "not detected" not in r.out:  # pragma: no cover - a machine with a visible GPU
        pytest.skip("torch sees a GPU here, so the platform is detected")
    assert r.rc == 1
    assert "--platform P [--capability C]" in r.out
    assert "kernels (for this machine)" in r.out  # the library checks still run
    assert "not ok: the platform is unknown" in r.out


def test_without_torch_the_doctor_says_so():
    code = ("import sys; sys.modules['torch'] = None\n"  # makes `import torch` raise ImportError
            "from dsv4sel.cli import main\n"
            "sys.exit(main(['doctor', '--platform', 'cpu']))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=CPU, cwd=REPO)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert re.search(r"^  torch\s+torch not installed$", proc.stdout, re.M), proc.stdout
    assert re.search(r"^  unavailable\s+dsv4sel\.kernels\.reference:DeepseekV4ReferenceSparseImpl", proc.stdout, re.M)
    assert proc.returncode == 1  # the reference impl needs torch


def test_bad_platform_exits_2_with_the_nearest():
    r = run("doctor", "--platform", "cdua", env=CPU)
    assert r.rc == 2 and "did you mean 'cuda'" in r.err and r.out == ""
