"""What a domain tells the engine: the :class:`Profile`.

The engine compiles and evaluates decision tables over any finite space; it
does not know what its inputs and select fields mean. A profile is the data
that says it: the inputs every vocabulary must declare and the order of the
lookup key, the fields a select outcome carries and their types, which field
restates an input, and the words messages use. The engine reads a profile;
it never imports one (DeepSeek-V4's is :data:`dsv4sel.dsv4.profile.PROFILE`).
"""

from __future__ import annotations

from ..record import Frozen

#: The input that picks a table: ``backend: NAME`` in a rule file names the table
#: a rule belongs to, and the key holds the requested one (None: the default).
SELECTOR = "backend"


class Profile(Frozen):
    """A domain's description of its decision tables.

    ``subject`` names what is decided, for messages ("DeepSeek-V4
    attention"). ``key`` is the order of the built-in inputs in the lookup
    key, :data:`SELECTOR` among them; inputs that rule packs declare follow
    them. ``select_fields`` are ``(name, type)`` pairs, every one required in
    a select outcome, in the order a compiled row stores them (``int`` or
    ``str``; a ``str`` field may be a template such as ``"{kv_cache_dtype}"``).
    ``same_result`` lists the fields that decide whether two selections store
    the same data the same way. ``restates`` pairs a select field with the
    input whose value it spells (a rewrite of the field to the input's own
    value changes nothing and is dropped; ``check`` re-selects with the
    rewritten value to prove a rewrite is a fixpoint). ``schema`` is the path
    of the rule files' JSON Schema; ``allowed_impl_modules`` the modules impl
    classes may come from by default, and ``impl_base`` (``"module:Class"``) the class every
    impl subclasses: a name in an allowed module that is not such a class is no impl. ``spellings`` pairs an input with a function that gives
    the declared value another spelling means, or None (queries may accept ``sm90`` for
    ``9.0``; rules write the declared value, and the compiler's error names it).
    ``normalized`` lists the inputs of ``key`` the domain's queries normalize themselves
    (spellings, enums, case); every other input, built-in or a pack's, is read as given or at
    its declared default, so the compiler requires it to declare one (DSV305).
    ``host_classes`` pairs a host with the classes the domain ships for it outside the host's own
    package (a rule may name them under ``hosts:``, as it names the host's own classes).
    ``host_inputs`` are ``(name, values, default)`` of inputs no vocabulary must declare but every
    host fills from its own configuration for a rule set that does (a process's role under
    disaggregation): a declaration of one must give exactly those values and that default, since
    a host sends each of them (DSV305)."""

    __slots__ = ("subject", "key", "select_fields", "same_result", "restates", "schema", "allowed_impl_modules",
                 "impl_base", "spellings", "normalized", "host_classes", "host_inputs")
    _defaults = {"spellings": (), "host_classes": (), "host_inputs": ()}
    subject: str
    key: tuple[str, ...]
    select_fields: tuple[tuple[str, type], ...]
    same_result: tuple[str, ...]
    restates: tuple[tuple[str, str], ...]
    schema: str
    allowed_impl_modules: tuple[str, ...]
    impl_base: str
    spellings: tuple
    normalized: tuple[str, ...]
    host_classes: tuple[tuple[str, tuple[str, ...]], ...]
    host_inputs: tuple[tuple[str, tuple[str, ...], str], ...]

    @property
    def builtin_inputs(self) -> tuple[str, ...]:
        """The inputs every vocabulary must declare (the key without the selector)."""
        return tuple(name for name in self.key if name != SELECTOR)

    @property
    def field_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.select_fields)


#: the types a select field may have, by the name an annotation spells them with
_FIELD_TYPES: dict[str, type] = {"str": str, "int": int}


def declared_fields(cls: type) -> tuple[tuple[str, type], ...]:
    """``(name, type)`` of each field ``cls`` annotates, in order: a domain declares its
    select fields once, as a class body (``impl: str``), which the type checker reads as
    the selection's attributes and :attr:`Profile.select_fields` takes from here. The
    annotations are read as text (postponed), so no ``typing`` is imported."""
    notes = cls.__dict__.get("__annotations__", {})
    out = []
    for name, note in notes.items():
        kind = _FIELD_TYPES.get(note if type(note) is str else getattr(note, "__name__", ""))
        if kind is None:
            raise TypeError(f"{cls.__name__}.{name}: a select field is a str or an int, not {note!r}")
        out.append((name, kind))
    return tuple(out)
