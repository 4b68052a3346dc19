"""Read-only probes of a compiled :class:`~dsv4sel.dsv4.rules.RuleSet`.

``explain``, ``table`` and ``doctor`` all ask the same questions of the
precomputed decision table: what happens at one point, which backends can
serve a platform at all, which kv dtypes a backend accepts on one
capability. They answer them here, from the compiled rows alone, so none of
them needs yaml, jsonschema or torch.

A compiled outcome row is a :class:`~dsv4sel.engine.artifact.SelectRow`,
``RejectRow`` or ``GapRow`` (fields by name; ``row.kind`` tells which), read
through the rule set's public API (``rows``, ``index``, ``row``, ``items``).

Speed matters: ``dsv4sel explain`` runs a few thousand lookups per process
within a cold-start budget. Keys are therefore built as plain tuples in the
order of ``RuleSet.key`` (no Query objects), and "does this select backend
X" is a membership test of the outcome index in a precomputed set.
"""

from __future__ import annotations

import weakref

from ..engine.artifact import Row
from ..dsv4.rules import RuleSet
from ..dsv4.selection import Query

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
    """Indices of the outcome rows that select ``backend`` itself (any backend for None)."""
    memo = _memo(rules)
    ids = memo.get(backend)
    if ids is None:
        ids = memo[backend] = frozenset(i for i, row in enumerate(rules.rows) if serves(row, backend))
    return ids


def _values(extra: tuple) -> tuple:
    return tuple(v for _, v in extra)


def index_at(rules: RuleSet, query: Query, backend=KEEP, kv_cache_dtype: str | None = None,
             capability: str | None = None, extra: tuple | None = None, model: str | None = None) -> int:
    """The outcome index for ``query`` with some inputs replaced (see :func:`at`)."""
    key = (query.model if model is None else model, query.platform,
           query.capability if capability is None else capability,
           query.backend if backend is KEEP else backend,
           query.kv_cache_dtype if kv_cache_dtype is None else kv_cache_dtype,
           *_values(query.extra if extra is None else extra))
    # normalize() admits only declared values, so every such point is in the table
    return rules.index(key)


def at(rules: RuleSet, query: Query, backend=KEEP, kv_cache_dtype: str | None = None,
       capability: str | None = None, extra: tuple | None = None, model: str | None = None) -> Row:
    """The compiled outcome row for ``query`` with some inputs replaced.

    ``backend`` None asks the platform default (no ``--attention-backend``);
    the other replacements default to the query's own values.
    """
    return rules.rows[index_at(rules, query, backend, kv_cache_dtype, capability, extra, model)]


def path_of(row: Row) -> tuple[int, ...]:
    """Rule indices consulted for ``row``, the default-decision rule first."""
    return row.path


def serves(row: Row, backend: str | None) -> bool:
    """True when ``row`` selects ``backend`` itself (not another backend reached
    through a ``use:`` rule); for ``backend`` None, when it selects anything."""
    return row.kind == "select" and (backend is None or row.backend == backend)


def extra_combos(rules: RuleSet) -> list[tuple[tuple[str, str], ...]]:
    """Every combination of the values of the pack-declared inputs (such as
    ``mega_attn``), as ``Query.extra`` tuples; ``[()]`` when there are none."""
    combos: list[tuple[tuple[str, str], ...]] = [()]
    for name in rules.extra_inputs:
        combos = [c + ((name, v),) for c in combos for v in rules.values(name)]
    return combos


def default_extra(rules: RuleSet) -> tuple[tuple[str, str], ...]:
    """The pack-declared inputs at their declared defaults."""
    return tuple((name, rules.default_of(name)) for name in rules.extra_inputs)


def accepted_kv(rules: RuleSet, query: Query, backend: str | None, capability: str | None = None,
                extra: tuple | None = None) -> tuple[str, ...]:
    """The kv dtypes with which ``backend`` (None: the platform default) serves
    the query's platform at ``capability`` and ``extra`` (default: the
    query's own), in vocabulary order."""
    ids = _serving(rules, backend)
    head = (query.model, query.platform, query.capability if capability is None else capability, backend)
    tail = _values(query.extra if extra is None else extra)
    get = rules.index
    return tuple(kv for kv in rules.values("kv_cache_dtype") if get((*head, kv, *tail)) in ids)


def serves_somewhere(rules: RuleSet, query: Query, backend: str | None, capabilities=None,
                     combos=None, model: str | None = None) -> bool:
    """True when ``backend`` serves the query's platform and model (or
    ``model``) at one of ``capabilities`` (default: all of the platform's)
    with some kv dtype and one of ``combos`` of the pack-declared inputs
    (default: all of them)."""
    m = query.model if model is None else model
    caps = rules.values("capability", query.platform) if capabilities is None else tuple(capabilities)
    combos = extra_combos(rules) if combos is None else combos
    # memoized per rule set: explaining many queries asks the same questions
    memo_key = ("somewhere", backend, m, query.platform, caps, tuple(combos))
    memo = _memo(rules)
    found = memo.get(memo_key)
    if found is None:
        found = memo[memo_key] = _scan(rules, backend, m, query.platform, caps, combos)
    return found


def _scan(rules: RuleSet, backend: str | None, model: str, platform: str, caps, combos) -> bool:
    ids = _serving(rules, backend)
    get = rules.index
    kvs = rules.values("kv_cache_dtype")
    for cap in caps:
        head = (model, platform, cap, backend)
        for extra in combos:
            tail = _values(extra)
            for kv in kvs:
                if get((*head, kv, *tail)) in ids:
                    return True
    return False


def platform_backends(rules: RuleSet, query: Query) -> tuple[str, ...]:
    """The backends that serve the query's platform and model somewhere, in
    rule-file order. A backend that only hands over to another one there
    (FLASHMLA_SPARSE_DSV4 on ROCm) is not one of the platform's backends."""
    return tuple(b for b in rules.selectable_backends if serves_somewhere(rules, query, b))
