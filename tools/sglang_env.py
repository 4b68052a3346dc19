#!/usr/bin/env python3
"""Build the SGLang 0.5.23 test environment (.venv-sglang/) for the SGLang differential suite.

CPU only. torch 2.13.0 is pinned by a constraint file on *every* pip call (SGLang's own pin,
torch==2.14.1, is never resolved; a plain `pip install torchvision` would replace torch with a
CUDA build). SGLang, triton and compressed-tensors go in with --no-deps; then the pure-Python part
of what SGLang's import chain needs for its argument resolution, its memory pool and its attention
registry (listed in IMPORT_CHAIN: not SGLang's whole METADATA, whose GPU packages - flashinfer,
sgl-kernel, flash-mla, deep-gemm, cutlass-dsl, ... - are compiled kernels the suite stubs), then
dsv4sel itself (editable, no deps). A stamp file records a finished build; a later run with the
stamp present does nothing.

    python3 tools/sglang_env.py [--venv .venv-sglang] [--wheel PATH]

The wheel comes from $SGLANG_WHEEL or --wheel when given, else `pip download --no-deps
sglang==0.5.23` into the venv's download folder.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

SGLANG_VERSION = "0.5.23"
TORCH = "torch==2.13.0"
# Installed without their dependencies: each declares torch (or a CUDA toolchain) itself.
NO_DEPS = ["triton", "compressed-tensors==0.18.0", "apache-tvm-ffi==0.1.11"]
# What `sglang.srt.server_args`, `sglang.srt.mem_cache.deepseek_v4_memory_pool` and
# `sglang.srt.layers.attention.attention_registry` import on a CPU machine (pins from SGLang's
# METADATA where it pins). Found by importing them in a bare environment until they import.
IMPORT_CHAIN = [
    "numpy", "msgspec", "pydantic", "transformers==5.19.0", "tokenizers==0.23.2", "psutil",
    "pyzmq>=25.1.2", "orjson", "pybase64", "pillow", "starlette", "fastapi", "aiohttp", "dill",
    "einops", "openai==2.8.0", "partial_json_parser", "IPython", "gguf", "sentencepiece==0.2.1",
    "requests", "packaging", "regex", "tqdm", "setproctitle", "uvloop", "pyyaml", "safetensors",
    "huggingface_hub", "loguru", "python-multipart", "interegular", "prometheus-client>=0.20.0",
    "xxhash", "scipy",
]
#: dsv4sel's own requirements (it is installed editable with --no-deps).
DSV4SEL_DEPS = ["pyyaml>=6.0", "jsonschema>=4.18"]
STAMP_NAME = ".dsv4sel-sglang-env"


def run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--venv", default=".venv-sglang")
    ap.add_argument("--wheel", default=os.environ.get("SGLANG_WHEEL"))
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
    venv.mkdir(exist_ok=True)
    constraints = venv / "constraints.txt"
    # Every pip call below carries this: nothing may resolve another torch.
    constraints.write_text(f"{TORCH}\n")
    pip = [str(py), "-m", "pip", "install", "-q", "--progress-bar", "off", "-c", str(constraints)]
    run(*pip, "--upgrade", "pip")
    if args.wheel:
        wheel = Path(args.wheel).resolve()
    else:
        dl = venv / "dl"
        dl.mkdir(exist_ok=True)
        found = sorted(dl.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        if not found:
            run(str(py), "-m", "pip", "download", "-q", "--progress-bar", "off", "--no-deps",
                "-c", str(constraints), f"sglang=={SGLANG_VERSION}", "-d", str(dl))
            found = sorted(dl.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
        wheel = found[0]
    run(*pip, TORCH)
    run(*pip, "--no-deps", str(wheel), *NO_DEPS)
    run(*pip, TORCH, *IMPORT_CHAIN, *DSV4SEL_DEPS)
    run(*pip, "--no-deps", "-e", str(root))
    out = subprocess.run([str(py), "-c", "import torch, importlib.metadata as m; "
                          "print(torch.__version__, m.version('sglang'))"], capture_output=True, text=True)
    words = out.stdout.split()
    if out.returncode != 0 or words[1:] != [SGLANG_VERSION] or not words[0].startswith("2.13.0"):
        print(out.stdout + out.stderr, file=sys.stderr)
        print(f"error: {venv} does not hold torch 2.13.0 and sglang {SGLANG_VERSION}", file=sys.stderr)
        return 1
    stamp.write_text(f"torch {words[0]} sglang {words[1]}\n")
    print(f"{venv}: built ({stamp.read_text().strip()})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
