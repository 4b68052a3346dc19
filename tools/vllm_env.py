#!/usr/bin/env python3
"""Build the vLLM 0.33.0 test environment (.venv-vllm/) for the differential suite.

CPU only: torch 2.13.0 (the local CPU wheel; vLLM's own pin torch==2.14.0 is never resolved),
vllm, xgrammar and compressed-tensors with --no-deps, then vLLM's pure-Python requirements
read from the wheel's METADATA (GPU/CUDA packages and torch's companions skipped), then
dsv4sel itself (editable). A stamp file records a finished build; a later run with the stamp
present does nothing.

    python3 tools/vllm_env.py [--venv .venv-vllm] [--wheel PATH]

The wheel comes from $VLLM_WHEEL or --wheel when given, else `pip download --no-deps
vllm==0.33.0` into the venv's download folder.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import zipfile
from pathlib import Path

VLLM_VERSION = "0.33.0"
TORCH = "torch==2.13.0"
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


def run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=".venv-vllm")
    ap.add_argument("--wheel", default=os.environ.get("VLLM_WHEEL"))
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    venv = (root / args.venv).resolve()
    stamp = venv / STAMP_NAME
    if stamp.exists():
        print(f"{venv}: already built ({stamp.read_text().strip()})")
        return 0
    py = venv / "bin" / "python"
    if not py.exists():
        run(sys.executable, "-m", "venv", str(venv))
    pip = [str(py), "-m", "pip", "install", "-q", "--progress-bar", "off"]
    run(*pip, "--upgrade", "pip")
    if args.wheel:
        wheel = Path(args.wheel).resolve()
    else:
        dl = venv / "dl"
        dl.mkdir(exist_ok=True)
        found = sorted(dl.glob(f"vllm-{VLLM_VERSION}-*.whl"))
        if not found:
            run(str(py), "-m", "pip", "download", "-q", "--progress-bar", "off", "--no-deps",
                f"vllm=={VLLM_VERSION}", "-d", str(dl))
            found = sorted(dl.glob(f"vllm-{VLLM_VERSION}-*.whl"))
        wheel = found[0]
    plain, no_deps = requirements(wheel)
    run(*pip, TORCH)
    run(*pip, "--no-deps", str(wheel), *no_deps)
    # torch stays pinned: a requirement that asks for torch sees 2.13.0 already installed.
    run(*pip, TORCH, *plain, *EXTRA)
    run(*pip, "--no-deps", "-e", str(root))
    out = subprocess.run([str(py), "-c", "import torch, vllm; print(torch.__version__, vllm.__version__)"],
                         capture_output=True, text=True)
    if out.returncode != 0 or not out.stdout.split()[1:] == [VLLM_VERSION]:
        print(out.stdout + out.stderr, file=sys.stderr)
        print(f"error: {venv} does not import vllm {VLLM_VERSION}", file=sys.stderr)
        return 1
    stamp.write_text(f"torch {out.stdout.split()[0]} vllm {out.stdout.split()[1]}\n")
    print(f"{venv}: built ({stamp.read_text().strip()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
