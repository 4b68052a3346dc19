"""Detect this machine's platform and device capability (imports torch lazily)."""

from __future__ import annotations

import os

from .errors import InvalidQuery

PLATFORM_ENV = "DSV4SEL_PLATFORM"
CAPABILITY_ENV = "DSV4SEL_CAPABILITY"
PLATFORMS = ("cuda", "rocm", "xpu", "cpu")


def probe_torch() -> tuple[tuple[str, str | None] | None, str]:
    """What torch sees on device 0: ``((platform, capability), "")``, or
    ``(None, why not)`` when torch is missing or sees no accelerator. Never raises.

    ``torch.version.hip`` means rocm (capability = the gfx arch, e.g.
    ``"gfx942:sramecc+:xnack-"``); CUDA available means cuda (``"major.minor"``);
    an available XPU means xpu (no capability). This is the one place that asks
    torch; the kernels' dispatch uses it too.
    """
    try:
        import torch
    except ImportError:
        return None, "torch is not importable"
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


def detect() -> tuple[str, str | None]:
    """Return ``(platform, capability)`` for device 0 of this machine.

    What torch sees (:func:`probe_torch`) wins; otherwise the
    ``DSV4SEL_PLATFORM`` (and optional ``DSV4SEL_CAPABILITY``) environment
    variables decide. Raises :class:`InvalidQuery` naming the options when
    neither applies.
    """
    found, problem = probe_torch()
    if found is not None:
        return found
    env = os.environ.get(PLATFORM_ENV, "").strip().lower()
    if env:
        if env not in PLATFORMS:
            raise InvalidQuery(f"{PLATFORM_ENV}={env!r} is not a platform; use one of {', '.join(PLATFORMS)}")
        return env, os.environ.get(CAPABILITY_ENV) or None
    raise InvalidQuery(f"cannot detect the platform: {problem}. Pass platform= (one of "
                       f"{', '.join(PLATFORMS)}) or set {PLATFORM_ENV}, e.g. {PLATFORM_ENV}=cpu")
