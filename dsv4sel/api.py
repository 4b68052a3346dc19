"""The public API: the generic engine bound to the DeepSeek-V4 profile.

One pipeline from rule paths to a program serves every entry point:
:func:`resolve` turns what the caller named into rule packs, rule files and
the allow-list, and :func:`dsv4sel.engine.build.build_program` compiles them
for :data:`~dsv4sel.dsv4.profile.PROFILE`. :func:`load_rules` caches the
compiled form, :func:`verify` checks the program, and :func:`select` is the
serving path: a warm call is one dict probe, importing neither yaml,
jsonschema nor torch.
"""

from __future__ import annotations

import os

from .dsv4.profile import DEFAULT_ALLOWED_IMPL_MODULES, PROFILE
from .dsv4.rules import RuleSet
from .dsv4.selection import Selection

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of cold start; annotations are postponed
    from typing import Protocol

    from .check.findings import Report

    class _Named(Protocol):
        """An enum member such as vLLM's ``AttentionBackendEnum.FLASHMLA_SPARSE``: its ``name`` is used."""

        name: str

_default: RuleSet | None = None


def _domain_files() -> tuple[str, ...]:
    """The files of the profile a compiled table also depends on (with the engine's modules)."""
    from .dsv4 import profile

    return (PROFILE.schema, profile.__file__)


def resolve(paths=None, allowed_impl_modules=None, *, extra=(), also_allowed: tuple[str, ...] = (),
            strict: bool = False) -> tuple[list, list, tuple[str, ...]]:
    """``(packs, sources, allowed)`` for rule ``paths``, as every entry point
    reads them.

    ``paths`` is None (the default set: the shipped rules, installed packs,
    ``DSV4SEL_RULES_PATH``), a path, a :class:`~dsv4sel.engine.sources.Pack`,
    or a list of those; ``extra`` (the same kinds) is loaded on top of them, as
    ``--rules`` adds a pack; the same directory reached twice loads once. The
    allow-list is :data:`DEFAULT_ALLOWED_IMPL_MODULES` plus
    ``allowed_impl_modules`` (added, never replacing it, as
    ``--allow-impl-module`` does), ``also_allowed`` and the packs' own
    packages. With ``strict``, a missing path or a directory without rule
    files raises :class:`~dsv4sel.check.findings.VerifyError`; otherwise it
    is a located problem of the load stage."""
    from .engine import sources as _sources

    if paths is None:
        packs = _sources.default_packs()
        # the default set is the process configuration: its allow-list may name pack modules too
        also_allowed = (*also_allowed, *_sources.environment_allowed_modules())
    else:
        packs = _named_packs(paths, strict)
    if extra:
        packs = [*packs, *_named_packs(extra, strict)]
    packs = _sources.unique_packs(packs)
    if isinstance(allowed_impl_modules, str):
        allowed_impl_modules = (allowed_impl_modules,)
    allowed_impl_modules = _allowed_modules(allowed_impl_modules)
    allowed = tuple(dict.fromkeys((*DEFAULT_ALLOWED_IMPL_MODULES, *(allowed_impl_modules or ()), *also_allowed,
                                   *(m for pack in packs for m in pack.impl_modules))))
    return packs, [s for pack in packs for s in pack.sources()], allowed


def _allowed_modules(names) -> tuple[str, ...]:
    """``allowed_impl_modules`` as given, each entry a dotted module name
    (:func:`~dsv4sel.engine.values.allowed_module_problem`, the test every way in shares);
    else one :class:`RuleError` naming the argument (code DSV310, as the environment's)."""
    from .engine.values import allowed_module_problem
    from .errors import Problem, RuleError

    names = tuple(names or ())
    for name in names:
        problem = allowed_module_problem(name)
        if problem is not None:
            raise RuleError([Problem("<allowed_impl_modules>", 1, 1, f"allowed_impl_modules: {problem}", "DSV310")])
    return names


def _named_packs(paths, strict: bool) -> list:
    """The packs of ``paths`` (a path, a Pack, or a list of those), in order; with ``strict``,
    each directory must hold rule files and the list must not be empty."""
    from .engine import sources as _sources

    if isinstance(paths, (str, bytes)) or hasattr(paths, "__fspath__") or isinstance(paths, _sources.Pack):
        paths = [paths]
    packs = []
    for item in paths:
        if isinstance(item, _sources.Pack):
            packs.append(item)
            continue
        pack = _sources.directory_pack(os.fsdecode(item))
        if strict:
            _must_hold_rules(pack)
        packs.append(pack)
    if strict and not packs:
        from .check.findings import VerifyError

        raise VerifyError("no rule paths given")
    return packs


def _must_hold_rules(pack) -> None:
    from .check.findings import VerifyError

    if not os.path.exists(pack.path):
        raise VerifyError(f"rule path {pack.path!r} does not exist")
    empty = [s.unreadable for s in pack.sources() if s.code == "DSV306"]  # a directory without rule files
    if empty:
        raise VerifyError(empty[0])


