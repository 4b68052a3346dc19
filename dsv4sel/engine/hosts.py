"""Host classes: what a serving engine (a *host*) builds for a selection.

A select rule may name, per host, the class that host builds and the host
releases that class path holds for; one entry, or a list of entries when
releases differ (another class, or other settings)::

    hosts:
      some-engine: {class: "some_engine.layers:Attention", versions: ">=1.2,<1.3"}
      other-engine:
        - {class: "other.layers:Attention", versions: ">=0.33,<0.34"}
        - {class: "other.layers:Attention", versions: ">=0.34,<0.35", settings: {block_size: 64}}

The host key is the host's Python distribution name; its class must live in
that distribution's top-level package (``-`` and ``.`` read as ``_``), so a
rule file can never point a host at another package's code. Two entries of
one host may not both hold for one release. Version specs are PEP 440
specifier sets (pypa/packaging), restricted to ``==``, ``!=``, ``>=``, ``<=``,
``>``, ``<`` and ``==X.*``; they are matched against the release of the
installed version (pre-release and local tags ignored: a ``0.34.0rc1`` build
is served as 0.34.0). The engine never imports a host class: the host's own
integration (a plugin) does, after checking its version with
:func:`version_matches`; ``dsv4sel check`` resolves the classes of every host
installed here in a listed version.

A host entry may also carry ``settings``: what the host must be told to
build the selection, in its own words (``{dsv4_attn_backend: flashmla,
page_size: 256}``); a class alone does not always say what a host builds.

Compiled form: a sorted tuple of ``(host, class, versions)``, and the settings
apart (a select row's ``host_settings``: ``(host, versions, ((name, value), ...))``),
so that readers of the triples are unaffected.
"""

from __future__ import annotations

import functools
import re

from ..process import Interrupted

TYPE_CHECKING = False  # not `typing`: explain and the serving path import this module
if TYPE_CHECKING:
    from packaging.specifiers import SpecifierSet

_CLAUSE = re.compile(r"^\s*(==|!=|>=|<=|>|<)\s*([0-9]+(?:\.[0-9]+)*)(\.\*)?\s*$")


def package_of(host: str) -> str:
    """The top-level package a host's classes must live in."""
    return re.sub(r"[-.]+", "_", host).lower()


def specifier(spec: str) -> SpecifierSet:
    """``">=0.33,<0.34"`` as a :class:`packaging.specifiers.SpecifierSet`. Raises ValueError
    naming the clause when a clause is not ``OP VERSION`` with one of the six operators (a
    ``.*`` suffix only with ``==``/``!=``)."""
    from packaging.specifiers import InvalidSpecifier, SpecifierSet

    for part in spec.split(","):
        m = _CLAUSE.match(part)
        if not m:
            raise ValueError(f"version clause {part.strip()!r} is not OP VERSION "
                             "(OP one of ==, !=, >=, <=, >, <)")
        if m.group(3) and m.group(1) not in ("==", "!="):
            raise ValueError(f"version clause {part.strip()!r}: '.*' goes with == or != only")
    try:
        return SpecifierSet(spec)
    except InvalidSpecifier as exc:  # the regex admits nothing packaging refuses; kept as a guard
        raise ValueError(f"version spec {spec!r}: {exc}") from None


def release_of(version: str) -> str:
    """The release part of an installed version (``0.33.0rc1+cu130`` -> ``"0.33.0"``).
    Raises ValueError for a string that is not a PEP 440 version."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version).base_version
    except InvalidVersion:
        raise ValueError(f"version {version!r} is not a PEP 440 version") from None


@functools.lru_cache(maxsize=1024)
def version_matches(version: str, spec: str) -> bool:
    """True when the release of the installed ``version`` satisfies every clause of ``spec``
    (remembered: a process asks about a few versions and specs, once per selection read)."""
    return specifier(spec).contains(release_of(version), prereleases=True)


def _probes(*specs: str) -> list[str]:
    """Releases at, just above and just below every bound of ``specs``: two specifier sets of
    the six operators that share a release share one of these."""
    out = set()
    for spec in specs:
        for m in map(_CLAUSE.match, spec.split(",")):
            if m is None:
                continue
            nums = [int(x) for x in m.group(2).split(".")]
            out.update({".".join(map(str, nums)), ".".join(map(str, [*nums, 1]))})
            if nums[-1] > 0:
                out.add(".".join(map(str, [*nums[:-1], nums[-1] - 1, 999])))
    return sorted(out)


def overlap(a: str, b: str) -> str | None:
    """A release both specs hold for, or None."""
    sa, sb = specifier(a), specifier(b)
    return next((v for v in _probes(a, b) if sa.contains(v, prereleases=True) and sb.contains(v, prereleases=True)),
                None)


def installed_version(host: str) -> str | None:
    """The installed version of the host distribution, or None."""
    from importlib import metadata

    try:
        return metadata.version(host)
    except metadata.PackageNotFoundError:
        return None


def upper_bound(spec: str) -> tuple[int, ...]:
    """A sort key for how far up a spec reaches: its lowest ``<``/``<=``/``==`` bound, or
    no bound at all (highest)."""
    caps = []
    for m in map(_CLAUSE.match, spec.split(",")):
        if m is not None and m.group(1) in ("<", "<=", "=="):
            caps.append(tuple(int(x) for x in m.group(2).split(".")))
    return min(caps) if caps else (1 << 30,)


def entries(raw: dict) -> list[tuple[str, dict]]:
    """``(host, entry)`` for each entry of a rule's ``hosts:`` mapping (an entry or a list of them)."""
    return [(host, entry) for host, value in raw.items()
            for entry in (value if isinstance(value, list) else [value])]


