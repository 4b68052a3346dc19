"""DeepSeek-V4's result values: what a query asked (:class:`Query`) and what
was selected (:class:`Selection`), with the rule that decided."""

from __future__ import annotations

from types import MappingProxyType

from ..engine.values import Message, RuleRef, load_impl_class
from ..errors import ImplLoadError
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
    ``host_settings`` ``(host, ((name, value), ...))`` for each host that must
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
    def host_settings(self) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
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
        """A copy with ``changes``; a field the row holds (``impl=``, ``rewrites=``...) changes the row."""
        row = self.row
        if "torch_dtype_name" in changes:
            changes["torch_dtype"] = changes.pop("torch_dtype_name")
        if "rewrites" in changes:
            changes["rewrites"] = tuple(dict(changes["rewrites"]).items())
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

    def host_class(self, host: str) -> tuple[str, str] | None:
        """``(class, versions)`` the rules name for ``host`` (a serving engine's
        distribution name), or None when they name none. Never imported here:
        the host's integration checks the version and imports it."""
        for name, cls, versions in self.hosts:
            if name == host:
                return cls, versions
        return None

    def settings_for(self, host: str) -> dict[str, str | int]:
        """The settings the rules give ``host`` for this selection (``{}`` when none)."""
        for name, pairs in self.host_settings:
            if name == host:
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
            return load_impl_class(self.impl, self.allowed_impl_modules)
        except ImplLoadError as exc:
            where = f"rule {self.rule.id} ({self.rule.location})" if self.rule is not None else "its rule"
            raise ImplLoadError(f"{self.backend}: {exc}; it was selected by {where}: correct that rule's "
                                "`impl:` (or its `defaults: impl`), or install the module it names; "
                                "`dsv4sel check` reports this as DSV406") from None

    def apply(self, cache_config: Any) -> dict[str, Any]:
        """Apply :attr:`rewrites` to ``cache_config`` (duck-typed) all or nothing.

        Returns the previous values of the attributes that changed. If any
        attribute is missing or cannot be set, nothing stays changed: every
        attribute already set is put back, including one whose setter stored
        the value and then raised.
        """
        if cache_config is None or not self.rewrites:
            return {}
        missing = [name for name in self.rewrites if not hasattr(cache_config, name)]
        if missing:
            raise AttributeError(
                f"cannot apply rewrites: {type(cache_config).__name__} has no attribute "
                + ", ".join(repr(m) for m in missing)
            )
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

        if engine == "sglang" and settings is None:
            settings = self.settings_for("sglang")
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


def _rebuild_selection(row: tuple, *rest: Any) -> Selection:
    from ..engine.artifact import select_row_type

    return Selection(select_row_type(PROFILE.field_names)(row), *rest)


def _read_from_row(name: str) -> property:
    return property(lambda self: getattr(self.row, name), doc=f"``{name}``, read from the compiled row.")


# the profile's select fields, read from the row (``torch_dtype``: the class keeps its own)
for _name in PROFILE.field_names:
    if _name not in Selection.__dict__:
        setattr(Selection, _name, _read_from_row(_name))
