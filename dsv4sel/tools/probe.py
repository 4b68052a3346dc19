"""Read-only probes of a compiled :class:`~dsv4sel.dsv4.rules.RuleSet`.

``explain``, ``table`` and ``doctor`` all ask the same questions of the
precomputed decision table: what happens at one point, which backends can
serve a platform at all, which kv dtypes a backend accepts on one
capability. They answer them here, from the compiled rows alone, so none of
them needs yaml, jsonschema or torch.

A compiled outcome row is a :class:`~dsv4sel.engine.artifact.SelectRow`,
``RejectRow`` or ``GapRow`` (fields by name; ``row.kind`` tells which), read
through the rule set's public API (``rows``, ``index``, ``row``, ``items``).

Speed matters: ``dsv4sel explain`` runs within a cold-start budget. Every key
comes from ``RuleSet.key`` (the profile's order), "does backend X serve this
platform somewhere" is one batch lookup of a point and its neighbours
(``RuleSet.around``), and "does this select backend X" is a membership test of
the outcome index in a precomputed set.
"""

from __future__ import annotations

import weakref

from ..engine.artifact import Row
from ..dsv4.rules import RuleSet
from ..dsv4.selection import Query

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs the cold start; the guard type is for the checker only
    from typing import TypeGuard

    from ..engine.artifact import SelectRow

#: The name compile.py gives the default-backend decision table. Mirrored, not
#: imported: importing the compiler would pull in yaml.
DEFAULT_TABLE = "<default>"

#: ``at(..., backend=KEEP)`` keeps the query's backend; None asks the platform default.
KEEP = object()

# RuleSet -> {backend or None: frozenset of outcome indices that select it}
_serving_memo: "weakref.WeakKeyDictionary[RuleSet, dict]" = weakref.WeakKeyDictionary()


def _memo(rules: RuleSet) -> dict:
    memo = _serving_memo.get(rules)
    if memo is None:
        memo = _serving_memo[rules] = {}
    return memo


def _serving(rules: RuleSet, backend: str | None) -> frozenset[int]:
    """Indices of the outcome rows that select ``backend`` itself (any backend for None);
    every backend's set is made in one pass over the rows, the first time one is asked."""
    memo = _memo(rules)
    if not memo:
        by_backend: dict[str | None, list[int]] = {None: []}
        for i, row in enumerate(rules.rows):
            if row.kind == "select":
                by_backend[None].append(i)
                by_backend.setdefault(row.backend, []).append(i)
        memo.update((b, frozenset(ids)) for b, ids in by_backend.items())
    return memo.get(backend, frozenset())


def _changes(backend, kv_cache_dtype, capability, extra, model) -> dict:
    """The inputs :func:`at` replaces, by name (what ``RuleSet.key`` takes)."""
    changes = dict(extra or ())
    for name, value in (("model", model), ("capability", capability), ("kv_cache_dtype", kv_cache_dtype)):
        if value is not None:
            changes[name] = value
    if backend is not KEEP:
        changes["backend"] = backend
    return changes


def index_at(rules: RuleSet, query: Query, backend=KEEP, kv_cache_dtype: str | None = None,
             capability: str | None = None, extra: tuple | None = None, model: str | None = None) -> int:
    """The outcome index for ``query`` with some inputs replaced (see :func:`at`)."""
    # normalize() admits only declared values, so every such point is in the table
    index = rules.index(rules.key(query, **_changes(backend, kv_cache_dtype, capability, extra, model)))
    assert index is not None, "a point outside the decision space"
    return index


def at(rules: RuleSet, query: Query, backend=KEEP, kv_cache_dtype: str | None = None,
       capability: str | None = None, extra: tuple | None = None, model: str | None = None) -> Row:
    """The compiled outcome row for ``query`` with some inputs replaced.

    ``backend`` None asks the platform default (no ``--attention-backend``);
    the other replacements default to the query's own values; ``extra``
    replaces pack-declared inputs, as ``(name, value)`` pairs.
    """
    return rules.rows[index_at(rules, query, backend, kv_cache_dtype, capability, extra, model)]


def path_of(row: Row) -> tuple[int, ...]:
    """Rule indices consulted for ``row``, the default-decision rule first."""
    return row.path


def serves(row: Row, backend: str | None) -> TypeGuard[SelectRow]:
    """True when ``row`` selects ``backend`` itself (not another backend reached
    through a ``use:`` rule); for ``backend`` None, when it selects anything."""
    return row.kind == "select" and (backend is None or row.backend == backend)


def extra_combos(rules: RuleSet) -> list[tuple[tuple[str, str], ...]]:
    """Every combination of the values of the inputs a query carries in ``extra``
    (:attr:`~dsv4sel.dsv4.rules.RuleSet.plain_inputs`, such as ``mega_attn``), as
    ``Query.extra`` tuples; ``[()]`` when there are none."""
    combos: list[tuple[tuple[str, str], ...]] = [()]
    for name in rules.plain_inputs:
        combos = [c + ((name, v),) for c in combos for v in rules.values(name)]
    return combos


def default_extra(rules: RuleSet) -> tuple[tuple[str, str], ...]:
    """The inputs a query carries in ``extra`` at their declared defaults."""
    out = []
    for name in rules.plain_inputs:
        default = rules.default_of(name)
        assert default is not None, "the compiler requires a default of every input a query carries in extra (DSV305)"
        out.append((name, default))
    return tuple(out)


def accepted_kv(rules: RuleSet, query: Query, backend: str | None) -> tuple[str, ...]:
    """The kv dtypes with which ``backend`` (None: the platform default) serves
    the query's platform, capability and pack inputs, in vocabulary order."""
    ids = _serving(rules, backend)
    return tuple(kv for kv in rules.values("kv_cache_dtype")
                 if rules.index(rules.key(query, backend=backend, kv_cache_dtype=kv)) in ids)


def serves_somewhere(rules: RuleSet, query: Query, backend: str | None, *, anywhere: bool = True,
                     **changes: str) -> bool:
    """True when ``backend`` (None: the platform default) selects at the query's
    point with the inputs of ``changes`` replaced, with some kv dtype; with
    ``anywhere``, also at any capability of the platform and any values of the
    pack-declared inputs. One batch lookup of the point and its neighbours
    (:meth:`~dsv4sel.engine.ruleset.CompiledRules.around`), not one per neighbour."""
    vary: dict[str, None] = {"kv_cache_dtype": None}
    if anywhere:
        vary.update(dict.fromkeys(("capability", *rules.plain_inputs)))
    found = rules.around(rules.key(query, backend=backend, **changes), **vary)
    return not _serving(rules, backend).isdisjoint(found)


def platform_backends(rules: RuleSet, query: Query) -> tuple[str, ...]:
    """The backends that serve the query's platform and model somewhere, in
    rule-file order. A backend that only hands over to another one there
    (FLASHMLA_SPARSE_DSV4 on ROCm) is not one of the platform's backends."""
    return tuple(b for b in rules.selectable_backends if serves_somewhere(rules, query, b))
