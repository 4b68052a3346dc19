"""Where code runs: platform names, compute capabilities, and their detection.

Platforms are the strings ``"cuda"``, ``"rocm"``, ``"xpu"`` and ``"cpu"``.
A capability is a ``(major, minor)`` tuple of ints: ``(9, 0)`` for an H100/H200,
``(10, 0)`` for a B200, ``(12, 0)`` for an RTX PRO 6000. ROCm GPUs use the same
tuple as torch reports for them, so ``gfx942`` is ``(9, 4)`` and ``gfx950`` is
``(9, 5)``; :func:`parse_capability` accepts the ``gfx`` spelling too.

Nothing here imports torch at module level, and the detectors never raise: a
machine without torch is simply a ``cpu`` machine with no capability.
:func:`impl_availability` is the one question "can this impl class run on
(platform, capability)", asked without raising: :func:`dsv4sel.kernels.availability_report`
asks it of every impl here, ``dsv4sel doctor`` of every impl the rules name.
"""

from __future__ import annotations

import sys

import re
from typing import Any

__all__ = [
    "PLATFORMS",
    "Capability",
    "parse_capability",
    "format_capability",
    "detect_platform",
    "device_target",
    "import_torch",
    "probe_torch",
    "require_torch",
    "impl_availability",
]

PLATFORMS: frozenset[str] = frozenset({"cuda", "rocm", "xpu", "cpu"})

Capability = tuple[int, int]

_DOTTED = re.compile(r"^\s*(?:sm_?)?(\d+)\.(\d+)\s*$", re.IGNORECASE)
_SM = re.compile(r"^\s*sm_?(\d+)\s*$", re.IGNORECASE)
# gfx<major><minor hex digit><stepping hex digit>: gfx942 -> 9.4, gfx1100 -> 11.0
# torch's gcnArchName may carry target features: "gfx942:sramecc+:xnack-".
_GFX = re.compile(r"^\s*gfx(\d+)([0-9a-f])([0-9a-f])(?::[\w+-]+)*\s*$", re.IGNORECASE)


