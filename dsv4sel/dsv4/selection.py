"""DeepSeek-V4's result values: what a query asked (:class:`Query`) and what
was selected (:class:`Selection`), with the rule that decided."""

from __future__ import annotations

from types import MappingProxyType

from ..engine.values import Message, RuleRef, load_impl_class
from ..errors import ImplLoadError
from ..record import Frozen
from .profile import DEFAULT_ALLOWED_IMPL_MODULES, PROFILE

TYPE_CHECKING = False
if TYPE_CHECKING:  # importing typing costs ~5 ms; with postponed annotations it is not needed
    from typing import Any, Mapping


class Query(Frozen):
    """A normalized query: every input as a declared vocabulary value.

    ``backend`` is None when no backend was requested (the platform default).
    ``extra`` holds inputs declared by rule packs beyond the five built in,
    as sorted ``(name, value)`` pairs.
    """

    # the fields are the profile's key: the one place that says the inputs and their order
    __slots__ = (*PROFILE.key, "extra")
    _defaults = {"extra": ()}
    model: str
    platform: str
    capability: str
    backend: str | None
    kv_cache_dtype: str
    extra: tuple[tuple[str, str], ...]

    def point(self) -> dict[str, Any]:
        """Every input by name: the profile's key in its order, then the pack-declared inputs."""
        out = {name: getattr(self, name) for name in PROFILE.key}
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


class Selection(Frozen):
    """The decision for one query.

    Attributes mirror what a serving engine needs at start-up: the backend
    name, the impl class as ``"module:Class"``, the KV-cache layout id, the
    cache dtype string the engine should carry from now on, the torch dtype
    of the cache tensor (by name; :attr:`torch_dtype` imports torch lazily),
    bytes per token, block size, the cache-config ``rewrites`` as data, and
    rule ``messages``. ``rule`` is the rule that decided; ``path`` lists every
    rule consulted, the default-backend rule first when one was used.
    ``hosts`` holds ``(host, "module:Class", versions)`` for each serving
    engine whose own class the rule names (see :mod:`dsv4sel.engine.hosts`);
    ``host_settings`` ``(host, ((name, value), ...))`` for each host that must
    also be told settings to build it (:meth:`settings_for`).
    """

    __slots__ = ("backend", "impl", "layout", "cache_dtype", "torch_dtype_name", "bytes_per_token",
                 "block_size", "rewrites", "messages", "rule", "path", "query", "allowed_impl_modules",
                 "hosts", "host_settings")
    _defaults = {"allowed_impl_modules": DEFAULT_ALLOWED_IMPL_MODULES, "hosts": (), "host_settings": ()}
    backend: str
    impl: str
    layout: str
    cache_dtype: str
    torch_dtype_name: str
    bytes_per_token: int
    block_size: int
    rewrites: Mapping[str, Any]
    messages: tuple[Message, ...]
    rule: RuleRef
    path: tuple[RuleRef, ...]
    query: Query
    allowed_impl_modules: tuple[str, ...]
    hosts: tuple[tuple[str, str, str], ...]
    host_settings: tuple[tuple[str, tuple[tuple[str, str | int], ...]], ...]

    def __post_init__(self):
        if not isinstance(self.rewrites, MappingProxyType):
            object.__setattr__(self, "rewrites", MappingProxyType(dict(self.rewrites)))

    def __hash__(self) -> int:
        return hash((self.backend, self.impl, self.layout, self.cache_dtype,
                     tuple(sorted(self.rewrites.items())), self.rule, self.query))

    @property
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

    def __reduce__(self):
        # rewrites is a read-only mappingproxy, which does not pickle; __post_init__ wraps the dict again
        values = self._astuple()
        i = self._fields.index("rewrites")
        return (_rebuild_selection, (values[:i] + (dict(self.rewrites),) + values[i + 1:],))

    def as_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): the selection's fields, ``rule`` and ``path`` as
        ``{id, file, line, location, pack}``, ``query`` as :meth:`Query.as_dict`."""
        def ref(r: RuleRef) -> dict[str, Any]:
            return {"id": r.id, "file": r.file, "line": r.line, "location": r.location, "pack": r.pack}

        return {
            "backend": self.backend, "impl": self.impl, "layout": self.layout,
            "cache_dtype": self.cache_dtype, "torch_dtype": self.torch_dtype_name,
            "bytes_per_token": self.bytes_per_token, "block_size": self.block_size,
            "rewrites": dict(self.rewrites), "messages": [{"level": m.level, "text": str(m)} for m in self.messages],
            "rule": ref(self.rule), "path": [ref(r) for r in self.path], "query": self.query.as_dict(),
            "is_default": self.is_default,
        }

    def record(self) -> str:
        """One line for a decision log: inputs, outcome and the deciding rule."""
        return (f"dsv4sel: {self.query} -> backend={self.backend} layout={self.layout} "
                f"cache_dtype={self.cache_dtype} rule={self.rule.id}@{self.rule.location}")


def _rebuild_selection(values: tuple) -> Selection:
    return Selection(*values)
