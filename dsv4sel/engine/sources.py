"""Where rule files come from, what they are called in messages, and the
stamps and content hash that key the compiled cache.

Rule packs, lowest precedence first (see docs/rule-packs.md):

1. the shipped rules (pack ``dsv4sel``, files named ``rules/NAME.yaml``);
2. installed packs: entry points in group ``dsv4sel.rules``, by entry-point
   name; each entry point names a package whose directory holds the YAML
   files, and the pack may name impl classes inside that top-level package;
3. directories listed in ``DSV4SEL_RULES_PATH`` (``os.pathsep``-separated);
4. directories given to ``dsv4sel ... --rules DIR``.

Later packs add vocabulary values, backends and default rules; a default
rule of a later pack takes precedence over earlier ones only when it says
``override: true``.
"""

from __future__ import annotations

import os

from .._version import __version__
from ..record import Frozen
from .text import escape

RULE_SUFFIXES = (".yaml", ".yml")


ENTRY_POINT_GROUP = "dsv4sel.rules"
RULES_PATH_ENV = "DSV4SEL_RULES_PATH"
#: Impl modules the process configuration allows besides the defaults (comma-separated dotted
#: names): how a serving process (the vLLM plugin, ``select()``) lets a pack on
#: ``DSV4SEL_RULES_PATH`` name a kernel in its own module. Read at each load, never cached.
ALLOW_IMPL_ENV = "DSV4SEL_ALLOW_IMPL_MODULES"


class Pack(Frozen):
    """A set of rule files: a ``name`` (shown by ``explain``), a file or
    directory ``path``, the ``impl_modules`` its rules may import from beyond
    the default allow-list, and the ``label`` that prefixes its file names in
    messages (None: the path relative to the working directory)."""

    __slots__ = ("name", "path", "impl_modules", "label")
    _defaults = {"impl_modules": (), "label": None}

    def sources(self) -> list["Source"]:
        return expand(self.path, self.name, self.label)


class Source(Frozen):
    """One rule file: ``path`` on disk, ``display`` in messages, the ``pack``
    it belongs to, and ``unreadable``: why the file (or its pack's directory)
    cannot be read, found while listing it, or None."""

    __slots__ = ("path", "display", "pack", "unreadable")
    _defaults = {"pack": "dsv4sel", "unreadable": None}


def shipped_rules_dir() -> str:
    """The directory of the shipped rules: package data ``dsv4sel/rules`` when
    installed from a wheel, the repository's ``rules/`` in a checkout or an
    editable install."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the dsv4sel package
    for candidate in (os.path.join(here, "rules"), os.path.join(os.path.dirname(here), "rules")):
        if os.path.isfile(os.path.join(candidate, "vocabulary.yaml")):
            return candidate
    raise RuntimeError(f"dsv4sel is installed without its rules: no rules/vocabulary.yaml next to {here}")


def _display(path: str, root: str | None, root_label: str | None) -> str:
    """A file's name in messages; control characters in it are escaped (a
    file name is as untrusted as the file)."""
    if root is not None and root_label is not None:
        return escape(f"{root_label}/{os.path.relpath(path, root)}")
    rel = os.path.relpath(path)
    return escape(path if rel.startswith("..") else rel)


def expand(path: str, pack: str = "dsv4sel", root_label: str | None = None) -> list[Source]:
    """The rule files at ``path``: the file itself, or a directory's ``*.yaml``
    files in name order. A missing path yields one Source whose read fails
    later with a located problem."""
    if os.path.isdir(path):
        try:
            listed = os.listdir(path)
        except OSError as exc:
            return [Source(path, _display(path, None, None), pack,
                           f"cannot list the rule directory: {escape(exc.strerror or str(exc))}")]
        names = sorted(n for n in listed if n.endswith(RULE_SUFFIXES) and not n.startswith("."))
        return [Source(os.path.join(path, n), _display(os.path.join(path, n), path, root_label), pack)
                for n in names]
    return [Source(path, _display(path, None, None), pack)]


def shipped_pack() -> Pack:
    return Pack("dsv4sel", shipped_rules_dir(), (), "rules")


def shipped_sources() -> list[Source]:
    return shipped_pack().sources()


def directory_pack(path: str) -> Pack:
    """A pack from a directory (or file) named on the command line or in the environment."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    # a pack's YAML usually sits in a folder named `rules`; the folder above names the pack
    name = parts[-2] if parts[-1] == "rules" and len(parts) > 1 else parts[-1]
    return Pack(os.path.splitext(name)[0] or path, path)


