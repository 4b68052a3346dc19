"""Hardware stand-ins for running SGLang 0.5.23's DeepSeek-V4 selection code on a CPU machine.

Only two kinds of thing are replaced, both before the first SGLang import, one platform per
process (SGLang reads `torch.version.hip` and friends into module constants at import):

- compiled kernel packages SGLang imports but this machine cannot load or does not have
  (`sgl_kernel`, `flashinfer`, `flash_mla`, `deep_gemm`, `deep_ep`, `aiter`, `tilelang`, ...): empty modules whose attributes are inert callables;
- torch's and triton's device facts (triton's active driver's target): `torch.cuda.is_available`, the capability, `torch.version.cuda/hip`,
  `get_device_properties` (gcnArchName), device count and memory.

Everything SGLang decides with stays SGLang's own code.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import types

#: Top-level names of compiled kernel distributions that SGLang's import chain touches
#: (torchvision: its C++ ops are built against another torch; SGLang's multimodal utilities
#: import it unconditionally and the DeepSeek-V4 selection never uses it).
KERNEL_PACKAGES = ("torchvision", "sgl_kernel", "flashinfer", "flash_mla", "deep_gemm", "deep_ep", "aiter",
                   "tilelang", "sgl_flash_mla")
#: Ascend's compiled packages, stubbed only in a process stubbed as an NPU (``install("npu")``):
#: ``torch_npu`` is the device plugin itself (its import registers ``torch.npu``).
NPU_PACKAGES = ("torch_npu", "sgl_kernel_npu", "custom_ops", "mindie_turbo", "triton_ascend")


class _Inert(types.ModuleType):
    """A module whose every missing attribute is another inert object (kernels are never called:
    SGLang only imports them at config time)."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        child = _Inert(f"{self.__name__}.{name}")
        child.__path__ = []
        setattr(self, name, child)
        return child

    def __call__(self, *a, **k):  # decorators and factories
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]
        return _Inert(f"{self.__name__}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __iter__(self):
        return iter(())

    def __bool__(self):
        return False


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, packages=KERNEL_PACKAGES):
        self.packages = packages

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        mod = _Inert(spec.name)
        mod.__path__ = []
        return mod

    def exec_module(self, module):
        pass


class _Props:
    def __init__(self, name, arch, major, minor):
        self.name, self.gcnArchName, self.major, self.minor = name, arch, major, minor
        self.total_memory = 80 * 2**30
        self.multi_processor_count = 132
        self.L2_cache_size = 50 * 2**20
        self.warp_size = 64 if arch else 32


_TARGET: list = [None]


def install(platform: str, capability: tuple[int, int] | None = None, arch: str | None = None) -> None:
    """Make this process look like one GPU of ``platform`` (cuda, rocm, xpu, npu)."""
    import torch
    # transformers records at import whether torchvision is installed; it must see the truth
    # (absent) before the stand-in below exists, or it parses the stand-in's missing version.
    import transformers.utils.import_utils  # noqa: F401

    sys.meta_path.insert(0, _Finder(KERNEL_PACKAGES + (NPU_PACKAGES if platform == "npu" else ())))

    gpu = platform in ("cuda", "rocm")
    major, minor = capability or ((9, 4) if platform == "rocm" else (0, 0))
    torch.version.cuda = "13.0" if platform == "cuda" else None
    torch.version.hip = "7.0.0" if platform == "rocm" else None
    if platform == "rocm":
        # tvm_ffi, which SGLang imports, builds a DLPack addon for a ROCm torch on first import, in
        # a subprocess, into ~/.cache/tvm-ffi: on this machine (no ROCm) the build fails after a few
        # seconds of CPU and tvm_ffi goes on without it. Its own switch skips the attempt; the end
        # state is the same (no addon; torch 2.13 has the DLPack exchange API and __cuda_stream__).
        os.environ.setdefault("TVM_FFI_DISABLE_TORCH_C_DLPACK", "1")
    torch.cuda.is_available = lambda: gpu
    torch.cuda.is_initialized = lambda: gpu
    torch.cuda.device_count = lambda: 1 if gpu else 0
    torch.cuda.current_device = lambda: 0
    props = _Props("AMD Instinct" if platform == "rocm" else "NVIDIA GPU", arch or "", major, minor)
    torch.cuda.get_device_properties = lambda *_a, **_k: props
    torch.cuda.get_device_capability = lambda *_a, **_k: (major, minor)
    torch.cuda.get_device_name = lambda *_a, **_k: props.name
    torch.cuda.mem_get_info = lambda *_a, **_k: (70 * 2**30, 80 * 2**30)
    # triton asks the driver library which GPU it would compile for; answer as that GPU would
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    target = GPUTarget("hip", arch or "gfx942", 64) if platform == "rocm" else GPUTarget("cuda", major * 10 + minor, 32)

    class _Driver:
        def get_current_target(self):
            return target

        def get_current_device(self):
            return 0

        def get_active_torch_device(self):
            return torch.device("cuda", 0)

    driver.set_active(_Driver())
    _TARGET[0] = target
    # SGLang reads the GPU memory size from nvidia-smi / rocminfo subprocesses; answer 80 GiB
    # (before anything imports these by name)
    from sglang.srt.utils import common

    common.get_nvgpu_memory_capacity = lambda: 81920.0
    common.get_amdgpu_memory_capacity = lambda: 196608.0
    if platform == "xpu":
        torch.xpu.is_available = lambda: True
        torch.xpu.device_count = lambda: 1
    if platform == "npu":
        _npu(torch)


def _npu(torch) -> None:
    """``torch.npu`` as torch_npu registers it, answering as one Ascend device (SGLang's
    ``is_npu()`` is ``hasattr(torch, "npu") and torch.npu.is_available()``)."""
    npu = types.ModuleType("torch.npu")
    npu.is_available = lambda: True
    npu.device_count = lambda: 1
    npu.current_device = lambda: 0
    npu.set_device = lambda *_a, **_k: None
    npu.get_device_name = lambda *_a, **_k: "Ascend910B"
    npu.mem_get_info = lambda *_a, **_k: (60 * 2**30, 64 * 2**30)
    npu.get_device_properties = lambda *_a, **_k: _Props("Ascend910B", "", 0, 0)
    npu.synchronize = lambda *_a, **_k: None
    npu.empty_cache = lambda *_a, **_k: None
    torch.npu = npu
    sys.modules["torch.npu"] = npu


def set_capability(capability: tuple[int, int], arch: str | None = None) -> None:
    """Change the stubbed GPU within a process and forget SGLang's memoized device answers
    (its ``is_sm*_supported`` / ``is_gfx95_supported`` are lru_caches)."""
    import torch

    major, minor = capability
    torch.cuda.get_device_capability = lambda *_a, **_k: (major, minor)
    props = torch.cuda.get_device_properties(0)
    props.major, props.minor, props.gcnArchName = major, minor, arch or ""
    from triton.backends.compiler import GPUTarget

    if _TARGET[0] is not None:
        old = _TARGET[0]
        new = GPUTarget(old.backend, arch if old.backend == "hip" else major * 10 + minor, old.warp_size)
        object.__setattr__(old, "arch", new.arch)
    for name, mod in list(sys.modules.items()):
        if not name.startswith("sglang"):
            continue
        for value in list(vars(mod).values()):
            # exact type test: SGLang's lazy-import proxies load their module on any getattr
            if type(value) is functools._lru_cache_wrapper:
                value.cache_clear()
