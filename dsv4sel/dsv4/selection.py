"""DeepSeek-V4's result values: what a query asked (:class:`Query`) and what
was selected (:class:`Selection`), with the rule that decided."""

from __future__ import annotations

from types import MappingProxyType

from ..engine.values import Message, RuleRef, load_impl_class, rewrite_problem
from ..errors import ImplLoadError, SelectionError
from ..record import Frozen
from .profile import DEFAULT_ALLOWED_IMPL_MODULES, PROFILE, SelectFields

TYPE_CHECKING = False
if TYPE_CHECKING:  # importing typing costs ~5 ms; with postponed annotations it is not needed
    from typing import Any, Mapping

    from ..engine.artifact import SelectRow
    from .contract import KVContract


#: The inputs a :class:`Query` names, each normalized in its own way by
#: :meth:`~dsv4sel.dsv4.rules.RuleSet.normalize` (spellings, enum backends, case).
NAMED_INPUTS = PROFILE.normalized


class Query(Frozen):
    """A normalized query: every input as a declared vocabulary value.

    ``backend`` is None when no backend was requested (the platform default).
    ``extra`` holds every other input, as ``(name, value)`` pairs in the rules'
    key order: a built-in input of the profile's key that no code names, then
    the inputs rule packs declare (:attr:`~dsv4sel.dsv4.rules.RuleSet.plain_inputs`).
    So adding a built-in input to :data:`~dsv4sel.dsv4.profile.PROFILE` changes
    nothing here.
    """

    __slots__ = (*NAMED_INPUTS, "extra")
    _defaults = {"extra": ()}
    model: str
    platform: str
    capability: str
    backend: str | None
    kv_cache_dtype: str
    extra: tuple[tuple[str, str], ...]

    def point(self) -> dict[str, Any]:
        """Every input by name: the named ones, then :attr:`extra`."""
        out = {name: getattr(self, name) for name in NAMED_INPUTS}
        out.update(self.extra)
        return out

    def as_dict(self) -> dict[str, Any]:
        return self.point()

    def __str__(self) -> str:
        parts = [f"{k}={'<none>' if v is None else v}" for k, v in self.as_dict().items()]
        return " ".join(parts)


def _differs(old: Any, new: Any) -> bool:
    """``old != new``, counting a comparison that raises (or gives no bool) as a change."""
    try:
        return bool(old != new)
    except Exception:  # noqa: BLE001 - a config value's __ne__ may raise anything; then it changed
        return True


