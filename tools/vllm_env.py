#!/usr/bin/env python3
"""Build a vLLM release's CPU test environment for the differential suite.

One recipe for every release dsv4sel supports (the host registry's, dsv4sel/dsv4/host_registry.py):
torch 2.13.0 CPU (the local CPU wheel; vLLM's own pin, torch==2.14.0, is never resolved), vllm,
xgrammar and compressed-tensors with --no-deps, then vLLM's pure-Python requirements read from the
release's wheel METADATA (GPU/CUDA packages and torch's companions skipped), then dsv4sel itself
(editable), and last vLLM's cache of the model classes the suite builds, in the environment's own
folder (:func:`cache_root`). The venv, the torch pin (a constraint file on every pip call), the
wheel, the stamp and the step lines are tools/host_env.py's, shared with tools/sglang_env.py.

    python3 tools/vllm_env.py [--version 0.33.0|0.34.0] [--venv PATH] [--wheel PATH] [--log FILE]
    python3 tools/vllm_env.py --all     # every release not built yet (make vllm-env)

Each release has its own environment folder (:func:`venv_for`: .venv-vllm for 0.33.0,
.venv-vllm-0.34 for 0.34.0), so the suites of all releases run side by side. The wheel comes from
$VLLM_WHEEL or --wheel when given, else `pip download --no-deps vllm==VERSION` into the venv's
download folder. Every step prints one line when it starts and one when it ends; with --log (and
always with --all, to FOLDER.log), pip's output goes to the log. --all builds one release after
the other; a release whose build fails is one warning line naming its log (its tests skip with
that reason), and the others are still built: it exits 0.
"""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from host_env import ROOT, TORCH, StepFailed, main_guard, parse_args, prologue, step  # noqa: E402

from dsv4sel.dsv4.host_registry import HOSTS  # noqa: E402

#: Every vLLM release dsv4sel supports, oldest (the default) first.
VERSIONS = tuple(r.version for r in HOSTS["vllm"].releases)
#: The environment 0.33.0's suite had before there was a second release keeps its name.
LEGACY_VENVS = {"0.33.0": ".venv-vllm"}
# Requirements that need a GPU toolchain or drag in another torch; vLLM's DSv4 selection and
# layer construction import none of them on a CPU machine.
SKIP = {
    "torch", "torchaudio", "torchvision", "torchcodec", "pynvvideocodec", "flashinfer-python",
    "tilelang", "nvidia-cudnn-frontend", "nvtx", "fastsafetensors",
    "instanttensor", "nvidia-cutlass-dsl", "quack-kernels", "tokenspeed-mla", "humming-kernels",
}
# Requirements that declare torch themselves: installed without their dependencies.
NO_DEPS = {"xgrammar", "compressed-tensors"}
# What those two need besides torch (triton is optional in vLLM: it has a placeholder).
EXTRA = ["loguru"]
STAMP_NAME = ".dsv4sel-vllm-env"
#: The model classes the suite's vLLM processes build (the architectures of its tiny configs).
SUITE_ARCHITECTURES = ("DeepseekV4ForCausalLM", "LlamaForCausalLM")
# vLLM's model registry learns each model class (LoRA support, pooling, ...) in a subprocess that
# imports vLLM whole, and remembers it under VLLM_CACHE_ROOT by a hash of the class's source files.
# Asked once here, for the environment's own cache (cache_root), so no process of the suite asks again.
_INSPECT = ("import sys\nfrom vllm.model_executor.models.registry import ModelRegistry\n"
            "for arch in sys.argv[1:]:\n    assert ModelRegistry._try_inspect_model_cls(arch), arch\n")


def _canon(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def requirements(wheel: Path) -> tuple[list[str], list[str]]:
    """(plain, no_deps) requirement strings from the wheel's METADATA, markers evaluated."""
    from packaging.requirements import Requirement

    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        text = zf.read(meta).decode()
    plain, no_deps = [], []
    for line in text.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        req = Requirement(line.split(":", 1)[1].strip())
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = _canon(req.name)
        if name in SKIP:
            continue
        spec = str(req).split(";")[0].strip()
        (no_deps if name in NO_DEPS else plain).append(spec)
    return plain, no_deps


def venv_for(version: str) -> str:
    """A release's environment folder, relative to the repository (``.venv-vllm-0.34``)."""
    return LEGACY_VENVS.get(version, ".venv-vllm-" + ".".join(version.split(".")[:2]))


def cache_root(venv: Path) -> Path:
    """``VLLM_CACHE_ROOT`` for the vLLM processes the suite runs in ``venv``: a folder of that
    environment's own. Releases that shared the user's ``~/.cache/vllm`` overwrote each other's
    entry for the same model class (its source differs), so every process learnt it again; and the
    suite leaves the user's own cache alone."""
    return Path(venv) / "vllm-cache"


def _default_venv(argv: list[str]) -> str:
    """The release's own folder when --venv is not given (the release read before parsing)."""
    for i, word in enumerate(argv):
        if word == "--version" and i + 1 < len(argv):
            return venv_for(argv[i + 1])
        if word.startswith("--version="):
            return venv_for(word.split("=", 1)[1])
    return venv_for(VERSIONS[0])


def build_all() -> int:
    """Every release whose environment is not built, one after the other, each in a fresh process
    (logs to FOLDER.log); a failed one is a warning line and the rest go on."""
    for version in VERSIONS:
        venv = venv_for(version)
        if (ROOT / venv / STAMP_NAME).exists():
            continue
        proc = subprocess.run([sys.executable, __file__, "--version", version, "--venv", venv, "--log", f"{venv}.log"])
        if proc.returncode != 0:
            print(f"warning: building {venv} failed (see {venv}.log); the vLLM {version} tests will skip",
                  flush=True)
    return 0


def main() -> int:
    args = parse_args(__doc__ or "", _default_venv(sys.argv[1:]), "VLLM_WHEEL", VERSIONS)
    if args.all:
        return build_all()
    env = prologue(args, "vllm", args.version, STAMP_NAME)
    if env is None:
        return 0
    plain, no_deps = requirements(env.wheel)
    step(f"install vllm {args.version}, {', '.join(sorted(NO_DEPS))} (--no-deps)",
         *env.pip, "--no-deps", str(env.wheel), *no_deps)
    # torch stays pinned: the constraint file, and a requirement that asks for torch sees 2.13.0 installed.
    step(f"install vLLM's {len(plain)} pure-Python requirements (the longest step)", *env.pip, TORCH, *plain, *EXTRA)
    step("install dsv4sel (editable, --no-deps)", *env.pip, "--no-deps", "-e", str(ROOT))
    try:
        step("fill vLLM's model-class cache for the suite's processes", "env",
             f"VLLM_CACHE_ROOT={cache_root(env.venv)}", env.python, "-c", _INSPECT, *SUITE_ARCHITECTURES)
    except StepFailed:  # the suite still runs: its vLLM processes each learn the classes themselves
        print(f"warning: vLLM's model-class cache is not filled; the {args.version} suite runs slower, "
              "deciding the same", flush=True)
    return env.finish("import torch, vllm; print(torch.__version__, vllm.__version__)")


if __name__ == "__main__":
    raise SystemExit(main_guard(main))
