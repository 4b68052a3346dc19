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


@pytest.mark.parametrize("name, platform, canonical", [("H100", "cuda", "9.0"), ("MI300X", "rocm", "gfx942")])
def test_a_gpu_name_alone_names_the_machine_and_every_kernel_line_reads_it(name, platform, canonical):
    r = run("doctor", "--capability", name, env=CPU)
    assert r.rc in (0, 1) and r.err == "", r
    assert re.search(rf"^  platform\s+{platform} \(from --capability {name}\)$", r.out, re.M), r.out
    assert re.search(rf"^  capability\s+{re.escape(canonical)} \(given {name}\)$", r.out, re.M), r.out
    assert f"kernels (for {platform} {canonical})" in r.out
    assert "not a compute capability" not in r.out and "availability check failed" not in r.out, r.out
    data = json.loads(run("doctor", "--capability", name, "--json", env=CPU).out)
    assert (data["machine"]["platform"], data["machine"]["capability"]) == (platform, canonical)
    assert not any("ValueError" in i["reason"] for i in data["impls"]), data["impls"]


def test_a_gpu_name_given_with_another_platform_names_its_own():
    r = run("doctor", "--platform", "cuda", "--capability", "MI300X", env=CPU)
    assert r.rc == 2 and r.out == "", r
    assert r.err.strip() == "dsv4sel doctor: error: MI300X is a ROCm GPU (gfx942): use --platform rocm"
    given = run("doctor", "--platform", "rocm", "--capability", "MI300X", env=CPU)
    assert re.search(r"^  capability\s+gfx942 \(given MI300X\)$", given.out, re.M), given.out
    assert "not a compute capability" not in given.out


def test_a_capability_that_spells_nothing_is_bad_input_even_over_a_detected_platform():
    r = run("doctor", "--capability", "H1OO", env=CPU)
    assert r.rc == 2 and r.out == "" and "'H1OO' is not a cpu capability" in r.err, r


def test_the_flashinfer_sm120_probe_says_flashinfer_is_not_installed_on_sm12x():
    r = run("doctor", "--capability", "RTX PRO 6000", env=CPU)
    assert re.search(r"^  flashinfer_sm120\s+missing \(probe dsv4sel\.kernels\.flashinfer:DeepseekV4FlashInferSM120Impl: "
                     r"flashinfer not installed: pip install", r.out, re.M), r.out
    # the default backend cannot start, and the doctor says so with exit 1
    assert re.search(r"^  auto\s+rejected\s.*flashinfer-sm12x-kernel-missing", r.out, re.M), r.out
    assert r.rc == 1 and r.out.rstrip().endswith("is rejected on cuda 12.0")
    probe = next(p for p in json.loads(run("doctor", "--capability", "12.0", "--json", env=CPU).out)["probes"]
                 if p["input"] == "flashinfer_sm120")
    assert (probe["value"], probe["asked"]) == ("missing", True) and probe["reason"].startswith("flashinfer not installed")


@pytest.mark.parametrize("capability", ["9.0", "10.0", "gfx942"])
def test_off_sm12x_the_flashinfer_sm120_probe_is_not_asked(capability):
    r = run("doctor", "--capability", capability, env=CPU)
    assert re.search(r"^  flashinfer_sm120\s+available \(not probed: it decides nothing on \S+ "
                     rf"{re.escape(capability)}\)$", r.out, re.M), r.out
    assert "flashinfer_sm120=" not in r.out  # nor shown among the inputs of the selection


def _fake_flashinfer(root, dispatch: str | None) -> dict[str, str]:
    """A FlashInfer package with the sparse decode entry point and, when ``dispatch`` is
    given, the SM120 DeepSeek-V4 dispatch table; the environment that imports it."""
    mla = root / "flashinfer" / "mla"
    mla.mkdir(parents=True)
    (root / "flashinfer" / "__init__.py").write_text("__version__ = '0.6.14'\n")
    (mla / "__init__.py").write_text("def trtllm_batch_decode_sparse_mla_dsv4(*args, **kwargs):\n    pass\n")
    if dispatch is not None:
        (mla / "_sparse_mla_sm120.py").write_text(f"_DECODE_DSV4_DISPATCH = {dispatch}\n")
    return environ(DSV4SEL_PLATFORM="cpu", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(root))


def test_the_flashinfer_sm120_probe_reads_the_installed_flashinfer_s_sm120_table(tmp_path):
    env = _fake_flashinfer(tmp_path, "{(32, 192): 'b', (32, 128): 'a'}")
    r = run("doctor", "--platform", "cuda", "--capability", "12.0", env=env)
    assert re.search(r"^  flashinfer_sm120\s+available \(probe .*SM120 DeepSeek-V4 decode for \(heads, top-k\) "
                     r"\(32, 128\), \(32, 192\)", r.out, re.M), r.out
    assert re.search(r"^  auto\s+FLASHINFER_MLA_SPARSE_DSV4\s", r.out, re.M), r.out
    assert r.rc == 0, r


def test_a_flashinfer_without_the_sm120_table_is_missing(tmp_path):
    r = run("doctor", "--platform", "cuda", "--capability", "12.0",
            env=_fake_flashinfer(tmp_path, dispatch=None))
    assert re.search(r"^  flashinfer_sm120\s+missing \(probe .*has no SM120 sparse MLA module", r.out, re.M), r.out
    assert r.rc == 1