def parse_capability(value: Any) -> Capability | None:
    """Normalise a capability to ``(major, minor)``; ``None`` stays ``None``.

    Accepts a 2-tuple/list of ints, ``"9.0"``, ``"sm_90"`` / ``"sm90"`` (last
    digit is the minor), ``"gfx942"``, an int major (minor 0), or a float such
    as ``9.0``. Raises ValueError for anything else, naming the input.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "unknown", "none")):
        return None
    if isinstance(value, bool):
        raise ValueError(f"not a compute capability: {value!r}")
    cap = _parse_capability_value(value)
    if cap is None:
        raise ValueError(f"not a compute capability: {value!r} (use e.g. (9, 0), '9.0', 'sm_90' or 'gfx942')")
    return cap


def _parse_capability_value(value: Any) -> Capability | None:
    """A pair of non-negative ints, an int major, a float like 9.0 or capability text; None if none of them."""
    if isinstance(value, (tuple, list)):
        if len(value) == 2 and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
            return (value[0], value[1])
        return None
    if isinstance(value, (int, float)) and value >= 0:
        return (value, 0) if isinstance(value, int) else _parse_capability_text(f"{value:.1f}")
    return _parse_capability_text(value) if isinstance(value, str) else None


def _parse_capability_text(value: str) -> Capability | None:
    """``"9.0"``, ``"sm_90"`` / ``"sm90"`` or ``"gfx942"`` as ``(major, minor)``; None for other text."""
    if m := _DOTTED.match(value):
        return (int(m.group(1)), int(m.group(2)))
    m = _SM.match(value)
    if m and len(m.group(1)) >= 2:
        digits = m.group(1)
        return (int(digits[:-1]), int(digits[-1]))
    if m := _GFX.match(value):
        return (int(m.group(1)), int(m.group(2), 16))
    return None


def format_capability(cap: Capability | None) -> str:
    """``(9, 0)`` -> ``"9.0"``; ``None`` -> ``"unknown"``."""
    return "unknown" if cap is None else f"{cap[0]}.{cap[1]}"


def import_torch() -> tuple[Any, str | None]:
    """``(torch, None)``, or ``(None, why not)`` when torch cannot be imported:
    "torch not installed", or the error of a broken install. Never raises.

    The one answer to "is torch importable, and which version"
    (``torch.__version__``): :func:`probe_torch`, :func:`device_target` and
    ``dsv4sel doctor`` ask it here. A CPU-only torch without NumPy warns
    "Failed to initialize NumPy" on import; a probe's caller cannot act on
    that, so the warning is silenced here, once, for every command.
    A successful import is remembered: the codecs ask on every call, and
    entering ``warnings.catch_warnings`` costs more than their checks."""
    if _torch_module and sys.modules.get("torch") is _torch_module[0]:  # still the imported one
        return _torch_module[0], None
    import warnings

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
            import torch
    except ImportError:
        return None, "torch not installed"
    except Exception as exc:  # noqa: BLE001 - a broken install (OSError, RuntimeError, ...) must not stop a probe
        return None, f"torch failed to import ({type(exc).__name__}: {exc})"
    _torch_module.append(torch)
    return torch, None


_torch_module: list = []  # torch, once imported


def require_torch() -> Any:
    """torch, for code that cannot run without it (the layouts' codecs);
    raises ImportError saying why when :func:`import_torch` finds none."""
    torch, problem = import_torch()
    if torch is None:
        raise ImportError(f"{problem}: this needs torch (pip install torch)")
    return torch


def probe_torch() -> tuple[tuple[str, str | None] | None, str]:
    """What torch sees on device 0: ``((platform, capability), "")``, or
    ``(None, why not)`` when torch is missing or sees no accelerator. Never raises.

    ``torch.version.hip`` means rocm (capability = the gfx arch, e.g.
    ``"gfx942:sramecc+:xnack-"``); CUDA available means cuda (``"major.minor"``);
    an available XPU means xpu (no capability). This is the one place that asks
    torch: the kernels' dispatch and the core's ``dsv4sel.dsv4.platform.detect`` use it.
    """
    torch, problem = import_torch()
    if torch is None:
        return None, problem or "torch not installed"
    try:
        if getattr(torch.version, "hip", None):
            arch = None
            if torch.cuda.is_available():
                arch = getattr(torch.cuda.get_device_properties(0), "gcnArchName", None)
            return ("rocm", arch), ""
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return ("cuda", f"{major}.{minor}"), ""
        xpu = getattr(torch, "xpu", None)
        if xpu is not None and xpu.is_available():
            return ("xpu", None), ""
    except RuntimeError as exc:  # a broken driver
        return None, f"torch could not query the device ({exc})"
    return None, "torch sees no GPU"


def detect_platform() -> tuple[str, Capability | None]:
    """The platform and capability of this machine's first accelerator.

    ``("cpu", None)`` when torch is missing or sees no accelerator. Never raises.
    Asks torch through :func:`probe_torch`.
    """
    found, _ = probe_torch()
    if found is None:
        return ("cpu", None)
    platform, capability = found
    try:
        return (platform, parse_capability(capability))
    except ValueError:  # an arch name this module cannot read: the platform is still known
        return (platform, None)


def device_target(device: Any) -> tuple[str, Capability | None]:
    """The platform and capability of a torch device (or tensor's device).

    ROCm devices show up in torch as ``cuda``; torch.version.hip tells them apart.
    Never raises; an unknown device type is reported as its type string.
    """
    torch, _ = import_torch()
    if torch is None:
        return ("cpu", None)
    try:
        dev = torch.device(device) if not hasattr(device, "type") else device
        if dev.type == "cuda":
            platform = "rocm" if getattr(torch.version, "hip", None) else "cuda"
            return (platform, tuple(torch.cuda.get_device_capability(dev)))  # type: ignore[return-value]
        return (dev.type, None)
    # Never raises. torch.device raises TypeError or RuntimeError on bad input; torch's lazy CUDA
    # init raises AssertionError (a CPU build), RuntimeError or DeferredCudaCallError, a plain
    # Exception subclass, by build and driver: no narrower class covers them all.
    except Exception:  # noqa: BLE001 - see above
        return ("cpu", None)


def impl_availability(cls: Any, platform: str | None = None, capability: Any = None) -> tuple[bool, str]:
    """``cls.is_available(platform, capability)`` as ``(ok, reason)``; ``None``
    for both asks about this machine. Never raises: a class without an
    ``is_available()`` classmethod, or one whose check raises (an adapter's
    bug), is reported unavailable with the reason."""
    is_available = getattr(cls, "is_available", None)
    if not callable(is_available):
        return False, f"{cls.__name__} has no is_available() classmethod"
    try:
        ok, reason = is_available(platform, capability)
    except Exception as exc:  # noqa: BLE001 - a kernel adapter's bug is a finding, not a crash
        return False, f"is_available() raised {type(exc).__name__}: {exc}"
    return bool(ok), str(reason)
