#!/usr/bin/env python3
"""Build a vLLM release's CPU test environment for the differential suite.

One recipe for every release the suite tests (RELEASES): torch 2.13.0 CPU (the local CPU wheel;
vLLM's own pin, torch==2.14.0, is never resolved), vllm, xgrammar and compressed-tensors with
--no-deps, then vLLM's pure-Python requirements read from the release's wheel METADATA (GPU/CUDA
packages and torch's companions skipped), then dsv4sel itself (editable). The venv, the torch pin
(a constraint file on every pip call), the wheel, the stamp and the step lines are
tools/host_env.py's, shared with tools/sglang_env.py.

    python3 tools/vllm_env.py [--version 0.33.0|0.34.0] [--venv PATH] [--wheel PATH] [--log FILE]

Each release has its own environment folder (.venv-vllm for 0.33.0, .venv-vllm-0.34 for 0.34.0),
so the suites of both releases run side by side. The wheel comes from $VLLM_WHEEL or --wheel when
given, else `pip download --no-deps vllm==VERSION` into the venv's download folder. Every step
prints one line when it starts and one when it ends; with --log, pip's output goes to the log.
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_env import ROOT, TORCH, main_guard, parse_args, prologue, step  # noqa: E402

#: Every release the suite builds an environment for, first the default: its venv folder.
RELEASES = {"0.33.0": ".venv-vllm", "0.34.0": ".venv-vllm-0.34"}
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


def _default_venv(argv: list[str]) -> str:
    """The release's own folder when --venv is not given (the release read before parsing)."""
    for i, word in enumerate(argv):
        if word == "--version" and i + 1 < len(argv):
            return RELEASES.get(argv[i + 1], RELEASES["0.33.0"])
        if word.startswith("--version="):
            return RELEASES.get(word.split("=", 1)[1], RELEASES["0.33.0"])
    return RELEASES["0.33.0"]


def main() -> int:
    args = parse_args(__doc__ or "", _default_venv(sys.argv[1:]), "VLLM_WHEEL", tuple(RELEASES))
    env = prologue(args, "vllm", args.version, STAMP_NAME)
    if env is None:
        return 0
    plain, no_deps = requirements(env.wheel)
    step(f"install vllm {args.version}, {', '.join(sorted(NO_DEPS))} (--no-deps)",
         *env.pip, "--no-deps", str(env.wheel), *no_deps)
    # torch stays pinned: the constraint file, and a requirement that asks for torch sees 2.13.0 installed.
    step(f"install vLLM's {len(plain)} pure-Python requirements (the longest step)", *env.pip, TORCH, *plain, *EXTRA)
    step("install dsv4sel (editable, --no-deps)", *env.pip, "--no-deps", "-e", str(ROOT))
    return env.finish("import torch, vllm; print(torch.__version__, vllm.__version__)")


if __name__ == "__main__":
    raise SystemExit(main_guard(main))
