"""Stage 5, evaluate: the compiled, immutable rules and their read API.

:class:`CompiledRules` is built from the plain data of
``dsv4sel.engine.lower.to_table``: every point of the decision space maps to
an outcome index in a dense array (:class:`~dsv4sel.engine.artifact.OutcomeTable`),
so a decision costs one indexed lookup. It checks that data (it may come from
an untrusted cache), holds the memo a domain's ``select`` probes first, and
answers read-only questions (:meth:`CompiledRules.index`, :meth:`~CompiledRules.row`,
:meth:`~CompiledRules.items`...) that every tool uses. What a query means,
how it is normalized and what a selection looks like is the domain's (for
DeepSeek-V4, :class:`dsv4sel.dsv4.rules.RuleSet`). This module imports
neither yaml, jsonschema nor torch.
"""

from __future__ import annotations

from .artifact import OutcomeTable, Row, all_below, loaded, select_row_type
from .profile import Profile
from .values import RuleRef, check_impl_allowed, rewrite_problem

#: Version of the data ``dsv4sel.engine.lower.to_table`` writes and :class:`CompiledRules` reads.
COMPILED_FORMAT = 5  # 4: the key order and select fields are stored; 5: host settings per host entry (host, versions, pairs)

TYPE_CHECKING = False
if TYPE_CHECKING:  # importing typing costs ~5 ms; with postponed annotations it is not needed
    from typing import Any, Mapping


#: The most distinct outcomes a compiled form holds (its array stores 2-byte indices).
MAX_ROWS = 1 << 16


def _host_ok(host) -> bool:
    """A compiled ``(host, "module:Class", versions)`` of the right shape; where its class may
    lie is :func:`_host_inside`'s question."""
    if len(host) != 3 or not all(type(x) is str for x in host):
        return False
    name, cls, versions = host
    module, sep, attr = cls.partition(":")
    return (bool(_package(name)) and bool(sep) and attr.isidentifier()
            and all(p.isidentifier() for p in module.split("."))
            and all(c in "0123456789.,<>=!* " for c in versions))


def _package(host: str) -> str:
    """The host's own package (``-`` and ``.`` read as ``_``, as :func:`dsv4sel.engine.hosts.package_of` says)."""
    package = "".join("_" if c in "-." else c for c in host.lower())
    while "__" in package:
        package = package.replace("__", "_")
    return package


def _host_inside(host: tuple, shipped: tuple, allowed: tuple[str, ...]) -> bool:
    """A compiled host class lies inside the host's own package, is one the profile ships for the
    host, or lies in a module of the process's allow-list (a pack's own layer): a cache entry
    cannot point a host at any other package's code."""
    name, cls, _ = host
    module = cls.partition(":")[0]
    package = _package(name)
    return (module == package or module.startswith(package + ".") or cls in dict(shipped).get(name, ())
            or any(module == p or module.startswith(p + ".") for p in allowed))


def _rewrites_ok(rewrites: tuple, types: dict[str, type]) -> bool:
    """Every rewrite is one rule files could write (:func:`~dsv4sel.engine.values.rewrite_problem`)."""
    return all(len(pair) == 2 and rewrite_problem(pair[0], pair[1], types) is None for pair in rewrites)


def _hosts_ok(hosts: tuple, settings: tuple) -> bool:
    return (all(_host_ok(host) for host in hosts)
            and all(len(entry) == 3 and type(entry[0]) is str and type(entry[1]) is str
                    and all(type(k) is str and type(v) in (str, int) for k, v in entry[2])
                    for entry in settings))


#: where each kind of stored outcome row holds its rule path (a select row's fields come first)
_PATH_AT = {"select": -3, "reject": 3, "gap": 3}


def _reject_row_ok(row: tuple) -> bool:
    _, backend, reason, _path, _messages = row
    return type(reason) is str and (backend is None or type(backend) is str)


def _gap_row_ok(row: tuple) -> bool:
    _, _backend, table, _path = row
    return type(table) is str


class CorruptTable(ValueError):
    """Compiled data that is not what ``dsv4sel.engine.lower.to_table`` writes (a
    damaged or hand-edited cache entry); :func:`dsv4sel.load_rules` rebuilds it."""


