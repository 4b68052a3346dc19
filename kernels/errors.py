"""Exceptions raised by dsv4sel.kernels. Importing this module imports nothing else."""

from __future__ import annotations

__all__ = ["UnknownLayoutError", "UnsupportedLayoutError", "KernelUnavailableError"]


class UnknownLayoutError(ValueError):
    """A KV-cache layout name that :mod:`dsv4sel.kernels.layouts` does not define."""

    def __init__(self, name: object, valid: tuple[str, ...]) -> None:
        self.name = name
        self.valid = valid
        super().__init__(f"unknown KV-cache layout {name!r}; valid layouts: {', '.join(valid)}")


class UnsupportedLayoutError(ValueError):
    """A known layout that an impl (or the impl on this GPU generation) cannot read."""


class KernelUnavailableError(RuntimeError):
    """The kernel library an impl needs is missing, or cannot run on this device.

    ``reason`` says what to install or what is wrong. Impls raise this instead of
    silently running the torch reference; pass ``fallback="reference"`` to the
    impl's constructor to opt into the reference.
    """

    def __init__(self, impl: str, reason: str) -> None:
        self.impl = impl
        self.reason = reason
        super().__init__(f"{impl} cannot run: {reason}")
