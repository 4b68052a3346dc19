"""Stand-ins for what vLLM 0.33 reads from hardware, for a CPU machine (used in .venv-vllm only).

Only hardware is stubbed: the compiled CUDA extension modules (they need libcuda), the three
import-time CUTLASS feature probes registered as ``torch.ops._C`` ops, the flash-attention and
XPU kernel packages, and the device capability / ROCm gfx arch. Everything that decides --
vLLM's selection functions, its resolvers, its config classes and layer classes -- is vLLM's
own code, imported from the installed wheel. ``setup(platform)`` must run before any other
vLLM import: vLLM fixes its platform object on first use.
"""
from __future__ import annotations

import sys
import types

#: What the stubbed device reports; the oracle sets it per input.
DEVICE = {"capability": (9, 0), "gcn_arch": "gfx942:sramecc+:xnack-"}
_done: list[str] = []


class _HardwareModule(types.ModuleType):
    """A module whose every function needs hardware: calling one raises."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def needs_hardware(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{name} needs a GPU (stubbed on this CPU machine)")

        needs_hardware.__name__ = name
        return needs_hardware


def setup(platform: str) -> None:
    if _done:
        if _done[0] != platform:
            raise RuntimeError(f"vLLM's platform is already {_done[0]} in this process")
        return
    for name in ("vllm._C_stable_libtorch", "vllm._moe_C_stable_libtorch", "vllm._C"):
        sys.modules.setdefault(name, types.ModuleType(name))
    xpu = ("_C", "_moe_C", "_xpu_C", "xpumem_allocator", "fused_moe_interface", "flash_attn_interface",
           "rotary")
    for name in ("vllm.vllm_flash_attn", "vllm_xpu_kernels", *(f"vllm_xpu_kernels.{m}" for m in xpu)):
        sys.modules.setdefault(name, _HardwareModule(name))
    sys.modules["vllm_xpu_kernels"].__path__ = []  # a package, so `import vllm_xpu_kernels._C` works
    import torch

    lib = torch.library.Library("_C", "FRAGMENT")
    for op in ("cutlass_scaled_mm_supports_fp4", "cutlass_scaled_mm_supports_fp8",
               "cutlass_scaled_mm_supports_block_fp8"):
        lib.define(f"{op}(int cuda_device_capability) -> bool")
        lib.impl(op, lambda cap: False, "CompositeExplicitAutograd")
    _keep.append(lib)

    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability

    def capability(cls, device_id: int = 0):
        cap = DEVICE["capability"]
        return None if cap is None else DeviceCapability(*cap)

    if platform == "cuda":
        from vllm.platforms.cuda import CudaPlatform as cls
    elif platform == "rocm":
        real = torch.cuda.get_device_properties
        torch.cuda.get_device_properties = lambda *a, **k: types.SimpleNamespace(
            gcnArchName=DEVICE["gcn_arch"], name="stub", total_memory=0)
        try:
            import vllm.platforms.rocm as rocm
        finally:
            torch.cuda.get_device_properties = real
        cls = rocm.RocmPlatform
    elif platform == "cpu":
        from vllm.platforms.cpu import CpuPlatform as cls
    elif platform == "xpu":
        from vllm.platforms.xpu import XPUPlatform as cls
    else:
        raise ValueError(platform)
    if platform in ("cuda", "rocm"):
        cls.get_device_capability = classmethod(capability)
    platforms.current_platform = cls()
    _done.append(platform)


def set_device(capability: str | None, platform: str) -> None:
    """Make the stubbed device report a dsv4sel capability value."""
    if platform == "cuda":
        DEVICE["capability"] = None if capability in (None, "unknown") else tuple(
            int(x) for x in capability.split("."))
    elif platform == "rocm":
        import vllm.platforms.rocm as rocm

        arch = "" if capability in (None, "unknown") else capability
        DEVICE["gcn_arch"] = arch
        rocm._GCN_ARCH = arch


_keep: list = []
