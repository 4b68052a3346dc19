"""Immutable result values: what a query asked, which rule decided, what was selected."""

from __future__ import annotations

from types import MappingProxyType
from .errors import ImplLoadError
from .record import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:  # importing typing costs ~5 ms; with postponed annotations it is not needed
    from typing import Any, Mapping


class RuleRef(Frozen):
    """Where a rule lives: its id, the file (relative to the repository for the
    shipped rules, e.g. ``rules/flashmla.yaml``), the 1-based line of the rule
    and the rule pack it came from."""

    __slots__ = ("id", "file", "line", "pack")
    _defaults = {"pack": "dsv4sel"}
    id: str
    file: str
    line: int
    pack: str

    def __str__(self) -> str:
        return f"{self.id} ({self.file}:{self.line})"

    @property
    def location(self) -> str:
        return f"{self.file}:{self.line}"


class Message(str):
    """A message from a rule: a plain ``str`` that also carries ``level``
    (``"info"`` or ``"warning"``), so ``messages`` compares equal to strings."""

    __slots__ = ("level",)

    def __new__(cls, text: str, level: str = "info") -> "Message":
        self = super().__new__(cls, text)
        self.level = level
        return self

    def __reduce__(self):
        return (Message, (str(self), self.level))


class Query(Frozen):
    """A normalized query: every input as a declared vocabulary value.

    ``backend`` is None when no backend was requested (the platform default).
    ``extra`` holds inputs declared by rule packs beyond the five built in,
    as sorted ``(name, value)`` pairs.
    """

    __slots__ = ("model", "platform", "capability", "backend", "kv_cache_dtype", "extra")
    _defaults = {"extra": ()}
    model: str
    platform: str
    capability: str
    backend: str | None
    kv_cache_dtype: str
    extra: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, Any]:
        out = {
            "model": self.model,
            "platform": self.platform,
            "capability": self.capability,
            "backend": self.backend,
            "kv_cache_dtype": self.kv_cache_dtype,
        }
        out.update(self.extra)
        return out

    def __str__(self) -> str:
        parts = [f"{k}={'<none>' if v is None else v}" for k, v in self.as_dict().items()]
        return " ".join(parts)


def check_impl_allowed(impl: str, allowed: tuple[str, ...]) -> tuple[str, str]:
    """Split ``"module:Class"`` after checking that the module is one of ``allowed``
    or inside one of them; raises :class:`ImplLoadError` otherwise."""
    module, _, attr = impl.partition(":")
    if not any(module == p or module.startswith(p + ".") for p in allowed):
        raise ImplLoadError(
            f"impl {impl!r} is outside the allowed modules {', '.join(allowed)}"
        )
    return module, attr


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
    engine whose own class the rule names (see :mod:`dsv4sel.hosts`).
    """

    __slots__ = ("backend", "impl", "layout", "cache_dtype", "torch_dtype_name", "bytes_per_token",
                 "block_size", "rewrites", "messages", "rule", "path", "query", "allowed_impl_modules",
                 "hosts")
    _defaults = {"allowed_impl_modules": ("dsv4sel.kernels",), "hosts": ()}
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

    def load_impl(self) -> type:
        """Import and return the impl class. Only modules on the rule set's
        allow-list are imported; anything else raises :class:`ImplLoadError`."""
        import importlib

        module_name, attr = check_impl_allowed(self.impl, self.allowed_impl_modules)
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise ImplLoadError(f"cannot import {module_name} for impl {self.impl}: {exc}") from exc
        try:
            return getattr(module, attr)
        except AttributeError:
            raise ImplLoadError(f"{module_name} has no class {attr!r} (impl {self.impl})") from None

    def apply(self, cache_config: Any) -> dict[str, Any]:
        """Apply :attr:`rewrites` to ``cache_config`` (duck-typed) all or nothing.

        Returns the previous values of the attributes that changed. If any
        attribute is missing or cannot be set, nothing stays changed.
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
        done: list[str] = []
        try:
            for name, value in self.rewrites.items():
                setattr(cache_config, name, value)
                done.append(name)
        except Exception:
            for name in done:
                setattr(cache_config, name, previous[name])
            raise
        return {k: v for k, v in previous.items() if v != self.rewrites[k]}

    def record(self) -> str:
        """One line for a decision log: inputs, outcome and the deciding rule."""
        return (f"dsv4sel: {self.query} -> backend={self.backend} layout={self.layout} "
                f"cache_dtype={self.cache_dtype} rule={self.rule.id}@{self.rule.location}")