class Selection(SelectFields, Frozen):
    """The decision for one query: a view of its compiled select row.

    The profile's select fields (:class:`~dsv4sel.dsv4.profile.SelectFields`:
    the impl class as ``"module:Class"``, the KV-cache layout id, the cache
    dtype string the engine should carry from now on, ... bytes per token,
    block size) and ``backend``, ``hosts`` and ``host_settings`` are read from
    ``row``, the compiled outcome (:mod:`dsv4sel.engine.artifact`); the torch
    dtype's name is :attr:`torch_dtype_name`, and :attr:`torch_dtype` imports
    torch lazily. ``rewrites`` are the cache-config rewrites as data, ``messages``
    the rule messages (normalization's first). ``rule`` is the rule that decided;
    ``path`` lists every rule consulted, the default-backend rule first when one
    was used. ``hosts`` holds ``(host, "module:Class", versions)`` for each
    serving engine whose own class the rule names (see :mod:`dsv4sel.engine.hosts`);
    ``host_settings`` ``(host, versions, ((name, value), ...))`` for each host entry that must
    also be told settings to build it (:meth:`settings_for`).
    """

    __slots__ = ("row", "query", "rule", "path", "messages", "allowed_impl_modules", "rewrites")
    _defaults = {"allowed_impl_modules": DEFAULT_ALLOWED_IMPL_MODULES, "rewrites": None}
    row: SelectRow
    query: Query
    rule: RuleRef
    path: tuple[RuleRef, ...]
    messages: tuple[Message, ...]
    allowed_impl_modules: tuple[str, ...]
    #: the row's rewrites as a read-only mapping (made from ``row``, never given)
    rewrites: Mapping[str, Any]

    def __post_init__(self):
        object.__setattr__(self, "rewrites", MappingProxyType(dict(self.row.rewrites)))

    @property
    def backend(self) -> str:
        return self.row.backend

    @property
    def hosts(self) -> tuple[tuple[str, str, str], ...]:
        return self.row.hosts

    @property
    def host_settings(self) -> tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...]:
        return self.row.host_settings

    @property
    def torch_dtype_name(self) -> str:
        return self.row.torch_dtype

    def fields(self) -> dict[str, Any]:
        """``backend`` and the profile's select fields by name, as the compiled row holds them."""
        row = self.row
        return {"backend": row.backend, **{name: getattr(row, name) for name in PROFILE.field_names}}

    def __hash__(self) -> int:
        return hash((self.row, self.rule, self.query))

    def replace(self, **changes: Any) -> Selection:
        """A copy with ``changes``; a field the row holds (``impl=``, ``rewrites=``...) changes the row.

        A select field keeps its type, and ``rewrites`` may name only fields rule files
        could rewrite (:func:`~dsv4sel.engine.values.rewrite_problem`: never ``__dict__``);
        anything else is a :class:`SelectionError`, so that :meth:`apply` never sets it."""
        row = self.row
        if "torch_dtype_name" in changes:
            changes["torch_dtype"] = changes.pop("torch_dtype_name")
        types = dict(PROFILE.select_fields)
        if "rewrites" in changes:
            changes["rewrites"] = tuple(dict(changes["rewrites"]).items())
            for name, value in changes["rewrites"]:
                problem = rewrite_problem(name, value, types)
                if problem is not None:
                    raise SelectionError(f"cannot rewrite {name!r}: {problem}")
        for name, kind in types.items():
            if name in changes and type(changes[name]) is not kind:
                raise SelectionError(f"{name} holds a {kind.__name__}, not {changes[name]!r}")
        in_row = {name: changes.pop(name) for name in list(changes) if name in row._fields}
        return super().replace(row=row._replace(**in_row), **changes)

    @property  # type: ignore[override]  # the public API: torch's dtype here, the name is torch_dtype_name
    def torch_dtype(self):
        """The cache tensor's ``torch.dtype``; imports torch on first use."""
        import torch

        return getattr(torch, self.torch_dtype_name)

    @property
    def is_default(self) -> bool:
        """True when the backend came from the default-backend decision."""
        return self.query.backend is None

    def host_class(self, host: str, version: str | None = None) -> tuple[str, str] | None:
        """``(class, versions)`` the rules name for ``host`` (a serving engine's
        distribution name) at release ``version``, or None when they name none for it.
        Without ``version``: the entry of the newest release range the rules name. Never
        imported here: the host's integration checks the version and imports it."""
        entries = [(cls, versions) for name, cls, versions in self.hosts if name == host]
        if version is not None:
            from ..engine.hosts import version_matches

            return next((e for e in entries if version_matches(version, e[1])), None)
        return _newest(entries)

    def host_releases(self, host: str) -> tuple[str, ...]:
        """The release ranges (version specs) the rules name a class for ``host`` in."""
        return tuple(versions for name, _, versions in self.hosts if name == host)

    def settings_for(self, host: str, version: str | None = None) -> dict[str, str | int]:
        """The settings the rules give ``host`` for this selection at release ``version``
        (``{}`` when none); without ``version``, those of the entry :meth:`host_class` picks."""
        named = self.host_class(host, version)
        if named is None:
            return {}
        for name, versions, pairs in self.host_settings:
            if name == host and versions == named[1]:
                return dict(pairs)
        return {}

    def load_impl(self) -> type:
        """Import and return the impl class. Only modules on the rule set's
        allow-list are imported; anything else raises :class:`ImplLoadError`.

        ``select()`` never imports it (the answer stays cheap, and a process that only
        asks which backend gets no kernel library); a module that is not there, or
        fails to import, shows here: one error naming the impl, why, the rule that
        chose it (``file:line``) and the fix. ``dsv4sel explain`` warns about it and
        ``dsv4sel check`` reports it (DSV406)."""
        try:
            return load_impl_class(self.impl, self.allowed_impl_modules, PROFILE.impl_base)
        except ImplLoadError as exc:
            where = f"rule {self.rule.id} ({self.rule.location})" if self.rule is not None else "its rule"
            raise ImplLoadError(f"{self.backend}: {exc}; it was selected by {where}: correct that rule's "
                                "`impl:` (or its `defaults: impl`), or install the module it names; "
                                "`dsv4sel check` reports this as DSV406") from None

    def apply(self, cache_config: Any) -> dict[str, Any]:
        """Apply :attr:`rewrites` to ``cache_config`` (duck-typed) all or nothing.

        Returns the previous values of the attributes that changed. Nothing is
        changed, and :class:`SelectionError` raised, when the config is not the one
        this selection was decided for (its ``cache_dtype`` is neither the query's
        ``kv_cache_dtype`` nor the value this selection already gives it: select again
        with the config's own value) or a rewrite names no settable field of it (a
        method, a read-only property, a name rule files cannot write); an attribute the
        config lacks is an ``AttributeError``. If setting one fails, every attribute
        already set is put back, including one whose setter stored the value and then
        raised.
        """
        if cache_config is None:
            return {}
        self._check_decided_for(cache_config)
        if not self.rewrites:
            return {}
        self._check_settable(cache_config)
        previous = {name: getattr(cache_config, name) for name in self.rewrites}
        touched: list[str] = []
        try:
            for name, value in self.rewrites.items():
                # counted before the call: a setter may store the value and then raise
                touched.append(name)
                setattr(cache_config, name, value)
        except BaseException:
            for name in reversed(touched):
                try:  # put back unconditionally: comparing the values could raise too
                    setattr(cache_config, name, previous[name])
                except Exception:  # noqa: BLE001 - restore what can be restored, then re-raise the cause
                    pass
            raise
        return {k: v for k, v in previous.items() if _differs(v, self.rewrites[k])}

    def _check_settable(self, cache_config: Any) -> None:
        """Raise (AttributeError for a missing attribute, else SelectionError) unless every
        rewrite names a field rule files could write and ``cache_config`` can set."""
        missing = [name for name in self.rewrites if not hasattr(cache_config, name)]
        if missing:
            raise AttributeError(
                f"cannot apply rewrites: {type(cache_config).__name__} has no attribute "
                + ", ".join(repr(m) for m in missing)
            )
        for name, value in self.rewrites.items():
            problem = rewrite_problem(name, value, dict(PROFILE.select_fields)) or _unsettable(cache_config, name)
            if problem is not None:
                raise self._refusal(cache_config, f"cannot rewrite {name!r}: {problem}")

    def _check_decided_for(self, cache_config: Any) -> None:
        """Raise SelectionError when a field of ``cache_config`` that restates an input
        (``cache_dtype`` the ``kv_cache_dtype``) holds neither the value this selection was
        decided for nor the one it gives that field: applying its rewrites there would
        silently replace a value nobody decided on (``fp8_e5m2`` rewritten to ``fp8_ds_mla``
        by a selection made for ``auto``)."""
        point = self.query.point()
        for field, name in PROFILE.restates:
            if name not in point or not hasattr(cache_config, field):
                continue
            current = getattr(cache_config, field)
            decided = point[name]
            if _spells(current, decided) or _spells(current, getattr(self, field)):
                continue
            if not isinstance(current, str):
                raise self._refusal(cache_config, f"its {field} is {_a(type(current).__name__)}, not {_a(name)} "
                                    "string")
            raise self._refusal(cache_config, (
                f"its {field} is {_shown(current)}, but this selection was decided for {name} {decided!r}; "
                f"select again with {name}={_shown(current)}"))

    def _refusal(self, cache_config: Any, problem: str) -> SelectionError:
        return SelectionError(
            f"{self.backend}: cannot apply the selection of rule {self.rule.id} ({self.rule.location}) to "
            f"{type(cache_config).__name__}: {problem}; nothing was changed",
            rule=self.rule, query=self.query, path=self.path)

    @property
    def contract(self) -> KVContract:
        """The KV wire contract of this decision (:mod:`dsv4sel.dsv4.contract`): its cache pools,
        records, encodings, fp8 flavour and block size, with a stable fingerprint. Made on access
        (the serving path never builds it); :meth:`contract_for` gives it as one engine builds it."""
        return self.contract_for(None)

    def contract_for(self, engine: str | None, release: str | None = None,
                     settings: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> KVContract:
        """The contract as ``engine`` (``vllm``, ``sglang``; None: the decision's own) at ``release``
        builds this decision; SGLang's pools follow the settings it is told (default:
        :meth:`settings_for`) and its environment ``env``."""
        from .contract import contract_of

        if engine is not None and settings is None:
            # what that engine's release is told or builds (SGLang's page and layout, vLLM 0.34's
            # 64-token FlashInfer-V4.1 blocks on SM12x)
            settings = self.settings_for(engine, release) if release is None or _is_version(release) else {}
        q, row = self.query, self.row
        return contract_of(model=q.model, platform=q.platform, capability=q.capability, layout=row.layout,
                           cache_dtype=row.cache_dtype, block_size=row.block_size, engine=engine,
                           release=release, settings=settings, env=env)

    def __reduce__(self):
        # the row's type is built at run time (not importable by name) and rewrites is a
        # read-only mappingproxy: neither pickles, so the row goes as a plain tuple
        return (_rebuild_selection, (tuple(self.row), self.query, self.rule, self.path, self.messages,
                                     self.allowed_impl_modules))

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): the selection's fields, ``rule`` and ``path`` as
        ``{id, file, line, location, pack}``, ``query`` as :meth:`Query.as_dict`, ``contract``
        as :meth:`KVContract.as_dict <dsv4sel.dsv4.contract.KVContract.as_dict>`."""
        def ref(r: RuleRef) -> dict[str, Any]:
            return {"id": r.id, "file": r.file, "line": r.line, "location": r.location, "pack": r.pack}

        return {
            **self.fields(),
            "rewrites": dict(self.rewrites), "messages": [{"level": m.level, "text": str(m)} for m in self.messages],
            "rule": ref(self.rule), "path": [ref(r) for r in self.path], "query": self.query.as_dict(),
            "is_default": self.is_default, "contract": self.contract.as_dict(),
        }

    def record(self) -> str:
        """One line for a decision log: inputs, outcome and the deciding rule."""
        return (f"dsv4sel: {self.query} -> backend={self.backend} layout={self.layout} "
                f"cache_dtype={self.cache_dtype} rule={self.rule.id}@{self.rule.location}")


def _spells(current: Any, value: Any) -> bool:
    """Whether a config's ``current`` value is ``value`` as a query reads it (case and
    surrounding blanks aside, as :meth:`~dsv4sel.dsv4.rules.RuleSet.normalize` reads it)."""
    if not isinstance(current, str) or not isinstance(value, str):
        return False
    return str.lower(str.strip(current)) == value  # str's own methods: a subclass may override them


def _shown(text: str) -> str:
    """A config's string value in a message, quoted (and cut, when long)."""
    text = str.__str__(text)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _a(noun: str) -> str:
    return ("an " if noun[:1] in "aeiou" else "a ") + noun


