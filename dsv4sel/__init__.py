"""dsv4sel: rule-based selection of the DeepSeek-V4 sparse-MLA attention
backend and KV-cache format.

The house: a generic decision-table engine (:mod:`dsv4sel.engine`: sources
-> load -> validate -> compile -> lower -> evaluate), the DeepSeek-V4 profile
handed to it as data (:mod:`dsv4sel.dsv4`), the verifier
(:mod:`dsv4sel.check`), the operator tools (:mod:`dsv4sel.tools`), the CLI
(:mod:`dsv4sel.cli`) and the kernels (:mod:`dsv4sel.kernels`, which import
none of the rest). This module is the face only: it re-exports
:mod:`dsv4sel.api`.

The public API::

    sel = dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="auto")
    sel.backend, sel.impl, sel.cache_dtype, sel.rewrites, sel.rule

``import dsv4sel`` and a warm ``select()`` import neither torch, yaml nor
jsonschema: compiled rules are cached by content hash (see :mod:`dsv4sel.engine.cache`).
"""

from __future__ import annotations

from .process import quiet_when_command

quiet_when_command()  # first: the command's own imports are interruptible without a traceback

from ._version import __version__  # noqa: E402

from .api import default_rules, load_rules, select  # noqa: E402
from .dsv4.profile import DEFAULT_ALLOWED_IMPL_MODULES  # noqa: E402
from .dsv4.rules import RuleSet  # noqa: E402
from .dsv4.selection import Query, Selection  # noqa: E402
from .engine.values import Message, RuleRef  # noqa: E402
from .errors import ImplLoadError, InvalidQuery, Loc, Problem, RuleError, SelectionError  # noqa: E402

__all__ = [
    "DEFAULT_ALLOWED_IMPL_MODULES", "ImplLoadError", "InvalidQuery", "Loc", "Message", "Problem", "Query",
    "RuleError", "RuleRef", "RuleSet", "Selection", "SelectionError", "default_rules", "load_rules",
    "select", "__version__", "verify", "verify_program", "Report", "Finding", "VerifyError",
]


def __getattr__(name: str):
    # verify() compiles rule files (yaml, jsonschema): loaded on first use so
    # that `import dsv4sel` stays free of both.
    if name == "verify":
        from .api import verify

        return verify
    if name == "verify_program":
        from .check.verifier import verify_program

        return verify_program
    if name in ("Report", "Finding", "VerifyError"):
        from .check import findings

        return getattr(findings, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
