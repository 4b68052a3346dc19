"""Stage 4, evaluate: the compiled, immutable rule set and its lookups.

A :class:`RuleSet` is built from the plain data of ``Program.to_table()``:
every point of the decision space maps to an outcome index in a dense array
(:class:`OutcomeTable`), so a query costs one normalization and one indexed
lookup; results are memoized per raw query, so a repeated query is one dict
probe. This module imports neither yaml, jsonschema nor torch.
"""

from __future__ import annotations

from types import MappingProxyType

from .errors import InvalidQuery, SelectionError
from .values import Message, Query, RuleRef, Selection

BUILTIN = ("model", "platform", "capability", "kv_cache_dtype")
_MEMO_LIMIT = 65536


TYPE_CHECKING = False
if TYPE_CHECKING:  # importing typing costs ~5 ms; with postponed annotations it is not needed
    from typing import Any, Mapping


def _nearest(word: str, candidates) -> list[str]:
    import difflib  # only on the error path

    return difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)


class OutcomeTable:
    """Read-only mapping from a key ``(model, platform, capability, backend,
    kv_cache_dtype, *extra inputs)`` to an outcome index, over the dense array
    that ``Program.to_table`` stores (see ``dsv4sel.compile.DenseLayout``)."""

    def __init__(self, data: dict):
        self._key_inputs = tuple(data["key_inputs"])
        position = {name: i for i, name in enumerate(self._key_inputs)}
        self._block_positions = tuple(position[n] for n in data["block_inputs"])
        self._blocks = data["blocks"]
        self._dense_values = tuple(tuple(v) for v in data["dense_values"])
        size = 1
        for values in self._dense_values:
            size *= len(values)
        dense = []
        stride = size
        for name, values in zip(data["dense_inputs"], self._dense_values):
            stride //= len(values)
            dense.append((position[name], {v: i for i, v in enumerate(values)}, stride))
        self._dense = tuple(dense)
        self._dense_names = tuple(data["dense_inputs"])
        self._block_names = tuple(data["block_inputs"])
        self._ids = memoryview(data["ids"]).cast(data["typecode"])

    def get(self, key: tuple, default=None):
        """The outcome index of ``key``, or ``default`` when the key is outside the space."""
        try:
            offset = self._blocks.get(tuple(key[i] for i in self._block_positions))
        except (IndexError, TypeError):
            return default
        if offset is None:
            return default
        for index, positions, stride in self._dense:
            j = positions.get(key[index])
            if j is None:
                return default
            offset += j * stride
        return self._ids[offset]

    def __getitem__(self, key: tuple) -> int:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self._ids)

    def keys(self):
        import itertools

        for block in self._blocks:
            fixed = dict(zip(self._block_names, block))
            for combo in itertools.product(*self._dense_values):
                values = dict(fixed, **dict(zip(self._dense_names, combo)))
                yield tuple(values[n] for n in self._key_inputs)

    __iter__ = keys

    def items(self):
        for key in self.keys():
            yield key, self[key]

    def values(self):
        return iter(self._ids)


class Rejection:
    """A rejected point; :meth:`error` builds a fresh SelectionError to raise."""

    __slots__ = ("ruleset", "query", "reason", "rule", "path", "messages", "gap", "backend", "suggestions")

    def __init__(self, ruleset, query, reason, rule, path, messages=(), gap=False, backend=None):
        self.ruleset, self.query, self.reason, self.backend = ruleset, query, reason, backend
        self.suggestions: tuple[str, ...] | None = None
        self.rule, self.path, self.messages, self.gap = rule, path, messages, gap

    def error(self) -> SelectionError:
        """A fresh exception to raise; the suggestions are computed once per memoized rejection."""
        if self.suggestions is None:
            self.suggestions = self.ruleset.suggestions(self.query)
        return SelectionError(self.message(), suggestions=self.suggestions,
                              rule=self.rule, query=self.query, path=self.path)

    def message(self) -> str:
        q = self.query
        backend = q.backend or (f"{self.backend} (the default there)" if self.backend
                                else "the default backend")
        where = f" [rule {self.rule.id} at {self.rule.location}]" if self.rule else ""
        return (f"DeepSeek-V4 attention: no selection for {backend} with kv-cache dtype "
                f"{q.kv_cache_dtype!r} on {q.platform} {q.capability} ({q.model}): {self.reason}{where}")