def compile_hosts(raw: dict) -> tuple[tuple[str, str, str], ...]:
    """The compiled form of a rule's ``hosts:`` mapping (validated by the schema)."""
    return tuple(sorted((host, entry["class"], entry["versions"]) for host, entry in entries(raw)))


def compile_settings(raw: dict) -> tuple[tuple[str, str, tuple[tuple[str, str | int], ...]], ...]:
    """The compiled form of the ``settings`` of a rule's hosts: ``(host, versions, ((name, value), ...))``
    for each host entry that has settings, sorted (validated by the schema)."""
    return tuple(sorted((host, entry["versions"], tuple(sorted(entry["settings"].items())))
                        for host, entry in entries(raw) if entry.get("settings")))


def described(hosts: tuple, host_settings: tuple) -> list[tuple[str, str, str, dict]]:
    """The compiled ``hosts`` and ``host_settings`` of one selection read together:
    ``(host, class, versions, settings)`` per entry, in the compiled order (the one reader
    every tool uses to show them)."""
    told = {(host, versions): dict(pairs) for host, versions, pairs in host_settings}
    return [(host, cls, versions, told.get((host, versions), {})) for host, cls, versions in hosts]


def hosts_dict(hosts: tuple, host_settings: tuple) -> dict[str, list[dict]]:
    """The JSON form of one selection's host entries: ``{host: [{class, versions[, settings]}, ...]}``."""
    out: dict[str, list[dict]] = {}
    for host, cls, versions, settings in described(hosts, host_settings):
        out.setdefault(host, []).append({"class": cls, "versions": versions, **({"settings": settings} if settings else {})})
    return out


def problems(raw: dict, shipped: dict[str, tuple[str, ...]] | None = None,
             allowed: tuple[str, ...] = (), fields: dict[str, type] | None = None) -> list[tuple[str, str]]:
    """``(host, message)`` for each entry the schema admits but that is still wrong: a class
    outside the host's package, a version spec that does not parse, two entries of one host
    that hold for one release, or a setting that restates a select field (``fields``: name ->
    type, the profile's) with a value of another type (``block_size: "64"``).

    A class outside the host's package is right when the domain ships it for that host
    (``shipped``: host -> classes, the profile's ``host_classes``) or when its module is one the
    rule set may import impl classes from (``allowed``: a pack's own layer for the host, allowed
    the way its impl is)."""
    from .values import check_impl_allowed
    from ..errors import ImplLoadError

    out = []
    seen: dict[str, list[str]] = {}
    for host, entry in entries(raw):
        module = entry["class"].partition(":")[0]
        pkg = package_of(host)
        if module != pkg and not module.startswith(pkg + ".") and entry["class"] not in (shipped or {}).get(host, ()):
            try:
                check_impl_allowed(entry["class"], allowed)
            except ImplLoadError:
                out.append((host, _outside(host, entry["class"], pkg, (shipped or {}).get(host, ()))))
        out.extend((host, message) for message in _setting_problems(host, entry, fields or {}))
        try:
            specifier(entry["versions"])
        except ValueError as exc:
            out.append((host, f"host {host} versions {entry['versions']!r}: {exc}"))
            continue
        for earlier in seen.setdefault(host, []):
            both = overlap(earlier, entry["versions"])
            if both is not None:
                out.append((host, f"host {host} has two entries for release {both} ({earlier!r} and "
                                  f"{entry['versions']!r}); give each release range one entry"))
        seen[host].append(entry["versions"])
    return out


def _setting_problems(host: str, entry: dict, fields: dict[str, type]) -> list[str]:
    """A setting that builds a select field (``block_size``) must have that field's type."""
    out = []
    for name, value in (entry.get("settings") or {}).items():
        kind = fields.get(name)
        if kind is not None and type(value) is not kind:
            out.append(f"host {host} setting {name} is {value!r} ({type(value).__name__}); it builds the "
                       f"select field {name}, {_article(kind)}: write {name}: {_example(kind)}")
    return out


def _example(kind: type) -> str:
    return "64" if kind is int else '"..."'


def _article(kind: type) -> str:
    return "an int" if kind is int else f"a {kind.__name__}"


def _outside(host: str, cls: str, pkg: str, shipped: tuple[str, ...]) -> str:
    """The DSV315 message for a host class outside its host's package, and the ways to name one."""
    from .hints import allow_impl_hint

    ours = f"; or name {' or '.join(shipped)}, which dsv4sel ships for {host}" if shipped else ""
    return (f"host {host} class {cls!r} is outside the host's package {pkg!r}; a pack's own {host} class is "
            f"imported only from a module the process allows, as an impl is{allow_impl_hint(cls)} "
            f"(a serving process: DSV4SEL_ALLOW_IMPL_MODULES={cls.partition(':')[0].split('.')[0]}){ours}")


def host_class_problem(host: str, cls: str, versions: str) -> str | None:
    """Why a host class does not resolve here, or None when it does or when the
    host is not installed in one of ``versions`` (nothing to check then)."""
    import importlib

    have = installed_version(host)
    if have is None:
        return None
    try:
        if not version_matches(have, versions):
            return None
    except ValueError:
        return None
    module_name, _, attr = cls.partition(":")
    try:
        module = importlib.import_module(module_name)
    except (Interrupted, MemoryError):  # the user's Ctrl-C, the machine's memory: not the host's failure
        raise
    except BaseException as exc:  # noqa: BLE001 - the host's own import failing (sys.exit too) is the finding
        return (f"host {host} {have} class {cls!r}: cannot import {module_name}: "
                f"{type(exc).__name__}: {exc}")
    obj = getattr(module, attr, None)
    if not isinstance(obj, type):
        return f"host {host} {have} class {cls!r}: {module_name} has no class {attr!r}"
    return None