def _unsettable(config: Any, name: str) -> str | None:
    """Why attribute ``name`` of ``config`` is no field a rewrite may set, or None: a method
    (rewriting it would replace behaviour), or a property without a setter."""
    for klass in type(config).__mro__:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if isinstance(attr, property) and attr.fset is None:
                return f"{type(config).__name__}.{name} is a read-only property"
            break
    if callable(getattr(config, name, None)):
        return f"{type(config).__name__}.{name} is a method, not a field"
    return None


def _rebuild_selection(row: tuple, *rest: Any) -> Selection:
    from ..engine.artifact import select_row_type

    return Selection(select_row_type(PROFILE.field_names)(row), *rest)


def _read_from_row(name: str) -> property:
    return property(lambda self: getattr(self.row, name), doc=f"``{name}``, read from the compiled row.")


# the profile's select fields, read from the row (``torch_dtype``: the class keeps its own)
for _name in PROFILE.field_names:
    if _name not in Selection.__dict__:
        setattr(Selection, _name, _read_from_row(_name))


def _newest(entries: list[tuple[str, str]]) -> tuple[str, str] | None:
    """The entry whose release range reaches highest (a spec without an upper bound first)."""
    if len(entries) < 2:
        return entries[0] if entries else None
    from ..engine.hosts import upper_bound

    return max(entries, key=lambda e: upper_bound(e[1]))


def _is_version(text: str) -> bool:
    from ..engine.hosts import release_of

    try:
        release_of(text)
    except ValueError:
        return False
    return True