class RuleSet:
    """Compiled rules: the decision for every point of the declared space.

    Build one with :func:`dsv4sel.load_rules`. Instances are immutable and safe
    to share between threads (the memo is a plain dict of immutable values).
    """

    def __init__(self, data: dict[str, Any], digest: str):
        self.digest = digest
        self._inputs = {name: (tuple(values), by, dict(scoped) if scoped else None, default, fallback)
                        for name, values, by, scoped, default, fallback, _probe in data["inputs"]}
        #: input name -> impl class whose is_available() tells which value this machine has
        self.probes: dict[str, str] = {row[0]: row[6] for row in data["inputs"] if row[6]}
        self.extra_inputs: tuple[str, ...] = tuple(n for n in self._inputs if n not in BUILTIN)
        self.backends: tuple[str, ...] = tuple(data["backends"])
        self._backend_set = frozenset(self.backends)
        #: backends that select something somewhere in the space (the others only reject)
        self.selectable_backends: tuple[str, ...] = tuple(data["selectable"])
        self._rule_rows = data["rules"]
        self._rules: dict[int, RuleRef] = {}
        self._outcomes = data["outcomes"]
        self._table = OutcomeTable(data["table"])
        self.allowed_impl_modules: tuple[str, ...] = tuple(data["allowed"])
        self.sources: tuple[str, ...] = tuple(data["sources"])
        self._memo: dict[tuple, Selection | Rejection] = {}

    # ------------------------------------------------------------ vocabulary
    def values(self, name: str, platform: str | None = None) -> tuple[str, ...]:
        """Declared values of input ``name`` (of one platform, for scoped inputs)."""
        if name == "backend":
            return self.backends
        values, by, scoped, _, _ = self._inputs[name]
        if scoped is not None and platform is not None:
            return tuple(scoped.get(platform, ()))
        return values

    def default_of(self, name: str) -> str | None:
        return self._inputs[name][3]

    def rule(self, index: int) -> RuleRef:
        ref = self._rules.get(index)
        if ref is None:
            rid, file, line, pack, _table = self._rule_rows[index]
            ref = self._rules[index] = RuleRef(rid, file, line, pack)
        return ref

    @property
    def rules(self) -> tuple[RuleRef, ...]:
        return tuple(self.rule(i) for i in range(len(self._rule_rows)))

    def rule_table(self, index: int) -> str:
        return self._rule_rows[index][4]

    @property
    def size(self) -> int:
        """Number of points in the decision space (backend included)."""
        return len(self._table)

    def keys(self):
        return self._table.keys()

    # --------------------------------------------------------- normalization
    def _invalid(self, what: str, value: Any, valid, hint: str = "", flag: str = "") -> InvalidQuery:
        near = _nearest(value, valid) if isinstance(value, str) else []
        text = f"unknown {what} {value!r}"
        text += f"; did you mean {near[0]!r}?" if near else "."
        text += f" Valid {what} values: {', '.join(valid)}" + hint
        return InvalidQuery(text, suggestions=tuple(f"{flag} {n}".strip() for n in near))

    def normalize(self, *, platform: Any, kv_cache_dtype: Any = "auto", backend: Any = None,
                  capability: Any = None, model: Any = "deepseek_v4",
                  extra: Mapping[str, Any] | None = None) -> tuple[Query, tuple[Message, ...]]:
        """Turn raw query values into a :class:`Query` of declared values.

        Raises :class:`InvalidQuery` (a SelectionError) for anything outside the
        vocabulary. Returns the messages normalization produced (e.g. an
        undeclared capability decided as ``unknown``)."""
        notes: list[Message] = []
        models = self.values("model")
        if not isinstance(model, str) or model not in models:
            raise self._invalid("model", model, models)
        platforms = self.values("platform")
        plat = platform.lower() if isinstance(platform, str) else platform
        if plat not in platforms:
            raise self._invalid("platform", platform, platforms)
        cap = self._capability(plat, capability, notes)
        if backend is None or backend == "":
            name = None
        else:
            name = getattr(backend, "name", backend)
            if not isinstance(name, str):
                raise InvalidQuery(f"backend must be None, a name or an enum member, not {type(backend).__name__}")
            name = name.strip().upper()
            if name not in self._backend_set:
                others = [b for b in self.backends if b not in self.selectable_backends]
                hint = (" (or no backend for the platform default)"
                        + (f"; known but not DeepSeek-V4 backends: {', '.join(others)}" if others else ""))
                near = _nearest(name, self.backends)
                text = f"unknown attention backend {name!r}"
                text += f"; did you mean {near[0]!r}?" if near else "."
                raise InvalidQuery(text + " DeepSeek-V4 backends: " + ", ".join(self.selectable_backends)
                                   + hint, suggestions=tuple(f"--attention-backend {n}" for n in near))
        kv = kv_cache_dtype.strip().lower() if isinstance(kv_cache_dtype, str) else kv_cache_dtype
        kvs = self.values("kv_cache_dtype")
        if kv not in kvs:
            raise self._invalid("kv-cache dtype", kv_cache_dtype, kvs, flag="--kv-cache-dtype")
        extras = []
        given = dict(extra or {})
        for key in given:
            if key not in self.extra_inputs:
                raise InvalidQuery(f"unknown input {key!r}; the rules declare: "
                                   + ", ".join(BUILTIN + self.extra_inputs))
        for name_ in self.extra_inputs:
            value = given.get(name_, self.default_of(name_))
            valid = self.values(name_)
            if value not in valid:
                raise self._invalid(name_, value, valid)
            extras.append((name_, value))
        return Query(model, plat, cap, name, kv, tuple(extras)), tuple(notes)

    def _capability(self, platform: str, capability: Any, notes: list[Message]) -> str:
        values, _, _, default, fallback = self._inputs["capability"]
        valid = self.values("capability", platform)
        if capability is None:
            return default if default in valid else valid[-1]
        if isinstance(capability, tuple) and len(capability) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in capability):
            text = f"{capability[0]}.{capability[1]}"
        elif isinstance(capability, str) and capability.strip():
            # torch reports ROCm arches as e.g. "gfx942:sramecc+:xnack-"
            text = capability.strip().split(":")[0].lower()
        else:
            raise InvalidQuery(f"capability must be a string such as '9.0' or 'gfx942', a "
                               f"(major, minor) tuple or None, not {capability!r}")
        if text in valid:
            return text
        if fallback is not None and fallback in valid:
            notes.append(Message(f"capability {text!r} is not declared for {platform} in the rule "
                                 f"vocabulary; deciding as {fallback!r}", "warning"))
            return fallback
        raise self._invalid(f"{platform} capability", text, valid)

    # ------------------------------------------------------------ evaluation
    def key(self, query: Query) -> tuple:
        return (query.model, query.platform, query.capability, query.backend,
                query.kv_cache_dtype, *(v for _, v in query.extra))

    def outcome(self, query: Query, notes: tuple[Message, ...] = ()) -> Selection | Rejection:
        """The decision for a normalized query (a Selection, or a Rejection to raise)."""
        index = self._table.get(self.key(query))
        if index is None:  # pragma: no cover - normalize() admits only declared points
            return Rejection(self, query, "the query is outside the decision space", None, ())
        row = self._outcomes[index]
        kind = row[0]
        if kind == "select":
            (_, backend, impl, layout, cache_dtype, torch_dtype, bpt, block, rewrites,
             messages, path, hosts) = row
            refs = tuple(self.rule(i) for i in path)
            return Selection(
                backend=backend, impl=impl, layout=layout, cache_dtype=cache_dtype,
                torch_dtype_name=torch_dtype, bytes_per_token=bpt, block_size=block,
                rewrites=MappingProxyType(dict(rewrites)),
                messages=notes + tuple(Message(text, level) for level, text in messages),
                rule=refs[-1], path=refs, query=query,
                allowed_impl_modules=self.allowed_impl_modules, hosts=hosts)
        if kind == "reject":
            _, backend, reason, path, _messages = row
            refs = tuple(self.rule(i) for i in path)
            return Rejection(self, query, reason, refs[-1], refs, backend=backend)
        _, backend, table, path = row
        refs = tuple(self.rule(i) for i in path)
        where = "the default-backend decision" if table == "<default>" else f"the table of {table}"
        return Rejection(self, query, f"no rule in {where} decides this input (a gap in the rules; "
                         "`dsv4sel check` lists all gaps)", refs[-1] if refs else None, refs, gap=True,
                         backend=backend)

    def select(self, platform, kv_cache_dtype="auto", backend=None, capability=None,
               model="deepseek_v4", extra=None) -> Selection:
        """Like :func:`dsv4sel.select` on this rule set."""
        memo_key = (platform, kv_cache_dtype, backend, capability, model)
        if extra:
            try:
                memo_key += tuple(sorted(extra.items()))
            except TypeError:  # unorderable keys: normalize() reports them
                pass
        try:
            hit = self._memo.get(memo_key)
        except TypeError:  # unhashable raw input (a list capability...): just don't memoize
            hit, memo_key = None, None
        if hit is None:
            query, notes = self.normalize(platform=platform, kv_cache_dtype=kv_cache_dtype, backend=backend,
                                          capability=capability, model=model, extra=extra)
            hit = self.outcome(query, notes)
            if memo_key is not None:
                if len(self._memo) >= _MEMO_LIMIT:
                    self._memo.clear()
                self._memo[memo_key] = hit
        if hit.__class__ is Selection:
            return hit
        raise hit.error()

    # ----------------------------------------------------------- alternatives
    def alternatives(self, query: Query, limit: int = 4) -> list[tuple[str | None, str, Selection]]:
        """The nearest changes of (backend, kv dtype) that select, keeping the
        platform, capability and model: one change before two, the platform
        default before explicit backends, vocabulary order otherwise. One
        alternative per backend, and none that repeats an earlier one's
        result (naming the default backend explicitly adds nothing)."""
        found: list[tuple[int, int, int, str | None, str]] = []
        backends = (None, *self.backends)
        kvs = self.values("kv_cache_dtype")
        head = (query.model, query.platform, query.capability)
        tail = tuple(v for _, v in query.extra)
        table, outcomes = self._table, self._outcomes
        for bi, backend in enumerate(backends):
            for ki, kv in enumerate(kvs):
                changes = (backend != query.backend) + (kv != query.kv_cache_dtype)
                if changes == 0:
                    continue
                index = table.get((*head, backend, kv, *tail))
                if index is not None and outcomes[index][0] == "select":
                    found.append((changes, bi, ki, backend, kv))
        found.sort()
        out = []
        seen_backends: set = set()
        seen_results: set = set()
        for _changes, _, _, backend, kv in found:
            if backend in seen_backends:
                continue
            alt = Query(query.model, query.platform, query.capability, backend, kv, query.extra)
            selection = self.outcome(alt)
            result = (selection.backend, selection.layout, selection.cache_dtype, kv)
            if result in seen_results:
                continue
            seen_backends.add(backend)
            seen_results.add(result)
            out.append((backend, kv, selection))
            if len(out) >= limit:
                break
        return out

    def suggestions(self, query: Query) -> tuple[str, ...]:
        """Engine flags for :meth:`alternatives`, e.g. ``--kv-cache-dtype fp8``."""
        out = []
        for backend, kv, selection in self.alternatives(query):
            parts = []
            if backend != query.backend:
                parts.append(f"--attention-backend {backend}" if backend
                             else f"no --attention-backend (picks {selection.backend})")
            if kv != query.kv_cache_dtype:
                parts.append(f"--kv-cache-dtype {kv}")
            out.append(" ".join(parts))
        return tuple(out)
