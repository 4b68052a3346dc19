"""Detect this machine's platform and device capability (imports torch lazily).

:func:`probe_torch` and :func:`import_torch` are the kernels' (``dsv4sel.kernels.platform``):
the kernels never import the core, so the core takes the probes from them."""

from __future__ import annotations

import os

from ..errors import InvalidQuery
# the one place that asks torch lives with the kernels, which need it without the core;
# import_torch (is torch importable, which version) is re-exported for the doctor
from ..kernels.platform import import_torch, probe_torch

PLATFORM_ENV = "DSV4SEL_PLATFORM"
CAPABILITY_ENV = "DSV4SEL_CAPABILITY"
PLATFORMS = ("cuda", "rocm", "xpu", "cpu")


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