def load_rules(paths=None, *, extra=(), allowed_impl_modules=None, use_cache: bool = True) -> RuleSet:
    """Load, validate and compile rule files into an immutable :class:`RuleSet`.

    ``paths`` lists rule packs: directories (their ``*.yaml`` files in name
    order), single files, or :class:`dsv4sel.engine.sources.Pack` values. None means
    the default set: the shipped rules, installed packs (entry point group
    ``dsv4sel.rules``) and ``DSV4SEL_RULES_PATH``, with the modules
    ``DSV4SEL_ALLOW_IMPL_MODULES`` allows. ``paths`` replaces the default set (a
    pack alone has no vocabulary; the error says so); ``extra`` adds packs on top
    of it, as ``--rules`` does: ``load_rules(extra=["my-pack/rules"])`` is the
    default set plus a pack. Impl classes may come only from
    :data:`DEFAULT_ALLOWED_IMPL_MODULES`, the modules ``allowed_impl_modules``
    adds to it (as ``--allow-impl-module`` does) and the packs' own packages.

    Raises :class:`RuleError` listing every problem with ``file:line:column``.
    The compiled result is cached, keyed by the exact bytes of the rule files,
    the engine and the profile; a cache hit imports neither yaml nor
    jsonschema, and a damaged cache entry is rebuilt, never trusted.
    """
    _packs, srcs, allowed = resolve(paths, allowed_impl_modules, extra=extra)
    return _compiled(srcs, allowed, use_cache)


#: The shipped rules' compiled form, written into the package at build time
#: (setup.py's build hook; ``make run`` in a checkout). Read only when the
#: rule set is the shipped one alone and its fingerprint matches.
SHIPPED_ARTIFACT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "shipped.dsv4c")


def _compiled(srcs, allowed: tuple[str, ...], use_cache: bool) -> RuleSet:
    """The RuleSet of ``srcs``: from the packaged artifact (the shipped rules
    alone) or the user cache when an intact, trusted entry was compiled from
    exactly these bytes, else compiled (and cached)."""
    from .engine import cache, sources as _sources

    code = _domain_files()
    fingerprint = _sources.fingerprint_bytes(srcs, allowed, code)
    name = _sources.entry_name(srcs, allowed)
    if use_cache:
        if all(s.pack == "dsv4sel" for s in srcs):
            ruleset = _from_entry(cache.read_packaged(SHIPPED_ARTIFACT), fingerprint, allowed, verified=True)
            if ruleset is not None:
                return ruleset
        ruleset = _from_entry(cache.read_entry(name), fingerprint, allowed)
        if ruleset is not None:
            return ruleset
    table, digest = _compile(srcs, allowed, code)
    ruleset = RuleSet(table, digest, allowed)
    if use_cache:
        cache.write_entry(name, *_as_entry(table, digest, fingerprint), prune=True)
    return ruleset


def _compile(srcs, allowed: tuple[str, ...], code: tuple[str, ...]) -> tuple[dict, str]:
    from .engine import sources as _sources
    from .engine.build import build_program
    from .engine.lower import to_table

    table = to_table(build_program(srcs, allowed, PROFILE))
    return table, _sources.content_hash(srcs, allowed, code)


def _as_entry(table: dict, digest: str, fingerprint: bytes) -> tuple[dict, bytes]:
    """A compiled table as a cache entry: the JSON part, and the blob holding
    the fingerprint and then the decision array."""
    array = {k: v for k, v in table["table"].items() if k != "ids"}
    data = {"digest": digest, "fingerprint": len(fingerprint), "table": {**table, "table": array}}
    return data, fingerprint + table["table"]["ids"]


def _from_entry(entry, fingerprint: bytes, allowed: tuple[str, ...], verified: bool = False) -> RuleSet | None:
    """The RuleSet an entry holds when it was compiled from ``fingerprint``
    and passes every check of :class:`RuleSet`; None otherwise (the caller
    compiles, and replaces the entry). ``verified``: the packaged artifact,
    whose exact bytes passed those checks when they were written
    (:func:`write_shipped_artifact`)."""
    from .engine.ruleset import CorruptTable

    if entry is None:
        return None
    data, blob = entry.data, entry.blob
    n, digest, table = data.get("fingerprint"), data.get("digest"), data.get("table")
    # bytes(): comparing a memoryview with bytes goes item by item (0.5 ms for the ~260 kB)
    if (type(n) is not int or not 0 <= n <= len(blob) or bytes(blob[:n]) != fingerprint or type(digest) is not str
            or len(digest) != 64 or digest.strip("0123456789abcdef") or type(table) is not dict
            or type(table.get("table")) is not dict):
        return None
    table["table"]["ids"] = blob[n:]
    try:
        return RuleSet.from_verified(table, digest, allowed) if verified else RuleSet(table, digest, allowed)
    except CorruptTable:
        return None


