"""Values every stage shares: where a rule lives (:class:`RuleRef`), a rule's
:class:`Message`, the one test of a rewrite, and the one impl allow-list check and class loader."""

from __future__ import annotations

from ..errors import ImplLoadError, Loc
from ..process import Interrupted
from ..record import Frozen
from .text import escape

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs cold start; annotations are postponed
    from typing import Mapping


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


def is_field_name(name: object) -> bool:
    """An input or field name as rule files spell it: ``[a-z][a-z0-9_]*`` (never ``__dict__``)."""
    return (type(name) is str and name[:1].isascii() and name[:1].islower()
            and all(c.isascii() and (c.islower() or c.isdigit() or c == "_") for c in name))


def rewrite_problem(name: object, value: object, types: Mapping[str, type]) -> str | None:
    """Why ``name: value`` is not a rewrite rule files could write, or None.

    A rewrite names a field as rule files spell it (:func:`is_field_name`: never ``__dict__``
    or ``__class__``), holds a str, an int or a bool, and rewrites a select field of ``types``
    (name -> type, the profile's) only with a value of that field's type. The one test of a
    rewrite: the compiled form's rows (:mod:`dsv4sel.engine.ruleset`) and a domain's
    ``Selection.replace`` and ``apply`` all ask it."""
    if not is_field_name(name):
        return "not a field name: rule files write lowercase letters, digits and _"
    if type(value) not in (str, int, bool):
        return f"a rewrite holds a str, an int or a bool, not {_a(type(value).__name__)}"
    wanted = types.get(str(name), type(value))
    if type(value) is not wanted:
        return f"the field holds {_a(wanted.__name__)}, not {_a(type(value).__name__)} ({escape(repr(value))})"
    return None


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def is_module_name(name: object) -> bool:
    """A dotted Python module name (``my_pack.kernels``): ASCII identifiers joined by dots."""
    return (type(name) is str and name.isascii() and bool(name)
            and all(part.isidentifier() for part in name.split(".")))


def allowed_module_problem(name: object) -> str | None:
    """Why ``name``, an entry of an impl allow-list, is not one, or None. The one test of an
    allow-list entry, whichever way it came in (``DSV4SEL_ALLOW_IMPL_MODULES``,
    ``allowed_impl_modules=``, ``--allow-impl-module``): an entry that is no module name
    (``''``, ``a..b``) would silently allow nothing, or something else. Callers prefix the way."""
    if is_module_name(name):
        return None
    shown = escape(repr(name)) if type(name) is str else f"a {type(name).__name__}"
    return f"{shown} is not a dotted module name; write e.g. my_pack.kernels"


def check_impl_allowed(impl: str, allowed: tuple[str, ...], *, from_environment: bool = False) -> tuple[str, str]:
    """Split ``"module:Class"`` after checking that the module is one of ``allowed``
    or inside one of them (``dsv4sel.kernelsevil`` is not inside
    ``dsv4sel.kernels``); raises :class:`ImplLoadError` otherwise.

    The one allow-list check: the compiler (for each rule's ``impl:``), the
    rule set (for each compiled impl), the checker and :func:`load_impl_class`
    all call it, so a module is allowed by the same test everywhere. The error
    says how to allow the module, every way; ``from_environment`` (the rule's pack
    came from ``DSV4SEL_RULES_PATH``) names the environment variable first."""
    module, sep, attr = impl.partition(":") if isinstance(impl, str) else ("", "", "")
    if not sep or not module or not attr:
        raise ImplLoadError(f"impl {impl!r} must look like 'package.module:Class'")
    if not any(module == p or module.startswith(p + ".") for p in allowed):
        from .hints import allow_impl_hint  # the error path only

        raise ImplLoadError(f"impl {impl!r} is outside the allowed modules ({', '.join(allowed)}); only "
                            "those are ever imported" + allow_impl_hint(impl, from_environment))
    return module, attr


def load_impl_class(impl: str, allowed: tuple[str, ...], base: str) -> type:
    """The class ``"module:Class"`` names, imported only when
    :func:`check_impl_allowed` admits its module, and only when it is a subclass
    of ``base`` (``"module:Class"``, the profile's
    :attr:`~dsv4sel.engine.profile.Profile.impl_base`), not ``base`` itself: an
    allow-listed module exposes other objects too (a layout class, ``__class__``,
    what it imported), and none of them is an impl. The one impl loader
    (:meth:`Selection.load_impl`, ``dsv4sel check``, ``dsv4sel doctor``,
    ``dsv4sel explain``'s warning).

    Raises :class:`ImplLoadError` (an ImportError) for a module outside
    ``allowed``, one that fails to import for any reason (a broken module is
    as unusable as a missing one), a missing name, or a name that is not such a
    class."""
    module_name, attr = check_impl_allowed(impl, allowed)
    module = _import(impl, module_name)
    cls = getattr(module, attr, None)
    if cls is None:
        from .suggest import did_you_mean

        names = [n for n in dir(module) if not n.startswith("_")]
        raise ImplLoadError(f"impl {impl!r}: {module_name} has no class {attr!r}" + did_you_mean(attr, names))
    required = _base_class(impl, base)
    if not isinstance(cls, type) or not issubclass(cls, required) or cls is required:
        named = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else ""
        what = ("the base class itself" if cls is required
                else "a class" if named == f"{module_name}.{attr}"
                else f"the class {named}" if named else f"a {type(cls).__name__}, not a class")
        raise ImplLoadError(f"impl {impl!r}: {module_name}.{attr} is {what}, not an impl: an impl is a subclass "
                            f"of {base.replace(':', '.')}")
    return cls


def _import(impl: str, module_name: str):
    import importlib

    try:
        return importlib.import_module(module_name)
    except (Interrupted, MemoryError):  # the user's Ctrl-C, the machine's memory: not the module's failure
        raise
    except BaseException as exc:  # noqa: BLE001 - a module calling sys.exit() or raising
        # KeyboardInterrupt at import must not end the process that asked for its class
        raise ImplLoadError(f"impl {impl!r}: cannot import {module_name}: {type(exc).__name__}: {exc}") from None


def _base_class(impl: str, base: str) -> type:
    """The class ``base`` (``module:Class``, the profile's data) names."""
    module_name, _, attr = base.partition(":")
    cls = getattr(_import(impl, module_name), attr, None)
    if not isinstance(cls, type):
        raise ImplLoadError(f"impl {impl!r}: the impl base class {base} cannot be loaded; the installation is broken")
    return cls
