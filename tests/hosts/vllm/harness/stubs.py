"""Stand-ins for what vLLM reads from hardware, for a CPU machine (runs in a release's vLLM environment only).

Only hardware is stubbed: the compiled CUDA extension modules (they need libcuda), the three
import-time CUTLASS feature probes registered as ``torch.ops._C`` ops, the flash-attention and
XPU kernel packages, the FlashInfer package (its kernels need a GPU; whether its SM120 decode
dispatch table has DeepSeek-V4's specialization is the input ``flashinfer_sm120``, see
:data:`FLASHINFER_SM120`), and the device capability / ROCm gfx arch. Everything that decides --
vLLM's selection functions, its resolvers, its config classes and layer classes -- is vLLM's
own code, imported from the installed wheel. ``setup(platform)`` must run before any other
vLLM import: vLLM fixes its platform object on first use. A release that needs a stand-in of its
own has it in its folder (``tests/hosts/vllm/v0_XX/stubs.py``, a ``setup(platform)`` run last):
:func:`release_folder` finds it from the installed vLLM's version.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import types
from pathlib import Path

#: What the stubbed device reports; the oracle sets it per input.
DEVICE = {"capability": (9, 0), "gcn_arch": "gfx942:sramecc+:xnack-"}
#: Does the installed (stand-in) FlashInfer build have the SM120 DeepSeek-V4 decode
#: specialization? The input ``flashinfer_sm120``; set per input by the oracle.
FLASHINFER_SM120 = {"available": True}
_done: list[str] = []


class NeedsHardware(RuntimeError):
    """A stubbed kernel was called: this machine has no GPU (never a decision of vLLM's)."""


class _HardwareModule(types.ModuleType):
    """A module whose every function needs hardware: calling one raises :class:`NeedsHardware`."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)

        def needs_hardware(*args, **kwargs):
            raise NeedsHardware(f"{self.__name__}.{name} needs a GPU (stubbed on this CPU machine)")

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
    if platform == "cuda":
        _flashinfer()
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
    _release_stubs(platform)


def release_folder() -> Path:
    """The test folder of the installed vLLM's release (``tests/hosts/vllm/v0_34`` for 0.34.x),
    read from its metadata (importing vLLM here would fix its platform)."""
    major, minor = importlib.metadata.version("vllm").split(".")[:2]
    return Path(__file__).resolve().parents[1] / f"v{major}_{minor}"


def _release_stubs(platform: str) -> None:
    path = release_folder() / "stubs.py"
    if not path.exists():
        return
    spec = importlib.util.spec_from_file_location(f"release_stubs_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.setup(platform)


class _SM120Dispatch:
    """FlashInfer's ``_DECODE_DSV4_DISPATCH`` table (keyed by (q heads, top-k)), as a build with or
    without DeepSeek-V4's SM120 decode specialization: vLLM's own
    ``has_flashinfer_sparse_mla_sm120_config`` looks the layer's shape up in it."""

    def __contains__(self, key) -> bool:
        return FLASHINFER_SM120["available"]


def _flashinfer() -> None:
    """An installed FlashInfer with its cubins (what vLLM requires on CUDA): packages that
    import, whose kernels need a GPU, and the SM120 dispatch table as the input says. vLLM's own
    ``vllm.utils.flashinfer`` probes run against it unchanged."""
    import importlib.machinery

    names = ("flashinfer", "flashinfer_cubin", "flashinfer.autotuner", "flashinfer.decode", "flashinfer.mla",
             "flashinfer.mla._sparse_mla_sm120")
    for name in names:
        module = _HardwareModule(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__path__ = []
        sys.modules.setdefault(name, module)
    sys.modules["flashinfer.mla._sparse_mla_sm120"]._DECODE_DSV4_DISPATCH = _SM120Dispatch()


def set_flashinfer_sm120(available: bool) -> None:
    """Make the stand-in FlashInfer a build with (or without) the SM120 specialization. vLLM caches
    its probe's answer per process (``functools.cache``: one FlashInfer per process); a changed
    input is another installed build, so the cached answers are dropped."""
    if FLASHINFER_SM120["available"] == available:
        return
    FLASHINFER_SM120["available"] = available
    probe = getattr(sys.modules.get("vllm.utils.flashinfer"), "has_flashinfer_sparse_mla_sm120_config", None)
    if probe is not None and hasattr(probe, "cache_clear"):
        probe.cache_clear()


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