class CompiledRules:
    """Compiled rules: the decision for every point of the declared space.

    Instances are immutable apart from :attr:`memo` and safe to share between
    threads (the memo is a plain dict of immutable values).
    """

    #: True only for an instance :meth:`from_verified` builds
    _verified = False

    def __init__(self, data: dict[str, Any], digest: str, allowed_impl_modules: tuple[str, ...] | None,
                 profile: Profile):
        """``data`` is ``to_table``'s result, possibly read back from the cache:
        it is checked here against ``profile`` (the domain it was compiled
        for), and :class:`CorruptTable` raised when it is not what the
        compiler writes. ``allowed_impl_modules`` is the process's allow-list
        (default: the one the data was compiled with); every impl the data
        names must lie inside it."""
        self.profile = profile
        try:
            self._load(data)
        except (CorruptTable, MemoryError):  # too little memory to read them is not damage
            raise
        except Exception as exc:  # noqa: BLE001 - any shape error of untrusted data
            raise CorruptTable(f"compiled rules are damaged: {type(exc).__name__}: {exc}") from None
        self.digest = digest
        if allowed_impl_modules is None:
            allowed_impl_modules = tuple(data["allowed"])
        self.allowed_impl_modules: tuple[str, ...] = tuple(allowed_impl_modules)
        impls = {row.impl for row in self.rows if row.kind == "select"} | set(self.probes.values())
        for impl in impls:
            try:
                check_impl_allowed(impl, self.allowed_impl_modules)
            except Exception as exc:  # noqa: BLE001 - untrusted data: a non-str impl raises TypeError too
                raise CorruptTable(f"compiled rules name an impl outside the allowed modules: {exc}") from None
        if not self._verified:
            self._check_host_classes()
        #: raw query -> the domain's result; a domain's select() probes it first (its hot path)
        self.memo: dict[tuple, Any] = {}

    def _check_host_classes(self) -> None:
        shipped = self.profile.host_classes
        for row in self.rows:
            if row.kind == "select" and not all(_host_inside(h, shipped, self.allowed_impl_modules)
                                                for h in row.hosts):
                raise CorruptTable("compiled rules name a host class outside its host's package and the allowed "
                                   "modules")

    @classmethod
    def from_verified(cls, *args: Any, **kwargs: Any) -> Any:
        """An instance built as ``cls(*args, **kwargs)`` builds it, without the per-row and
        per-index checks: for data whose very bytes passed them when they were written (the
        packaged artifact: the installer's, CRC-checked, fingerprinted), which would cost the
        cold start ~30M instructions to run again."""
        self = cls.__new__(cls)
        self._verified = True
        cls.__init__(self, *args, **kwargs)
        return self

    def _load(self, data: dict[str, Any]) -> None:
        if data.get("format") != COMPILED_FORMAT:
            raise CorruptTable(f"compiled format {data.get('format')!r}, expected {COMPILED_FORMAT}")
        profile = self.profile
        if tuple(data["key"]) != profile.key or tuple(data["fields"]) != profile.field_names:
            raise CorruptTable("the compiled rules were built for another profile")
        self._load_inputs(data["inputs"])
        self.backends: tuple[str, ...] = tuple(data["backends"])
        #: backends that select something somewhere in the space (the others only reject)
        self.selectable_backends: tuple[str, ...] = tuple(data["selectable"])
        self._load_rules(data["rules"])
        self._load_outcomes(data["outcomes"])
        #: the order of a lookup key: the profile's inputs, then the packs' in declaration order
        self.key_inputs: tuple[str, ...] = (*profile.key, *self.extra_inputs)
        self._table = OutcomeTable(data["table"], self.key_inputs)
        if tuple(self._table.layout.backends) != (None, *self.backends) or not (
                self._verified or all_below(self._table.ids, len(self.rows))):
            raise CorruptTable("the compiled decision array does not fit its outcomes")
        self.sources: tuple[str, ...] = tuple(data["sources"])
        descriptions = data.get("descriptions") or ()
        if not all(d is None or type(d) is str for d in descriptions):
            raise CorruptTable("a compiled rule description is malformed")
        self._data_descriptions: tuple[str | None, ...] = tuple(descriptions)

    def _load_inputs(self, inputs: list) -> None:
        self._inputs: dict[str, tuple] = {}
        self._alias_spellings: dict[str, tuple] = {}
        for name, values, by, scoped, default, fallback, _probe, aliases in inputs:
            self._inputs[name] = (tuple(values), by, dict(scoped) if scoped else None, default, fallback)
            self._alias_spellings[name] = tuple((str(a), str(v)) for a, v in aliases)
        #: input name -> impl class whose is_available() tells which value this machine has
        self.probes: dict[str, str] = {row[0]: row[6] for row in inputs if row[6]}
        builtin = self.profile.builtin_inputs
        #: the inputs rule packs declare beyond the profile's, in declaration order
        self.extra_inputs: tuple[str, ...] = tuple(n for n in self._inputs if n not in builtin)
        if any(n not in self._inputs for n in builtin):
            raise CorruptTable("compiled rules lack a built-in input")

    def _load_rules(self, rules: list) -> None:
        self._rule_rows = rules
        for rid, file, line, pack, table in self._rule_rows:
            if not (type(rid) is str and type(file) is str and type(line) is int and type(table) is str
                    and type(pack) is str):
                raise CorruptTable("a compiled rule row is malformed")
        self._rules: dict[int, RuleRef] = {}

    def _load_outcomes(self, outcomes: list) -> None:
        if len(outcomes) > MAX_ROWS:
            raise CorruptTable(f"compiled rules hold more than {MAX_ROWS:,} outcomes")
        if not self._verified:
            for row in outcomes:
                self._check_row(row)
        select_row = select_row_type(self.profile.field_names)
        #: every distinct outcome of the space, typed (:mod:`dsv4sel.engine.artifact`); :meth:`index` points into it
        self.rows: tuple[Row, ...] = tuple(loaded(row, select_row) for row in outcomes)

    def _check_row(self, row: tuple) -> None:
        """One outcome row has the shape ``to_table`` writes for this profile."""
        kind = row[0]
        shape_ok = {"select": self._select_row_ok, "reject": _reject_row_ok, "gap": _gap_row_ok}.get(kind)
        if shape_ok is None or not shape_ok(row):
            raise CorruptTable(f"a compiled {kind!r} outcome row is malformed")
        path = row[_PATH_AT[kind]]
        n_rules = len(self._rule_rows)
        if not all(type(i) is int and 0 <= i < n_rules for i in path) or (kind != "gap" and not path):
            raise CorruptTable(f"a compiled {kind!r} outcome row is malformed")

    def _select_row_ok(self, row: tuple) -> bool:
        select_fields = self.profile.select_fields
        n = len(select_fields)
        backend, fields = row[1], row[2:2 + n]
        rewrites, messages, _path, hosts, settings = row[2 + n:]
        return (type(backend) is str and len(fields) == n
                and all(type(value) is kind for value, (_, kind) in zip(fields, select_fields))
                and _rewrites_ok(rewrites, dict(select_fields))
                and all(level in ("info", "warning") and type(text) is str for level, text in messages)
                and _hosts_ok(hosts, settings))

    # ------------------------------------------------------------ vocabulary
    def values(self, name: str, parent: str | None = None) -> tuple[str, ...]:
        """Declared values of input ``name`` (of one value of its parent, for
        an input scoped by another, when ``parent`` names that value)."""
        if name == "backend":
            return self.backends
        values, by, scoped, _, _ = self._inputs[name]
        if scoped is not None and parent is not None:
            return tuple(scoped.get(parent, ()))
        return values

    def declared_at(self, name: str, value: str, point: Mapping[str, str]) -> bool:
        """Whether ``value`` of input ``name`` is declared where ``point`` is: for
        an input scoped by another (``by:``), among the values listed for the
        parent's value in ``point``; otherwise among all its values."""
        values, by, scoped, _, _ = self._inputs[name]
        if scoped is None:
            return value in values
        return value in scoped.get(point.get(by), ())

    def scope(self, name: str) -> tuple[str | None, str | None]:
        """``(parent input, fallback)`` of input ``name``: the input its values
        are scoped by (None when unscoped) and the value an undeclared
        spelling decides as (None when refused)."""
        _, by, _, _, fallback = self._inputs[name]
        return by, fallback

    def default_of(self, name: str) -> str | None:
        return self._inputs[name][3]

    def aliases(self, name: str) -> tuple[tuple[str, str], ...]:
        """``(alias, value)`` pairs: other spellings of values of input ``name`` (e.g. GPU names)."""
        return self._alias_spellings.get(name, ())

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

    def dense(self):
        """``(layout, ids)``: the compiled array and where each key lives in it (an
        :class:`~dsv4sel.engine.artifact.Layout` and the :attr:`rows` index of every slot,
        backend outermost), for tools that compare whole spaces without a lookup per key."""
        return self._table.layout, self._table.ids

    # ------------------------------------------------------- the read API
    def index(self, key: tuple) -> int | None:
        """The index into :attr:`rows` of the outcome at ``key`` (a tuple in
        :attr:`key_inputs` order, backend None for the default), or None
        outside the space. Tools that ask many points compare indices."""
        return self._table.get(key)

    def around(self, key: tuple, **vary: tuple | None) -> set[int]:
        """The indices into :attr:`rows` of the outcomes at ``key`` and at its neighbours:
        every key that differs from it only in the inputs named in ``vary``, each to one
        of the values given (None: any declared value). One call answers what would
        otherwise be a lookup per neighbour (explain's "does backend X serve this
        platform anywhere?")."""
        position = {name: i for i, name in enumerate(self.key_inputs)}
        return self._table.around(key, {position[name]: None if values is None else frozenset(values)
                                        for name, values in vary.items()})

    def tally(self, key: tuple, **vary: tuple) -> tuple[dict[int, int], dict[int, tuple], int]:
        """Over ``key`` and every key that differs from it in the inputs named in ``vary``, each
        to one of the values given: ``({index into rows: how many keys}, {index: one such key},
        how many keys lie outside the space)``. Counting many points without a lookup per point."""
        position = {name: i for i, name in enumerate(self.key_inputs)}
        return self._table.tally(key, {position[name]: tuple(values) for name, values in vary.items()})

    def row(self, key: tuple) -> Row | None:
        """The compiled outcome at ``key`` (see :meth:`index`)."""
        index = self._table.get(key)
        return None if index is None else self.rows[index]

    def items(self):
        """Every ``(key, index)`` of the space (backend outermost)."""
        return self._table.items()

    def same_result(self, a: Row, b: Row) -> bool:
        """Both rows select, and agree on the profile's ``same_result`` fields."""
        return a.kind == b.kind == "select" and all(
            getattr(a, name) == getattr(b, name) for name in self.profile.same_result)
