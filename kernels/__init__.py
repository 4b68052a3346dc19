"""DeepSeek-V4 / V4.1 KV-cache layouts, a torch reference sparse decode, and kernel adapters.

Installed as ``dsv4sel.kernels``. Importing this package (or any module in it)
imports neither torch nor any kernel library: the selector's ``check`` and
``doctor`` commands read layout sizes and library availability without paying
for a torch import. Torch and the kernel libraries are imported inside the
functions that need them.

``IMPLS`` lists the attention implementations as ``"module:Class"`` strings,
the same spelling the rule files use; :func:`load_impl` resolves one and
:func:`availability_report` asks each whether it can run here, through
:func:`dsv4sel.kernels.platform.impl_availability`, the same question
``dsv4sel doctor`` asks of the impls the rules name (which it loads through
the rule set's allow-list instead).
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs a cold `dsv4sel explain` ~7 ms: it looks up an impl's module here
    from typing import NamedTuple

__all__ = ["IMPLS", "ImplStatus", "availability_report", "load_impl"]

#: Every attention implementation this package provides, in the spelling the
#: rules use (``module:Class``). Order is stable: :func:`availability_report` keeps it.
IMPLS: tuple[str, ...] = (
    "dsv4sel.kernels.flashmla:DeepseekV4FlashMLASparseImpl",
    "dsv4sel.kernels.flashinfer:DeepseekV4FlashInferMLASparseImpl",
    "dsv4sel.kernels.rocm:DeepseekV4ROCMAiterMLASparseImpl",
    "dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl",
    "dsv4sel.kernels.v41:DeepseekV41FlashMLASparseImpl",
    "dsv4sel.kernels.v41:DeepseekV41FlashInferMLASparseImpl",
    "dsv4sel.kernels.v41:DeepseekV41MegaAttnImpl",
)


if TYPE_CHECKING:
    class ImplStatus(NamedTuple):
        """One line of :func:`availability_report`."""

        spec: str
        available: bool
        reason: str
else:
    from collections import namedtuple

    ImplStatus = namedtuple("ImplStatus", "spec available reason", module=__name__)
    ImplStatus.__doc__ = "One line of :func:`availability_report`."


def load_impl(spec: str) -> type:
    """Return the class named by ``"module:Class"``.

    Raises ValueError for a malformed spec, ImportError / AttributeError when
    the module or class does not exist. Importing an impl module is cheap: it
    does not import torch or the kernel library.
    """
    module_name, sep, class_name = spec.partition(":")
    if not sep or not module_name or not class_name:
        raise ValueError(f"impl spec must look like 'package.module:Class', got {spec!r}")
    module = importlib.import_module(module_name)
    return getattr(module, class_name)


def availability_report(platform: str | None = None, capability: object = None) -> list[ImplStatus]:
    """Ask every impl in :data:`IMPLS` whether it can run on (platform, capability).

    ``None`` for both means "this machine". Never raises: an impl whose class
    cannot even be loaded, or whose check raises, is reported unavailable with
    the error as reason.
    """
    from .platform import impl_availability

    report: list[ImplStatus] = []
    for spec in IMPLS:
        try:
            cls = load_impl(spec)
        except Exception as exc:  # noqa: BLE001 - importing an impl's module can raise anything: a report line
            report.append(ImplStatus(spec, False, f"cannot load {spec}: {type(exc).__name__}: {exc}"))
            continue
        report.append(ImplStatus(spec, *impl_availability(cls, platform, capability)))
    return report
