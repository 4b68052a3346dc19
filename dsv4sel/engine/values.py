"""Values every stage shares: where a rule lives (:class:`RuleRef`), a rule's
:class:`Message`, and the one impl allow-list check and class loader."""

from __future__ import annotations

from ..errors import ImplLoadError, Loc
from ..process import Interrupted
from ..record import Frozen
from .text import escape


class RuleRef(Frozen):
    """Where a rule lives: its id, the file (relative to the repository for the
    shipped rules, e.g. ``rules/flashmla.yaml``), the 1-based line of the rule
    and the rule pack it came from."""

    __slots__ = ("id", "file", "line", "pack")
    _defaults = {"pack": "dsv4sel"}
    id: str
    file: str
    line: int
    pack: str

    def __str__(self) -> str:
        return f"{self.id} ({self.loc})"

    @property
    def loc(self) -> Loc:
        return Loc(self.file, self.line)

    @property
    def location(self) -> str:
        """``file:line``: ``str(self.loc)``."""
        return str(self.loc)


class Message(str):
    """A message from a rule: a plain ``str`` that also carries ``level``
    (``"info"`` or ``"warning"``), so ``messages`` compares equal to strings."""

    __slots__ = ("level",)
    level: str  # the slot, declared so that the type checker sees it

    def __new__(cls, text: str, level: str = "info") -> "Message":
        # a message reaches logs and terminals: control characters only as escapes
        self = super().__new__(cls, escape(text, keep_newlines=True))
        self.level = level
        return self

    def __reduce__(self):
        return (Message, (str(self), self.level))


def check_impl_allowed(impl: str, allowed: tuple[str, ...]) -> tuple[str, str]:
    """Split ``"module:Class"`` after checking that the module is one of ``allowed``
    or inside one of them (``dsv4sel.kernelsevil`` is not inside
    ``dsv4sel.kernels``); raises :class:`ImplLoadError` otherwise.

    The one allow-list check: the compiler (for each rule's ``impl:``), the
    rule set (for each compiled impl), the checker and :func:`load_impl_class`
    all call it, so a module is allowed by the same test everywhere."""
    module, sep, attr = impl.partition(":") if isinstance(impl, str) else ("", "", "")
    if not sep or not module or not attr:
        raise ImplLoadError(f"impl {impl!r} must look like 'package.module:Class'")
    if not any(module == p or module.startswith(p + ".") for p in allowed):
        from .hints import allow_impl_hint  # the error path only

        raise ImplLoadError(f"impl {impl!r} is outside the allowed modules ({', '.join(allowed)}); only "
                            "those are ever imported" + allow_impl_hint(impl))
    return module, attr


def load_impl_class(impl: str, allowed: tuple[str, ...]) -> type:
    """The class ``"module:Class"`` names, imported only when
    :func:`check_impl_allowed` admits its module. The one impl loader
    (:meth:`Selection.load_impl`, ``dsv4sel check``, ``dsv4sel doctor``).

    Raises :class:`ImplLoadError` (an ImportError) for a module outside
    ``allowed``, one that fails to import for any reason (a broken module is
    as unusable as a missing one), a missing name, or a name that is not a
    class."""
    import importlib

    module_name, attr = check_impl_allowed(impl, allowed)
    try:
        module = importlib.import_module(module_name)
    except (Interrupted, MemoryError):  # the user's Ctrl-C, the machine's memory: not the module's failure
        raise
    except BaseException as exc:  # noqa: BLE001 - a module calling sys.exit() or raising
        # KeyboardInterrupt at import must not end the process that asked for its class
        raise ImplLoadError(f"impl {impl!r}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None
    cls = getattr(module, attr, None)
    if cls is None:
        from .suggest import did_you_mean

        names = [n for n in dir(module) if not n.startswith("_")]
        raise ImplLoadError(f"impl {impl!r}: {module_name} has no class {attr!r}" + did_you_mean(attr, names))
    if not isinstance(cls, type):
        raise ImplLoadError(f"impl {impl!r}: {module_name}.{attr} is not a class")
    return cls