def _entry_point_metadata() -> tuple:
    """What decides the installed packs, exactly: for every directory on the
    import path, its distributions' metadata folders and the text of those
    ``entry_points.txt`` that mention the group. Installing, removing or
    editing a distribution that declares a pack changes it. Costs a directory
    listing per path entry, against ~20 ms for importing importlib.metadata."""
    import sys

    group = ENTRY_POINT_GROUP.encode()
    out = []
    for entry in sys.path:
        try:
            names = sorted(e.name for e in os.scandir(entry or ".")
                           if e.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            continue
        declared = []
        for name in names:
            text = _read_bytes(os.path.join(entry or ".", name, "entry_points.txt"))
            if text is not None and group in text:
                declared.append((name, text))
        out.append((entry, tuple(names), tuple(declared)))
    return tuple(out)


def _scan_entry_points() -> list[tuple]:
    from importlib.metadata import entry_points
    from importlib.util import find_spec

    found = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        module = ep.value.split(":")[0].strip()
        try:
            spec = find_spec(module)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            # a broken pack must not silently vanish: it becomes a path that fails to load
            found.append((ep.name, f"<entry point {ep.name} = {ep.value}: package not found>", (), None))
            continue
        top = module.split(".")[0]
        found.append((ep.name, list(spec.submodule_search_locations)[0], (top,), ep.name))
    return found


def installed_packs() -> list[Pack]:
    """Packs of installed distributions (entry point group ``dsv4sel.rules``).

    Scanning distributions costs ~20 ms of imports, so the result is cached,
    and reused only while :func:`_entry_point_metadata` is unchanged: the
    packs, and the impl modules they allow, always follow the installed
    distributions, never a stale or edited cache entry."""
    from . import cache

    key = _entry_point_metadata()
    entry = cache.read_entry("installed-packs")
    found = None
    if entry is not None and entry.get("key") == key:
        found = _valid_pack_rows(entry.get("packs"), key)
    if found is None:
        found = _scan_entry_points()
        cache.write_entry("installed-packs", {"key": key, "packs": found})
    return [Pack(name, path, tuple(modules), label) for name, path, modules, label in found]


def _declared(key: tuple) -> dict[str, str]:
    """Entry-point name -> module of group ``dsv4sel.rules``, read from the
    ``entry_points.txt`` texts that :func:`_entry_point_metadata` collected
    (an INI file: ``[group]`` headers, ``name = module[:attr]`` lines)."""
    out: dict[str, str] = {}
    if not any(declared for _entry, _names, declared in key):
        return out  # no pack installed: spare the cold start configparser's import
    import configparser

    for _entry, _names, declared in key:
        for _dist, text in declared:
            parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            parser.optionxform = str  # entry-point names are case-sensitive
            try:
                parser.read_string(text.decode("utf-8", "replace"))
            except configparser.Error:
                continue
            if parser.has_section(ENTRY_POINT_GROUP):
                for name, value in parser.items(ENTRY_POINT_GROUP):
                    out.setdefault(name, value.split(":")[0].strip())
    return out


def _valid_pack_rows(rows, key: tuple) -> list | None:
    """Cached pack rows, if each is one that the installed metadata ``key``
    declares (its name an entry point of the group, its impl module that
    entry point's top-level package) and names an existing directory; else
    None. A cache entry can therefore never widen the impl allow-list beyond
    what installed distributions declare."""
    try:
        rows = list(rows)
        declared = _declared(key)
        for name, path, modules, label in rows:
            module = declared.get(name)
            if module is None or type(path) is not str or label not in (None, name):
                return None
            if path.startswith("<entry point"):  # a broken pack, kept so that it fails loudly
                if tuple(modules) != ():
                    return None
                continue
            if tuple(modules) != (module.split(".")[0],) or not os.path.isdir(path):
                return None
    except (TypeError, ValueError):
        return None
    return rows if len(rows) == len(declared) else None


def environment_packs() -> list[Pack]:
    value = os.environ.get(RULES_PATH_ENV, "")
    return [directory_pack(p) for p in value.split(os.pathsep) if p.strip()]


def environment_allowed_modules() -> tuple[str, ...]:
    """The modules ``DSV4SEL_ALLOW_IMPL_MODULES`` allows (empty when unset). Each must be a dotted
    Python module name (``my_pack.kernels``); anything else is one :class:`RuleError` naming the
    variable, so a typo never silently allows nothing, or something else."""
    import re

    from ..errors import Problem, RuleError

    names = tuple(part.strip() for part in os.environ.get(ALLOW_IMPL_ENV, "").split(",") if part.strip())
    for name in names:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", name, re.ASCII):
            raise RuleError([Problem(f"${ALLOW_IMPL_ENV}", 1, 1, f"{ALLOW_IMPL_ENV} holds {escape(name)!s}, which is "
                                     "not a dotted module name; write e.g. my_pack.kernels (comma-separated)",
                                     "DSV310")])
    return names


def default_packs() -> list[Pack]:
    """The rule set ``dsv4sel.select()`` uses: shipped, installed, then environment packs."""
    return [shipped_pack(), *installed_packs(), *environment_packs()]


# The stages that turn YAML into the compiled table: editing any of them must
# invalidate cached tables even when the version string stays the same.
def compiler_files() -> tuple[str, ...]:
    """Every module of the engine: listed, not named, so that a new engine
    module can never be left out of the fingerprint."""
    here = os.path.dirname(os.path.abspath(__file__))
    return tuple(os.path.join(here, n) for n in sorted(os.listdir(here)) if n.endswith(".py"))


def _read_bytes(path: str) -> bytes | None:
    """The first bytes of a regular file, or None for anything else: a FIFO
    must not block the fingerprint, nor a link to /dev/zero fill memory (the
    loader then reports the file)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            return fh.read(_MAX_FINGERPRINT_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


# a rule file larger than the loader's limit fails to load anyway; reading a
# little past it keeps a /dev/zero link from filling memory here
_MAX_FINGERPRINT_BYTES = 1 << 20


def fingerprint(sources: list[Source], extra: tuple[str, ...] = (), code: tuple[str, ...] = ()) -> tuple:
    """Everything a compiled table depends on, exactly: the version, ``extra``
    (the allow-list), and the bytes of the engine's modules, of the domain's
    files ``code`` (its profile and rule schema) and of every rule file with
    its name and pack. A cached table is current only when its
    fingerprint equals this one, so an edit is seen even when the file keeps
    its size and mtime (``touch -d``, ``cp -p``, ``rsync -a``, fixed-mtime
    builds). Reading ~20 small files costs well under a millisecond."""
    return (__version__, tuple(extra), tuple(_read_bytes(path) for path in (*compiler_files(), *code)),
            tuple((s.display, s.pack, s.path, _read_bytes(s.path)) for s in sources))


def entry_name(sources: list[Source], extra: tuple[str, ...] = ()) -> str:
    """Cache file name for a set of sources: the same files share one entry,
    which is replaced when their content changes."""
    import zlib

    identity = repr((__version__, tuple(extra), [(s.display, s.pack, s.path) for s in sources]))
    return f"{zlib.crc32(identity.encode()):08x}"


def content_hash(sources: list[Source], extra: tuple[str, ...] = (), code: tuple[str, ...] = ()) -> str:
    """SHA-256 of :func:`fingerprint`: the identity of a compiled rule set,
    shown by ``explain`` and ``doctor`` and used by ``verify`` to find the
    files a RuleSet came from."""
    import hashlib  # ~2 ms (OpenSSL); paid when compiling or verifying, not on a cache hit

    version, allowed, compiler, files = fingerprint(sources, extra, code)
    h = hashlib.sha256()
    h.update(version.encode())
    for item in compiler:
        h.update(b"\0c" + (item if item is not None else b"<missing>"))
    for item in allowed:
        h.update(b"\0x" + item.encode())
    for display, pack, _path, data in files:
        h.update(b"\0f" + display.encode() + b"\0" + pack.encode() + b"\0")
        h.update(data if data is not None else b"<unreadable>")
    return h.hexdigest()



def _package_name(path: str) -> str | None:
    """The dotted package a pack directory is (``dsv4sel_b12x.rules``), from its ``__init__.py`` files."""
    path = os.path.realpath(path)
    parts = []
    while os.path.isdir(path) and os.path.isfile(os.path.join(path, "__init__.py")):
        parts.append(os.path.basename(path))
        path = os.path.dirname(path)
    return ".".join(reversed(parts)) or None


def unique_packs(packs: list[Pack]) -> list[Pack]:
    """``packs`` with each pack once, the same way for every command.

    The same directory twice (an installed pack also on ``DSV4SEL_RULES_PATH``)
    keeps its first occurrence. A directory that is the same Python package as
    an earlier pack (``--rules`` naming the working copy of an installed pack:
    both are ``dsv4sel_b12x.rules``) replaces it, keeping the installed pack's
    impl modules, so the working copy is what is checked and explained."""
    out: list[Pack] = []
    paths: set[str] = set()
    packages: dict[str, int] = {}
    for pack in packs:
        key = os.path.realpath(pack.path)
        if key in paths:
            continue
        paths.add(key)
        name = _package_name(pack.path)
        if name is not None and name in packages:
            i = packages[name]
            modules = tuple(dict.fromkeys((*out[i].impl_modules, *pack.impl_modules)))
            out[i] = pack.replace(impl_modules=modules)
            continue
        if name is not None:
            packages[name] = len(out)
        out.append(pack)
    return out


def openable(display: str) -> str:
    """The path of the rule file shown as ``display`` in messages, openable from any
    directory: a file of a labelled pack (``rules/flashmla.yaml`` of the shipped rules, or
    an installed pack's) under that pack's directory, any other name made absolute. Tools
    print it where the short name may not open (``--json``; text outside the working
    directory, as in a wheel install)."""
    for label, root in _labelled_roots():
        if display.startswith(label + "/"):
            return os.path.join(root, display[len(label) + 1:])
    return os.path.abspath(display)


def shown(display: str) -> str:
    """``display`` when it opens from the working directory (a checkout), else :func:`openable`."""
    return display if os.path.exists(display) else openable(display)


_ROOTS: list = []


def _labelled_roots() -> list[tuple[str, str]]:
    """(label, directory) of the shipped rules and the installed packs, found once."""
    if not _ROOTS:
        _ROOTS.extend((p.label, p.path) for p in (shipped_pack(), *installed_packs()) if p.label)
    return _ROOTS
