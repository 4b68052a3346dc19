#!/usr/bin/env python3
"""Build the SGLang 0.5.23 test environment (.venv-sglang/) for the SGLang differential suite.

CPU only. torch 2.13.0 is pinned by a constraint file on *every* pip call (SGLang's own pin,
torch==2.14.1, is never resolved; a plain `pip install torchvision` would replace torch with a
CUDA build). SGLang, triton and compressed-tensors go in with --no-deps; then the pure-Python part
of what SGLang's import chain needs for its argument resolution, its memory pool and its attention
registry (listed in IMPORT_CHAIN: not SGLang's whole METADATA, whose GPU packages - flashinfer,
sgl-kernel, flash-mla, deep-gemm, cutlass-dsl, ... - are compiled kernels the suite stubs), then
dsv4sel itself (editable, no deps). The venv, the pin, the wheel and the stamp are
tools/host_env.py's, shared with tools/vllm_env.py.

    python3 tools/sglang_env.py [--venv .venv-sglang] [--wheel PATH] [--log FILE]

The wheel comes from $SGLANG_WHEEL or --wheel when given, else `pip download --no-deps
sglang==0.5.23` into the venv's download folder.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_env import ROOT, TORCH, main_guard, parse_args, prologue, step  # noqa: E402

SGLANG_VERSION = "0.5.23"
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
#: compiles every module of the environment's site-packages for `python -O`, on every core
COMPILE_OPTIMIZED = ("import compileall, sysconfig; "
                     "compileall.compile_dir(sysconfig.get_paths()['purelib'], quiet=2, optimize=1, workers=0)")


def main() -> int:
    args = parse_args(__doc__ or "", ".venv-sglang", "SGLANG_WHEEL")
    env = prologue(args, "sglang", SGLANG_VERSION, STAMP_NAME)
    if env is None:
        return 0
    step(f"install sglang {SGLANG_VERSION}, triton, compressed-tensors (--no-deps)",
         *env.pip, "--no-deps", str(env.wheel), *NO_DEPS)
    step("install the import chain's pure-Python packages (the longest step)",
         *env.pip, TORCH, *IMPORT_CHAIN, *DSV4SEL_DEPS)
    step("install dsv4sel (editable, --no-deps)", *env.pip, "--no-deps", "-e", str(ROOT))
    # pip writes the bytecode plain `python` reads, not the `.opt-1.pyc` of `python -O` (the plugin
    # pass runs under -O too); where PYTHONDONTWRITEBYTECODE is set, as on the 2-core test machine, every -O
    # process would compile SGLang's whole import chain from source again (about 10 s of CPU each).
    # A file the compiler cannot read is left out, as Python leaves it until something imports it.
    step("compile the bytecode python -O reads", env.python, "-O", "-c", COMPILE_OPTIMIZED)
    return env.finish("import torch, importlib.metadata as m; print(torch.__version__, m.version('sglang'))")


if __name__ == "__main__":
    raise SystemExit(main_guard(main))
