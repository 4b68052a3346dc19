"""Read-only probes of a compiled :class:`~dsv4sel.ruleset.RuleSet`.

``explain``, ``table`` and ``doctor`` all ask the same questions of the
precomputed decision table: what happens at one point, which backends can
serve a platform at all, which kv dtypes a backend accepts on one
capability. They answer them here, from the compiled rows alone, so none of
them needs yaml, jsonschema or torch.

A compiled outcome row is one of (see ``Program.to_table``)::

    ("select", backend, impl, layout, cache_dtype, torch_dtype, bytes_per_token,
     block_size, rewrites, messages, path)
    ("reject", backend, reason, path, messages)
    ("gap", backend, table, path)
"""

from __future__ import annotations

from .ruleset import RuleSet
from .values import Query

#: The name compile.py gives the default-backend decision table. Mirrored, not
#: imported: importing the compiler would pull in yaml.
DEFAULT_TABLE = "<default>"


def at(rules: RuleSet, query: Query, backend: str | None = None, kv_cache_dtype: str | None = None,
       capability: str | None = None) -> tuple:
    """The compiled outcome row for ``query`` with some inputs replaced.

    ``backend`` None keeps nothing: it asks the platform default, like a query
    without ``--attention-backend``. Pass ``query.backend`` to keep the query's.
    """
    point = Query(query.model, query.platform,
                  query.capability if capability is None else capability,
                  backend,
                  query.kv_cache_dtype if kv_cache_dtype is None else kv_cache_dtype,
                  query.extra)
    # normalize() admits only declared values, so every such point is in the table
    return rules._outcomes[rules._table[rules.key(point)]]


def path_of(row: tuple) -> tuple[int, ...]:
    """Rule indices consulted for ``row``, the default-decision rule first."""
    return row[10] if row[0] == "select" else row[3]


def serves(row: tuple, backend: str) -> bool:
    """True when ``row`` selects and the selected backend is ``backend`` itself
    (not another backend reached through a ``use:`` rule)."""
    return row[0] == "select" and row[1] == backend


def accepted_kv(rules: RuleSet, query: Query, backend: str, capability: str | None = None) -> tuple[str, ...]:
    """The kv dtypes with which ``backend``, requested explicitly, serves the
    query's platform at ``capability`` (default: the query's), vocabulary order."""
    return tuple(kv for kv in rules.values("kv_cache_dtype")
                 if serves(at(rules, query, backend, kv, capability), backend))


def platform_backends(rules: RuleSet, query: Query) -> tuple[str, ...]:
    """The selectable backends that serve the query's platform at some
    capability with some kv dtype, in rule-file order. A backend that only
    hands over to another one there (FLASHMLA_SPARSE_DSV4 on ROCm) is not one
    of the platform's backends."""
    caps = rules.values("capability", query.platform)
    return tuple(b for b in rules.selectable_backends
                 if any(accepted_kv(rules, query, b, cap) for cap in caps))


def same_result(a: tuple, b: tuple) -> bool:
    """Two select rows store the same cache the same way: backend, impl,
    layout, torch dtype, bytes per token and block size. The cache dtype
    string is left out on purpose: ``auto`` and ``bfloat16`` on a bf16-row
    backend keep different strings for the same bytes."""
    return (a[0] == b[0] == "select" and a[1:4] == b[1:4] and a[5:8] == b[5:8])
