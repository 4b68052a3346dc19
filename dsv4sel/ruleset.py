"""Stage 4, evaluate: the compiled, immutable rule set and its lookups.

A :class:`RuleSet` is built from the plain data of ``dsv4sel.lower.to_table``:
every point of the decision space maps to an outcome index in a dense array
(:class:`OutcomeTable`), so a query costs one normalization and one indexed
lookup; results are memoized per raw query, so a repeated query is one dict
probe. This module imports neither yaml, jsonschema nor torch.
"""

from __future__ import annotations

from types import MappingProxyType

from .artifact import OutcomeTable, Row, all_below, loaded
from .errors import InvalidQuery, SelectionError
from .values import Message, Query, RuleRef, Selection, check_impl_allowed

BUILTIN = ("model", "platform", "capability", "kv_cache_dtype")
_MEMO_LIMIT = 65536
#: Version of the data ``dsv4sel.lower.to_table`` writes and :class:`RuleSet` reads.
COMPILED_FORMAT = 3  # 3: select rows end with their host classes


class CorruptTable(ValueError):
    """Compiled data that is not what ``dsv4sel.lower.to_table`` writes (a damaged
    or hand-edited cache entry); :func:`dsv4sel.load_rules` rebuilds it."""


TYPE_CHECKING = False
if TYPE_CHECKING:  # importing typing costs ~5 ms; with postponed annotations it is not needed
    from typing import Any, Mapping


