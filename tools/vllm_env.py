#!/usr/bin/env python3
"""Build the vLLM 0.33.0 test environment (.venv-vllm/) for the differential suite.

CPU only: torch 2.13.0 (the local CPU wheel; vLLM's own pin torch==2.14.0 is never resolved),
vllm, xgrammar and compressed-tensors with --no-deps, then vLLM's pure-Python requirements
read from the wheel's METADATA (GPU/CUDA packages and torch's companions skipped), then
dsv4sel itself (editable). The venv, the torch pin (a constraint file on every pip call), the
wheel and the stamp are tools/host_env.py's, shared with tools/sglang_env.py.

    python3 tools/vllm_env.py [--venv .venv-vllm] [--wheel PATH]

The wheel comes from $VLLM_WHEEL or --wheel when given, else `pip download --no-deps
vllm==0.33.0` into the venv's download folder.
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_env import ROOT, TORCH, prologue, run  # noqa: E402

VLLM_VERSION = "0.33.0"
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


def main() -> int:
    env = prologue(__doc__, "vllm", VLLM_VERSION, ".venv-vllm", "VLLM_WHEEL", STAMP_NAME)
    if env is None:
        return 0
    plain, no_deps = requirements(env.wheel)
    run(*env.pip, "--no-deps", str(env.wheel), *no_deps)
    # torch stays pinned: the constraint file, and a requirement that asks for torch sees 2.13.0 installed.
    run(*env.pip, TORCH, *plain, *EXTRA)
    run(*env.pip, "--no-deps", "-e", str(ROOT))
    return env.finish("import torch, vllm; print(torch.__version__, vllm.__version__)")


if __name__ == "__main__":
    raise SystemExit(main())
