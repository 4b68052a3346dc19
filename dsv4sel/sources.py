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

from . import __version__
from .record import Frozen

RULE_SUFFIXES = (".yaml", ".yml")


ENTRY_POINT_GROUP = "dsv4sel.rules"
RULES_PATH_ENV = "DSV4SEL_RULES_PATH"


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
    """One rule file: ``path`` on disk, ``display`` in messages, the ``pack`` it belongs to."""

    __slots__ = ("path", "display", "pack")
    _defaults = {"pack": "dsv4sel"}


def shipped_rules_dir() -> str:
    """The directory of the shipped rules: package data ``dsv4sel/rules`` when
    installed from a wheel, the repository's ``rules/`` in a checkout or an
    editable install."""
    here = os.path.dirname(os.path.abspath(__file__))
    for candidate in (os.path.join(here, "rules"), os.path.join(os.path.dirname(here), "rules")):
        if os.path.isfile(os.path.join(candidate, "vocabulary.yaml")):
            return candidate
    raise RuntimeError(f"dsv4sel is installed without its rules: no rules/vocabulary.yaml next to {here}")


def _display(path: str, root: str | None, root_label: str | None) -> str:
    if root is not None and root_label is not None:
        return f"{root_label}/{os.path.relpath(path, root)}"
    rel = os.path.relpath(path)
    return path if rel.startswith("..") else rel


def expand(path: str, pack: str = "dsv4sel", root_label: str | None = None) -> list[Source]:
    """The rule files at ``path``: the file itself, or a directory's ``*.yaml``
    files in name order. A missing path yields one Source whose read fails
    later with a located problem."""
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if n.endswith(RULE_SUFFIXES) and not n.startswith("."))
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


def _path_stamp() -> tuple:
    """mtimes of the import path: installing or removing a distribution adds or
    removes a ``*.dist-info`` entry, which changes its directory's mtime."""
    import sys

    out = []
    for entry in sys.path:
        try:
            out.append((entry, os.stat(entry or ".").st_mtime_ns))
        except OSError:
            continue
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

    Scanning distributions costs ~20 ms of imports, so the result is cached
    and reused while the import path's directories are unchanged."""
    from . import cache

    key = _path_stamp()
    entry = cache.read_entry("installed-packs")
    if entry is not None and entry.get("key") == key:
        found = entry["packs"]
    else:
        found = _scan_entry_points()
        cache.write_entry("installed-packs", {"key": key, "packs": found})
    return [Pack(name, path, tuple(modules), label) for name, path, modules, label in found]


def environment_packs() -> list[Pack]:
    value = os.environ.get(RULES_PATH_ENV, "")
    return [directory_pack(p) for p in value.split(os.pathsep) if p.strip()]


def default_packs() -> list[Pack]:
    """The rule set ``dsv4sel.select()`` uses: shipped, installed, then environment packs."""
    return [shipped_pack(), *installed_packs(), *environment_packs()]


# The stages that turn YAML into the compiled table: editing any of them must
# invalidate cached tables even when the version string stays the same.
_COMPILER_FILES = ("schema/rules.schema.json", "load.py", "validate.py", "compile.py")


def _stat(path: str) -> tuple[int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1)
    return (st.st_size, st.st_mtime_ns)


def stamp(sources: list[Source], extra: tuple[str, ...] = ()) -> tuple:
    """Cheap validity stamp (names, sizes, mtimes), like a .pyc's: equal stamps
    mean the cached table is current without reading or hashing any file."""
    here = os.path.dirname(__file__)
    return (__version__, tuple(extra),
            tuple((name, *_stat(os.path.join(here, name))) for name in _COMPILER_FILES),
            tuple((s.display, s.pack, s.path, *_stat(s.path)) for s in sources))


def entry_name(stamp_: tuple) -> str:
    """Cache file name for a set of sources: the same files share one entry."""
    import zlib

    identity = repr((stamp_[0], stamp_[1], [entry[:3] for entry in stamp_[3]]))
    return f"{zlib.crc32(identity.encode()):08x}"


def content_hash(sources: list[Source], extra: tuple[str, ...] = ()) -> str:
    """SHA-256 of everything that changes the compiled result: version, schema,
    compiler, allow-list and the name, pack and bytes of every rule file."""
    import hashlib  # ~4 ms (OpenSSL); only paid when stamps disagree

    h = hashlib.sha256()
    h.update(__version__.encode())
    here = os.path.dirname(__file__)
    for name in _COMPILER_FILES:
        with open(os.path.join(here, name), "rb") as fh:
            h.update(fh.read())
    for item in extra:
        h.update(b"\0x" + item.encode())
    for src in sources:
        h.update(b"\0f" + src.display.encode() + b"\0" + src.pack.encode() + b"\0")
        try:
            with open(src.path, "rb") as fh:
                h.update(fh.read())
        except OSError:
            h.update(b"<unreadable>")
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