def write_shipped_artifact(path: str = SHIPPED_ARTIFACT) -> str:
    """Compile the shipped rules (alone, with the default allow-list) and
    write their compiled form to ``path``; setup.py's build hook and
    ``make run`` call it. Returns ``path``."""
    from .engine import cache, sources as _sources

    srcs = _sources.shipped_sources()
    allowed = tuple(DEFAULT_ALLOWED_IMPL_MODULES)
    code = _domain_files()
    table, digest = _compile(srcs, allowed, code)
    fingerprint = _sources.fingerprint_bytes(srcs, allowed, code)
    raw = cache.encode(*_as_entry(table, digest, fingerprint), packaged=True)
    # every check of RuleSet, on exactly the bytes written: a reader of the package then
    # checks only that they arrived intact (CRC-32) and still match (the fingerprint)
    if _from_entry(cache.decode_packaged(raw), fingerprint, allowed) is None:
        raise RuntimeError("the shipped rules' compiled form does not load back")
    cache.write_file(path, raw)
    return path


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
        # holds exact-type keys only (see _memo_key in dsv4sel/dsv4/rules.py), so a raw value
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


def verify(rules=None, *, extra=(), allowed_impl_modules=None) -> Report:
    """Prove rule files decide every input exactly once, or say where they do not.

    ``rules`` and ``extra`` are what :func:`load_rules` takes as ``paths`` and
    ``extra`` (None: the default set; ``verify(extra=["my-pack/rules"])``: the
    default set plus a pack), or ``rules`` is a :class:`RuleSet` (its source
    files are re-read and must still hash to its digest), or a compiled
    :class:`~dsv4sel.engine.model.Program` (then without ``extra``).
    Problems in the files (YAML, schema, vocabulary typos, dangling
    references, ...) come back as findings with ``file:line:column``; when
    there are any, the space is not analysed. Raises
    :class:`~dsv4sel.check.findings.VerifyError` (a ValueError) only when
    there is nothing to verify: a missing path, a directory without rule
    files. What counts as a finding: :mod:`dsv4sel.check.verifier`."""
    from .check.verifier import problem_report, verify_program
    from .engine.build import build_program
    from .engine.lower import to_table
    from .engine.model import Program
    from .errors import RuleError

    if extra and isinstance(rules, (Program, RuleSet)):
        from .check.findings import VerifyError

        raise VerifyError("extra= adds rule packs to rule paths (or to the default set), not to a compiled "
                          f"{type(rules).__name__}: pass the paths instead")
    if isinstance(rules, Program):
        return _with_host_spaces(verify_program(rules))
    if isinstance(rules, RuleSet):
        packs = _packs_of_ruleset(rules)
        _, srcs, allowed = resolve(packs, allowed_impl_modules, also_allowed=rules.allowed_impl_modules)
    else:
        _, srcs, allowed = resolve(rules, allowed_impl_modules, extra=extra, strict=True)
    try:
        program = build_program(srcs, allowed, PROFILE)
        # what select() would refuse, check refuses: the compiled form's bounds
        # (its size, rendered rows and texts) are the lowering stage's
        to_table(program)
    except RuleError as exc:
        return problem_report(tuple(s.display for s in srcs), exc.problems)
    return _with_host_spaces(verify_program(program))


def _with_host_spaces(report: Report) -> Report:
    """The default rules are the ones the shipped host translations map onto: their report
    gets the per-host stage (:mod:`dsv4sel.check.host_spaces`), however they were named."""
    from .engine.sources import default_packs

    if tuple(report.sources) != tuple(s.display for p in default_packs() for s in p.sources()):
        return report
    from .check.host_spaces import with_host_spaces

    return with_host_spaces(report, default_rules())


def _packs_of_ruleset(ruleset: RuleSet) -> list:
    """The packs a RuleSet was compiled from, proven by its content hash.

    A RuleSet keeps only its files' display names; the default packs, or one
    directory pack per directory of those names, are tried, and accepted only
    when they hash to the RuleSet's digest, so a verified RuleSet is always
    the one that was loaded."""
    from .check.findings import VerifyError
    from .engine import sources as _sources

    default = _sources.default_packs()
    known = {s.display for p in default for s in p.sources()}

    def dirs(names):
        return [_sources.directory_pack(d) for d in dict.fromkeys(os.path.dirname(n) or "." for n in names)]
    # the default set; directory packs alone (--only-rules); the default set plus directory packs (--rules)
    candidates = [default, dirs(ruleset.sources), [*default, *dirs(n for n in ruleset.sources if n not in known)]]
    for packs in candidates:
        srcs = [s for p in packs for s in p.sources()]
        if tuple(s.display for s in srcs) != tuple(ruleset.sources):
            continue
        if _sources.content_hash(srcs, tuple(ruleset.allowed_impl_modules), _domain_files()) == ruleset.digest:
            return packs
    raise VerifyError("cannot find the rule files this RuleSet was compiled from (or they changed "
                      "since it was loaded); pass their paths to verify() instead")
