"""dsv4sel: rule-based selection of the DeepSeek-V4 sparse-MLA attention
backend and KV-cache format.

Pipeline (one module each): load (YAML -> data with positions) -> validate
(JSON Schema) -> compile (decision tables over a finite space) -> evaluate
(:class:`~dsv4sel.ruleset.RuleSet`) -> explain / verify.

The public API::

    sel = dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="auto")
    sel.backend, sel.impl, sel.cache_dtype, sel.rewrites, sel.rule

``import dsv4sel`` and a warm ``select()`` import neither torch, yaml nor
jsonschema: compiled rules are cached by content hash (see :mod:`dsv4sel.cache`).
"""

from __future__ import annotations

from ._version import __version__  # noqa: E402

from .errors import ImplLoadError, InvalidQuery, Problem, RuleError, SelectionError  # noqa: E402
from .ruleset import RuleSet  # noqa: E402
from .values import Message, Query, RuleRef, Selection  # noqa: E402

__all__ = [
    "DEFAULT_ALLOWED_IMPL_MODULES", "ImplLoadError", "InvalidQuery", "Message", "Problem", "Query",
    "RuleError", "RuleRef", "RuleSet", "Selection", "SelectionError", "default_rules", "load_rules",
    "select", "__version__", "verify", "verify_program", "Report", "Finding", "VerifyError",
]


def __getattr__(name: str):
    # verify() compiles rule files (yaml, jsonschema): loaded on first use so
    # that `import dsv4sel` stays free of both.
    if name in ("verify", "verify_program"):
        from . import verifier

        return getattr(verifier, name)
    if name in ("Report", "Finding", "VerifyError"):
        from . import findings

        return getattr(findings, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of cold start; annotations are postponed
    from typing import Protocol

    class _Named(Protocol):
        """An enum member such as vLLM's ``AttentionBackendEnum.FLASHMLA_SPARSE``: its ``name`` is used."""

        name: str


from .values import DEFAULT_ALLOWED_IMPL_MODULES  # noqa: E402  (re-exported: the public name)

_default: RuleSet | None = None


def load_rules(paths=None, *, allowed_impl_modules=None, use_cache: bool = True) -> RuleSet:
    """Load, validate and compile rule files into an immutable :class:`RuleSet`.

    ``paths`` lists rule packs: directories (their ``*.yaml`` files in name
    order), single files, or :class:`dsv4sel.sources.Pack` values. None means
    the default set: the shipped rules, installed packs (entry point group
    ``dsv4sel.rules``) and ``DSV4SEL_RULES_PATH``; pass
    ``[*dsv4sel.sources.default_packs(), "my-pack/"]`` to add a pack to it.
    ``paths`` replaces the default set (a pack alone has no vocabulary; the
    error says so). Impl classes may come only from
    :data:`DEFAULT_ALLOWED_IMPL_MODULES`, the modules ``allowed_impl_modules``
    adds to it (as ``--allow-impl-module`` does) and the packs' own packages.

    Raises :class:`RuleError` listing every problem with ``file:line:column``.
    The compiled result is cached, keyed by the exact bytes of the rule files
    and the compiler; a cache hit imports neither yaml nor jsonschema, and a
    damaged cache entry is rebuilt, never trusted.
    """
    from . import sources as _sources

    if paths is None:
        packs = _sources.default_packs()
    else:
        if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") or isinstance(paths, _sources.Pack):
            paths = [paths]
        packs = [p if isinstance(p, _sources.Pack) else _sources.directory_pack(str(p)) for p in paths]
    # the same directory reached twice (an installed pack also on DSV4SEL_RULES_PATH) loads once
    packs = _sources.unique_packs(packs)
    srcs = [s for pack in packs for s in pack.sources()]
    extra_modules = tuple(m for pack in packs for m in pack.impl_modules)
    if isinstance(allowed_impl_modules, str):
        allowed_impl_modules = (allowed_impl_modules,)
    # like --allow-impl-module: added to the default allow-list, never replacing it
    allowed = tuple(dict.fromkeys((*DEFAULT_ALLOWED_IMPL_MODULES, *(allowed_impl_modules or ()), *extra_modules)))
    return _compiled(srcs, allowed, use_cache)


def _compiled(srcs, allowed: tuple[str, ...], use_cache: bool) -> RuleSet:
    """The RuleSet of ``srcs``: from the cache when an intact entry was compiled
    from exactly these bytes, else compiled (and cached)."""
    from . import cache, sources as _sources
    from .ruleset import CorruptTable

    name = _sources.entry_name(srcs, allowed)
    fingerprint = _sources.fingerprint(srcs, allowed)
    entry = cache.read_entry(name) if use_cache else None
    if entry is not None and entry.get("fingerprint") == fingerprint:
        try:
            return RuleSet(entry["table"], entry["digest"], allowed)
        except (CorruptTable, KeyError):
            pass  # damaged or edited: compiled afresh below, and the entry replaced
    from .build import build_program

    from .lower import to_table

    table = to_table(build_program(srcs, allowed))
    digest = _sources.content_hash(srcs, allowed)
    ruleset = RuleSet(table, digest, allowed)
    if use_cache:
        cache.write_entry(name, {"fingerprint": fingerprint, "digest": digest, "table": table}, prune=True)
    return ruleset


def default_rules() -> RuleSet:
    """The shipped rules, loaded once per process."""
    global _default
    if _default is None:
        _default = load_rules()
    return _default


def select(*, platform: str, kv_cache_dtype: str = "auto", backend: str | _Named | None = None,
           capability: str | tuple[int, int] | None = None, model: str = "deepseek_v4",
           rules: RuleSet | None = None, **inputs: str) -> Selection:
    """Select the DeepSeek-V4 attention backend and KV-cache format.

    ``platform`` is one of the declared platforms (cuda, rocm, xpu, cpu);
    ``capability`` a string such as "9.0" or "gfx942", a ``(major, minor)``
    tuple, or None (unknown); ``backend`` None (the platform default), a name
    or an enum member (its ``.name`` is used); ``kv_cache_dtype`` a vLLM
    ``--kv-cache-dtype`` value. Extra keyword arguments fill inputs that rule
    packs declare. ``rules`` defaults to the shipped rules.

    Returns a frozen :class:`Selection`. Raises :class:`SelectionError` (a
    ValueError) when no backend serves the query or an input is outside the
    rules' vocabulary; its ``suggestions`` list working alternatives. Never
    mutates anything: apply ``Selection.rewrites`` with ``Selection.apply``.
    """
    if rules is None:
        rules = _default or default_rules()
    if not inputs and (backend is None or backend.__class__ is str):
        # the hot path: one dict probe of the memo, no normalization. The memo
        # holds exact-type keys only (see _memo_key in dsv4sel/ruleset.py), so a raw value
        # that merely compares equal to one, such as (9.0, 0), misses it; an
        # enum backend is read by name, and a str enum equals its value, so
        # enums take the slow path.
        try:
            hit = rules.memo[platform, kv_cache_dtype, backend, capability, model]
        except (KeyError, TypeError):
            pass
        else:
            if hit.__class__ is Selection:
                return hit
            raise hit.error()
    return rules.select(platform, kv_cache_dtype, backend, capability, model, inputs)
