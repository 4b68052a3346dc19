"""A minimal base for the small immutable value types of the hot path.

``dataclasses`` would generate the same methods, but importing it pulls in
``inspect`` and ``re`` (~12 ms), a third of the 30 ms cold-start budget of
``import dsv4sel`` + first ``select()``. Subclasses list their fields in
``__slots__`` and may give ``_defaults``.
"""

from __future__ import annotations


def unannotated_fields(cls: type) -> list:
    """Fields in ``cls.__slots__`` without a class-level annotation."""
    notes = cls.__dict__.get("__annotations__", {})
    return [f for f in cls.__dict__.get("__slots__", ()) if f not in notes]


class FrozenError(AttributeError):
    """Raised on an attempt to assign to a field of a frozen value."""


class Frozen:
    __slots__ = ()
    _fields: tuple = ()
    _defaults: dict = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        # the annotations are what a type checker sees of the fields (``__slots__``
        # alone are strings to it), so a field without one is refused here
        missing = unannotated_fields(cls)
        if missing:
            raise TypeError(f"{cls.__name__}: field {missing[0]!r} in __slots__ has no annotation; "
                            f"declare it as `{missing[0]}: <type>` in the class body")
        cls._fields = tuple(f for klass in reversed(cls.__mro__) for f in klass.__dict__.get("__slots__", ()))

    def __init__(self, *args, **kwargs):
        fields = self._fields
        if not kwargs and len(args) == len(fields):
            # every field given in order: the evaluator's own constructions, the hot case
            for name, value in zip(fields, args):
                object.__setattr__(self, name, value)
            self.__post_init__()
            return
        if len(args) > len(fields):
            raise TypeError(f"{type(self).__name__} takes {len(fields)} fields, got {len(args)}")
        values = dict(zip(fields, args))
        for name, value in kwargs.items():
            if name not in fields or name in values:
                raise TypeError(f"{type(self).__name__}: unexpected or repeated field {name!r}")
            values[name] = value
        for name in fields:
            if name not in values:
                if name not in self._defaults:
                    raise TypeError(f"{type(self).__name__}: missing field {name!r}")
                values[name] = self._defaults[name]
            object.__setattr__(self, name, values[name])
        self.__post_init__()

    def __post_init__(self) -> None:
        """Hook for normalizing fields (use ``object.__setattr__``)."""

    def __setattr__(self, name, value):
        raise FrozenError(f"cannot assign to field {name!r}: {type(self).__name__} is frozen")

    def __delattr__(self, name):
        raise FrozenError(f"cannot delete field {name!r}: {type(self).__name__} is frozen")

    def _astuple(self) -> tuple:
        return tuple(getattr(self, f) for f in self._fields)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._astuple() == other._astuple()

    def __hash__(self):
        return hash(self._astuple())

    def __repr__(self):
        inner = ", ".join(f"{f}={getattr(self, f)!r}" for f in self._fields)
        return f"{type(self).__name__}({inner})"

    def __reduce__(self):
        return (_rebuild, (type(self), self._astuple()))

    def replace(self, **changes):
        """A copy with ``changes`` applied (like ``dataclasses.replace``)."""
        values = {f: getattr(self, f) for f in self._fields}
        values.update(changes)
        return type(self)(**values)


def _rebuild(cls, values):
    return cls(*values)