def _memo_key(platform, kv_cache_dtype, backend, capability, model, extra) -> tuple | None:
    """The memo key of a raw query, or None when it must not be memoized.

    Python calls ``9.0 == 9`` and ``True == 1`` equal, so a memo keyed on raw
    values would answer ``(9.0, 0)`` with what ``(9, 0)`` got. Keys hold
    exact types only: ``str`` and None as given; a tuple capability or an
    enum backend under a tag no raw value can equal (so the hot path in
    :func:`dsv4sel.select`, which probes the memo with raw values, misses
    them and comes here)."""
    if type(platform) is not str or type(kv_cache_dtype) is not str or type(model) is not str:
        return None
    if backend is not None and type(backend) is not str:
        name = getattr(backend, "name", None)
        if type(name) is not str:
            return None
        backend = ("enum", name)
    if capability is not None and type(capability) is not str:
        if type(capability) is not tuple or not all(type(x) is int for x in capability):
            return None
        capability = ("tuple", *capability)
    key = (platform, kv_cache_dtype, backend, capability, model)
    if extra:
        items = sorted(extra.items())  # keyword arguments: the names are str
        for _name, value in items:
            if value.__class__ is not str:
                return None
        key += tuple(items)
    return key


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

    def __init__(self, data: dict[str, Any], digest: str,
                 allowed_impl_modules: tuple[str, ...] | None = None):
        """``data`` is ``dsv4sel.lower.to_table``'s result, possibly read back from
        the cache: it is checked here, and :class:`CorruptTable` raised when
        it is not what the compiler writes. ``allowed_impl_modules`` is the
        process's allow-list (default: the one the data was compiled with);
        every impl the data names must lie inside it."""
        try:
            self._load(data)
        except CorruptTable:
            raise
        except Exception as exc:  # any shape error of untrusted data
            raise CorruptTable(f"compiled rules are damaged: {type(exc).__name__}: {exc}") from None
        self.digest = digest
        if allowed_impl_modules is None:
            allowed_impl_modules = tuple(data["allowed"])
        self.allowed_impl_modules: tuple[str, ...] = tuple(allowed_impl_modules)
        impls = {row.impl for row in self.rows if row.kind == "select"} | set(self.probes.values())
        for impl in impls:
            try:
                check_impl_allowed(impl, self.allowed_impl_modules)
            except Exception as exc:
                raise CorruptTable(f"compiled rules name an impl outside the allowed modules: {exc}") from None
        #: raw query -> Selection or Rejection; :func:`dsv4sel.select` probes it first (its hot path)
        self.memo: dict[tuple, Selection | Rejection] = {}

    def _load(self, data: dict[str, Any]) -> None:
        if data.get("format") != COMPILED_FORMAT:
            raise CorruptTable(f"compiled format {data.get('format')!r}, expected {COMPILED_FORMAT}")
        self._inputs = {}
        self._alias_spellings: dict[str, tuple] = {}
        for name, values, by, scoped, default, fallback, probe, aliases in data["inputs"]:
            self._inputs[name] = (tuple(values), by, dict(scoped) if scoped else None, default, fallback)
            self._alias_spellings[name] = tuple((str(a), str(v)) for a, v in aliases)
        #: input name -> impl class whose is_available() tells which value this machine has
        self.probes: dict[str, str] = {row[0]: row[6] for row in data["inputs"] if row[6]}
        self.extra_inputs: tuple[str, ...] = tuple(n for n in self._inputs if n not in BUILTIN)
        if any(n not in self._inputs for n in BUILTIN):
            raise CorruptTable("compiled rules lack a built-in input")
        self.backends: tuple[str, ...] = tuple(data["backends"])
        self._backend_set = frozenset(self.backends)
        #: backends that select something somewhere in the space (the others only reject)
        self.selectable_backends: tuple[str, ...] = tuple(data["selectable"])
        self._rule_rows = data["rules"]
        for rid, file, line, pack, table in self._rule_rows:
            if not (type(rid) is str and type(file) is str and type(line) is int and type(table) is str):
                raise CorruptTable("a compiled rule row is malformed")
        self._rules: dict[int, RuleRef] = {}
        for row in data["outcomes"]:
            self._check_row(row)
        #: every distinct outcome of the space, typed (:mod:`dsv4sel.artifact`); :meth:`index` points into it
        self.rows: tuple[Row, ...] = tuple(loaded(row) for row in data["outcomes"])
        self.key_inputs: tuple[str, ...] = (
            "model", "platform", "capability", "backend", "kv_cache_dtype", *self.extra_inputs)
        self._table = OutcomeTable(data["table"], self.key_inputs)
        if tuple(self._table.layout.backends) != (None, *self.backends) or not all_below(
                self._table.ids, len(self.rows)):
            raise CorruptTable("the compiled decision array does not fit its outcomes")
        self.sources: tuple[str, ...] = tuple(data["sources"])
        descriptions = data.get("descriptions") or ()
        if not all(d is None or type(d) is str for d in descriptions):
            raise CorruptTable("a compiled rule description is malformed")
        self._data_descriptions: tuple[str | None, ...] = tuple(descriptions)

    def _check_row(self, row: tuple) -> None:
        """One outcome row has the shape ``dsv4sel.lower.to_table`` writes."""
        n_rules = len(self._rule_rows)
        kind = row[0]
        if kind == "select":
            (_, backend, impl, layout, cache_dtype, torch_dtype, bpt, block, rewrites, messages, path, hosts) = row
            ok = (all(type(x) is str for x in (backend, impl, layout, cache_dtype, torch_dtype))
                  and type(bpt) is int and type(block) is int
                  and all(type(k) is str for k, _ in rewrites)
                  and all(type(level) is str and type(text) is str for level, text in messages)
                  and all(type(x) is str for host in hosts for x in host))
        elif kind == "reject":
            _, backend, reason, path, messages = row
            ok = type(reason) is str and (backend is None or type(backend) is str)
        elif kind == "gap":
            _, backend, table, path = row
            ok = type(table) is str
        else:
            ok, path = False, ()
        if not ok or not all(type(i) is int and 0 <= i < n_rules for i in path) or (kind != "gap" and not path):
            raise CorruptTable(f"a compiled {kind!r} outcome row is malformed")

    # ------------------------------------------------------------ vocabulary
    def values(self, name: str, platform: str | None = None) -> tuple[str, ...]:
        """Declared values of input ``name`` (of one platform, for scoped inputs)."""
        if name == "backend":
            return self.backends
        values, by, scoped, _, _ = self._inputs[name]
        if scoped is not None and platform is not None:
            return tuple(scoped.get(platform, ()))
        return values

    def declared_at(self, name: str, value: str, point: Mapping[str, str]) -> bool:
        """Whether ``value`` of input ``name`` is declared where ``point`` is: for
        an input scoped by another (``by:``), among the values listed for the
        parent's value in ``point``; otherwise among all its values."""
        values, by, scoped, _, _ = self._inputs[name]
        if scoped is None:
            return value in values
        return value in scoped.get(point.get(by), ())

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

    def description(self, index: int) -> str | None:
        """The `description:` of rule ``index`` (None when it has none)."""
        descriptions = self._data_descriptions
        return descriptions[index] if index < len(descriptions) else None

    def rule_table(self, index: int) -> str:
        return self._rule_rows[index][4]

    @property
    def size(self) -> int:
        """Number of points in the decision space (backend included)."""
        return len(self._table)

    def keys(self):
        return self._table.keys()

    # --------------------------------------------------------- normalization
    def _invalid(self, what: str, value: Any, valid, hint: str = "", flag_of: str | None = None) -> InvalidQuery:
        """``flag_of``: the input whose flag the suggestions spell (else the bare value)."""
        from .alternatives import flag  # the error path only: the cold start loads neither
        from .suggest import close_matches

        near = close_matches(value, valid) if isinstance(value, str) else []
        text = f"unknown {what} {value!r}"
        text += f"; did you mean {near[0]!r}?" if near else "."
        text += f" Valid {what} values: {', '.join(valid)}" + hint
        return InvalidQuery(text, suggestions=tuple(flag(flag_of, n) if flag_of else n for n in near))

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
                        + (f"; {len(others)} other vLLM backends are known but not DeepSeek-V4 ones "
                           "(`dsv4sel table` lists what each backend serves)" if others else ""))
                from .alternatives import flag
                from .suggest import close_matches

                near = close_matches(name, self.backends)
                text = f"unknown attention backend {name!r}"
                text += f"; did you mean {near[0]!r}?" if near else "."
                raise InvalidQuery(text + " DeepSeek-V4 backends: " + ", ".join(self.selectable_backends)
                                   + hint, suggestions=tuple(flag("backend", n) for n in near))
        kv = kv_cache_dtype.strip().lower() if isinstance(kv_cache_dtype, str) else kv_cache_dtype
        kvs = self.values("kv_cache_dtype")
        if kv not in kvs:
            raise self._invalid("kv-cache dtype", kv_cache_dtype, kvs, flag_of="kv_cache_dtype")
        extras = []
        given = dict(extra or {})
        for key in given:
            if key not in self.extra_inputs:
                raise InvalidQuery(f"unknown input {key!r}; the rules declare: "
                                   + ", ".join(BUILTIN + self.extra_inputs))
        point = {"model": model, "platform": plat, "capability": cap, "kv_cache_dtype": kv}
        for name_ in self.extra_inputs:
            value = given.get(name_, self.default_of(name_))
            _values, by, scoped, _default, _fallback = self._inputs[name_]
            # an input scoped by another (prefill_context_parallel by model) has the values of its parent's value
            valid = self.values(name_) if scoped is None else tuple(scoped.get(point.get(by), ()))
            if value not in valid and scoped is not None and value in _values:
                raise InvalidQuery(f"{name_} {value!r} is not declared for {by} {point.get(by)!r}; "
                                   f"there it is one of: {', '.join(valid)}")
            if value not in valid:
                raise self._invalid(name_, value, valid)
            extras.append((name_, value))
            point[name_] = value
        return Query(model, plat, cap, name, kv, tuple(extras)), tuple(notes)

    def _capability(self, platform: str, capability: Any, notes: list[Message]) -> str:
        """The declared capability value that ``capability`` spells (see
        :mod:`dsv4sel.capability`), for ``platform``. None means unknown; any
        other value that is not a known spelling of a declared capability is
        an :class:`InvalidQuery` naming the nearest valid ones."""
        values, _, _, default, fallback = self._inputs["capability"]
        valid = self.values("capability", platform)
        if capability is None:
            return default if default in valid else valid[-1]
        if capability.__class__ is str and capability in valid:
            return capability  # already canonical: spares the cold start the spelling parser
        from .capability import SPELLINGS, canonical, match_alias, name_tokens
        from .suggest import close_matches
        from .text import escape

        text = canonical(capability)
        if text is None and isinstance(capability, str):
            aliases = {name_tokens(a): v for a, v in self._alias_spellings.get("capability", ())}
            text = match_alias(capability, aliases)
        if text in valid:
            return text
        shown = ", ".join(valid)
        if text is not None:  # a valid spelling of a capability this platform does not declare
            if fallback is not None and fallback in valid:
                notes.append(Message(f"capability {text!r} is not declared for {platform} in the rule "
                                     f"vocabulary; deciding as {fallback!r}", "warning"))
                return fallback
            return self._refuse_capability(
                f"{platform} capability {text!r}"
                + (f" (given as {capability!r})" if capability != text else "")
                + " is not declared in the rule "
                f"vocabulary. Declared {platform} capabilities: {shown}. Pass capability 'unknown' to "
                f"decide without it, or declare it in a rule pack", [v for v in valid if v == "unknown"])
        names = [a for a, v in self._alias_names("capability") if v in valid]
        by_lower = {c.lower(): c for c in (*valid, *names)}
        near = [by_lower[n] for n in close_matches(str(capability).strip().lower(), by_lower, n=3)]
        if isinstance(capability, str) and "," in capability and canonical(f"({capability})") in valid:
            near.insert(0, canonical(f"({capability})"))  # "9,0": the parentheses or the dot were meant
        hint = f"; did you mean {' or '.join(repr(n) for n in dict.fromkeys(near))}?" if near else "."
        return self._refuse_capability(
            f"{escape(repr(capability))} is not a {platform} capability{hint} Write it as {SPELLINGS}. "
            f"Declared {platform} capabilities: {shown}", list(dict.fromkeys(near)))

    def _alias_names(self, name: str) -> list[tuple[str, str]]:
        return list(self._alias_spellings.get(name, ()))

    @staticmethod
    def _refuse_capability(message: str, near: list[str]):
        from .alternatives import flag

        raise InvalidQuery(message, suggestions=tuple(flag("capability", n) for n in near))

    # ------------------------------------------------------------ evaluation
    def key(self, query: Query) -> tuple:
        return (query.model, query.platform, query.capability, query.backend,
                query.kv_cache_dtype, *(v for _, v in query.extra))

    def outcome(self, query: Query, notes: tuple[Message, ...] = ()) -> Selection | Rejection:
        """The decision for a normalized query (a Selection, or a Rejection to raise)."""
        index = self._table.get(self.key(query))
        if index is None:  # pragma: no cover - normalize() admits only declared points
            return Rejection(self, query, "the query is outside the decision space", None, ())
        row = self.rows[index]
        refs = tuple(self.rule(i) for i in row.path)
        messages = notes + tuple(Message(text, level) for level, text in row.messages)
        if row.kind == "select":
            return Selection(
                backend=row.backend, impl=row.impl, layout=row.layout, cache_dtype=row.cache_dtype,
                torch_dtype_name=row.torch_dtype, bytes_per_token=row.bytes_per_token,
                block_size=row.block_size, rewrites=MappingProxyType(dict(row.rewrites)),
                messages=messages, rule=refs[-1], path=refs, query=query,
                allowed_impl_modules=self.allowed_impl_modules, hosts=row.hosts)
        if row.kind == "reject":
            return Rejection(self, query, row.reason, refs[-1], refs, messages, backend=row.backend)
        where = "the default-backend decision" if row.table == "<default>" else f"the table of {row.table}"
        return Rejection(self, query, f"no rule in {where} decides this input (a gap in the rules; "
                         "`dsv4sel check` lists all gaps)", refs[-1] if refs else None, refs, messages,
                         gap=True, backend=row.backend)

    # ------------------------------------------------------- the read API
    def index(self, key: tuple) -> int | None:
        """The index into :attr:`rows` of the outcome at ``key`` (a tuple in
        :attr:`key_inputs` order, backend None for the platform default), or
        None outside the space. Tools that ask many points compare indices."""
        return self._table.get(key)

    def row(self, key: tuple) -> Row | None:
        """The compiled outcome at ``key`` (see :meth:`index`)."""
        index = self._table.get(key)
        return None if index is None else self.rows[index]

    def items(self):
        """Every ``(key, index)`` of the space (backend outermost)."""
        return self._table.items()

    def select(self, platform, kv_cache_dtype="auto", backend=None, capability=None,
               model="deepseek_v4", extra=None) -> Selection:
        """Like :func:`dsv4sel.select` on this rule set."""
        memo_key = _memo_key(platform, kv_cache_dtype, backend, capability, model, extra)
        hit = self.memo.get(memo_key) if memo_key is not None else None
        if hit is None:
            query, notes = self.normalize(platform=platform, kv_cache_dtype=kv_cache_dtype, backend=backend,
                                          capability=capability, model=model, extra=extra)
            hit = self.outcome(query, notes)
            if memo_key is not None:
                if len(self.memo) >= _MEMO_LIMIT:
                    self.memo.clear()
                self.memo[memo_key] = hit
        if hit.__class__ is Selection:
            return hit
        raise hit.error()

    # ----------------------------------------------------------- alternatives
    def alternatives(self, query: Query, limit: int = 4) -> tuple:
        """The nearest changes of (backend, kv dtype) that select, as
        :class:`dsv4sel.alternatives.Alternative` values, smallest change
        first (the order and why: :mod:`dsv4sel.alternatives`)."""
        from .alternatives import nearest  # only rejections pay for it

        return nearest(self, query, limit)

    def suggestions(self, query: Query) -> tuple[str, ...]:
        """Engine flags for :meth:`alternatives`, e.g. ``--kv-cache-dtype fp8``."""
        return tuple(alt.suggestion for alt in self.alternatives(query))
