"""The nearest working alternatives of a rejected query, and their vLLM flags.

One search serves both places that name alternatives, so they always agree:
:attr:`dsv4sel.SelectionError.suggestions` (through
:meth:`RuleSet.suggestions`, as flag strings) and ``dsv4sel explain`` (the
:class:`Alternative` values themselves).

The order is "the smallest change first", read from the operator's side:

1. one change (backend *or* kv dtype) before two;
2. the backend the query asked for, kept, before any other: the operator named
   it on purpose, so changing only the kv dtype is the smaller change; then no
   backend (the platform default, which drops a flag rather than inventing
   one); then the other DeepSeek-V4 backends in rule-file order;
3. kv dtypes in vocabulary order.

An alternative that stores the same cache as an earlier one
(:meth:`~dsv4sel.engine.ruleset.CompiledRules.same_result`) is dropped, or folded into the earlier
one's ``also`` when it is the same kind of change, so each entry gives a
different result. Imported only on the error path (never by a selecting
``select()``).
"""

from __future__ import annotations

from ..record import Frozen
from .selection import Query, Selection

#: How many alternatives a rejection names.
LIMIT = 4

#: The command-line flag of each input a suggestion can change: vLLM's spelling
#: for the backend and the kv dtype, dsv4sel's own for the capability.
FLAGS = {"backend": "--attention-backend", "kv_cache_dtype": "--kv-cache-dtype", "capability": "--capability"}


def flag(name: str, value: str | None) -> str:
    """``value`` of input ``name`` as its flag, e.g. ``--kv-cache-dtype auto``; a
    backend of None (the platform default) is ``no --attention-backend``. Every
    flag string dsv4sel prints or suggests is built here."""
    if name == "backend" and value is None:
        return f"no {FLAGS['backend']}"
    return f"{FLAGS[name]} {value}"


class Alternative(Frozen):
    """A nearby query that selects: ``backend`` (None = no backend, the platform
    default) and ``kv_cache_dtype``. ``changes`` names what differs from the
    query (``backend``, ``kv_cache_dtype``); ``also`` lists further kv dtypes
    that, with the same change, select the same cache; ``selection`` is the
    result for ``kv_cache_dtype``."""

    __slots__ = ("backend", "kv_cache_dtype", "changes", "also", "selection")

    backend: str | None
    kv_cache_dtype: str
    changes: tuple[str, ...]
    also: tuple[str, ...]
    selection: Selection

    @property
    def flags(self) -> str:
        """The change as vLLM flags, e.g. ``--kv-cache-dtype auto`` (``explain``'s column)."""
        return self._flags(name_default=False)

    @property
    def suggestion(self) -> str:
        """:attr:`flags` standing alone, as ``SelectionError.suggestions`` carries
        it: dropping ``--attention-backend`` also names the backend the default
        picks, which ``explain`` shows in a column of its own."""
        return self._flags(name_default=True)

    def _flags(self, name_default: bool) -> str:
        parts = []
        if "backend" in self.changes:
            parts.append(flag("backend", self.backend)
                         + (f" (picks {self.selection.backend})" if name_default and self.backend is None else ""))
        if "kv_cache_dtype" in self.changes:
            parts.append(flag("kv_cache_dtype", self.kv_cache_dtype))
        return " ".join(parts)


def nearest(rules, query: Query, limit: int = LIMIT) -> tuple[Alternative, ...]:
    """The nearest changes of (backend, kv dtype) that select on ``rules`` (a
    :class:`~dsv4sel.dsv4.rules.RuleSet`), keeping the platform, capability,
    model and pack inputs; at most ``limit``, in the order of the module
    docstring; empty when nothing on this platform and capability works."""
    picked = _pick(rules, sorted(_candidates(rules, query), key=lambda f: f[:3]), limit)
    out = []
    for backend, kv, changes, also, _ in picked:
        selection = rules.outcome(query.replace(backend=backend, kv_cache_dtype=kv))
        assert isinstance(selection, Selection)  # picked from select rows only
        out.append(Alternative(backend, kv, changes, tuple(also), selection))
    return tuple(out)


def _candidates(rules, query: Query) -> list[tuple]:
    """Every (backend, kv dtype) change that selects, as ``(number of changes, backend
    rank, kv rank, backend, kv, changes, row)``."""
    backends = [query.backend] if query.backend is not None else []
    backends += [None] + [b for b in rules.selectable_backends if b != query.backend]
    found = []
    for brank, backend in enumerate(backends):
        for krank, kv in enumerate(rules.values("kv_cache_dtype")):
            changes = tuple(name for name, differs in (("backend", backend != query.backend),
                                                       ("kv_cache_dtype", kv != query.kv_cache_dtype))
                            if differs)
            if not changes:
                continue
            row = rules.row(rules.key(query, backend=backend, kv_cache_dtype=kv))
            if row is not None and row.kind == "select":  # a hand-over (use:) is a fine alternative too
                found.append((len(changes), brank, krank, backend, kv, changes, row))
    return found


def _pick(rules, found: list[tuple], limit: int) -> list[list]:
    """One candidate per distinct result, smallest change first; a twin that differs only
    in the kv dtype is listed under ``also`` of the first."""
    picked: list[list] = []  # [backend, kv, changes, also, row]
    for _, _, _, backend, kv, changes, row in found:
        twin = next((p for p in picked if rules.same_result(p[4], row)), None)
        if twin is not None:
            if twin[0] == backend and twin[2] == changes:
                twin[3].append(kv)
            continue
        if len(picked) < limit:
            picked.append([backend, kv, changes, [], row])
    return picked
