"""Host classes: what a serving engine (a *host*) builds for a selection.

A select rule may name, per host, the class that host builds and the host
versions that class path holds for::

    hosts:
      some-engine: {class: "some_engine.layers:Attention", versions: ">=1.2,<1.3"}

The host key is the host's Python distribution name; its class must live in
that distribution's top-level package (``-`` and ``.`` read as ``_``), so a
rule file can never point a host at another package's code. The engine never
imports a host class: the host's own integration (a plugin) does, after
checking its version with :func:`version_matches`; ``dsv4sel check``
resolves the classes of every host installed here in a listed version.

A host entry may also carry ``settings``: what the host must be told to
build the selection, in its own words (``{dsv4_attn_backend: flashmla,
page_size: 256}``); a class alone does not always say what a host builds.

Compiled form: a sorted tuple of ``(host, class, versions)``, and the settings
apart (a select row's ``host_settings``), so that readers of the triples are
unaffected.
"""

from __future__ import annotations

import re

_CLAUSE = re.compile(r"^\s*(==|!=|>=|<=|>|<)\s*([0-9]+(?:\.[0-9]+)*)(\.\*)?\s*$")
_RELEASE = re.compile(r"^\s*v?([0-9]+(?:\.[0-9]+)*)")


def package_of(host: str) -> str:
    """The top-level package a host's classes must live in."""
    return re.sub(r"[-.]+", "_", host).lower()


def parse_versions(spec: str) -> tuple[tuple[str, tuple[int, ...], bool], ...]:
    """``">=0.33,<0.34"`` -> ``(('>=', (0, 33), False), ('<', (0, 34), False))``;
    the bool marks a ``.*`` prefix match (only with ``==``/``!=``). Raises
    ValueError on anything else."""
    out = []
    for part in spec.split(","):
        m = _CLAUSE.match(part)
        if not m:
            raise ValueError(f"version clause {part.strip()!r} is not OP VERSION "
                             "(OP one of ==, !=, >=, <=, >, <)")
        op, release, star = m.group(1), tuple(int(x) for x in m.group(2).split(".")), bool(m.group(3))
        if star and op not in ("==", "!="):
            raise ValueError(f"version clause {part.strip()!r}: '.*' goes with == or != only")
        out.append((op, release, star))
    return tuple(out)


def release_of(version: str) -> tuple[int, ...]:
    """The numeric release part of an installed version (``0.33.0rc1+cu130`` -> ``(0, 33, 0)``)."""
    m = _RELEASE.match(version)
    if not m:
        raise ValueError(f"version {version!r} has no numeric release")
    return tuple(int(x) for x in m.group(1).split("."))


def _pad(a: tuple[int, ...], n: int) -> tuple[int, ...]:
    return a + (0,) * (n - len(a))


def version_matches(version: str, spec: str) -> bool:
    """True when the installed ``version`` satisfies every clause of ``spec``
    (release numbers only; pre-release and local tags are ignored)."""
    have = release_of(version)
    for op, want, star in parse_versions(spec):
        if star:
            hit = have[:len(want)] == want
            if (op == "==") != hit:
                return False
            continue
        n = max(len(have), len(want))
        a, b = _pad(have, n), _pad(want, n)
        ok = {"==": a == b, "!=": a != b, ">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b}[op]
        if not ok:
            return False
    return True


def installed_version(host: str) -> str | None:
    """The installed version of the host distribution, or None."""
    from importlib import metadata

    try:
        return metadata.version(host)
    except metadata.PackageNotFoundError:
        return None


def compile_hosts(raw: dict) -> tuple[tuple[str, str, str], ...]:
    """The compiled form of a rule's ``hosts:`` mapping (validated by the schema)."""
    return tuple(sorted((host, entry["class"], entry["versions"]) for host, entry in raw.items()))


def compile_settings(raw: dict) -> tuple[tuple[str, tuple[tuple[str, str | int], ...]], ...]:
    """The compiled form of the ``settings`` of a rule's hosts: ``(host, ((name, value), ...))``
    for each host entry that has settings, sorted by host and name (validated by the schema)."""
    return tuple(sorted((host, tuple(sorted(entry["settings"].items())))
                        for host, entry in raw.items() if entry.get("settings")))


def problems(raw: dict, shipped: dict[str, tuple[str, ...]] | None = None,
             allowed: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """``(host, message)`` for each entry the schema admits but that is still wrong:
    a class outside the host's package, or a version spec that does not parse.

    A class outside the host's package is right when the domain ships it for that host
    (``shipped``: host -> classes, the profile's ``host_classes``) or when its module is one the
    rule set may import impl classes from (``allowed``: a pack's own layer for the host, allowed
    the way its impl is)."""
    from .values import check_impl_allowed
    from ..errors import ImplLoadError

    out = []
    for host, entry in raw.items():
        module = entry["class"].partition(":")[0]
        pkg = package_of(host)
        if module != pkg and not module.startswith(pkg + ".") and entry["class"] not in (shipped or {}).get(host, ()):
            try:
                check_impl_allowed(entry["class"], allowed)
            except ImplLoadError:
                out.append((host, _outside(host, entry["class"], pkg, (shipped or {}).get(host, ()))))
        try:
            parse_versions(entry["versions"])
        except ValueError as exc:
            out.append((host, f"host {host} versions {entry['versions']!r}: {exc}"))
    return out


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
    except BaseException as exc:  # noqa: BLE001 - the host's own import failing (sys.exit too) is the finding
        return (f"host {host} {have} class {cls!r}: cannot import {module_name}: "
                f"{type(exc).__name__}: {exc}")
    obj = getattr(module, attr, None)
    if not isinstance(obj, type):
        return f"host {host} {have} class {cls!r}: {module_name} has no class {attr!r}"
    return None
