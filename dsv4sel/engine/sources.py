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

One load (all packs together) is bounded as a whole, as each file is by the
loader: at most :data:`MAX_LOAD_FILES` files and :data:`MAX_LOAD_BYTES`
bytes (checked on the listing, before any file is read, here and by the
fingerprint) and :data:`MAX_LOAD_NODES` YAML nodes (counted while loading,
:func:`dsv4sel.engine.build.load_and_validate`). Past one, the load is
refused with one DSV110 problem naming the bound and the measured value.
"""

from __future__ import annotations

import os

from .._version import __version__
from ..errors import Problem
from ..record import Frozen
from .entrypoints import ENTRY_POINT_GROUP, declared_packs, is_module_path, not_a_pack, package_dir, read_bytes
from .text import escape

RULE_SUFFIXES = (".yaml", ".yml")

#: Bounds on one load, all packs together. Loading, validating and compiling cost about the
#: same per YAML node, so these bound the work of a cold ``select()`` and of ``check``; the
#: shipped rules with the example pack, and each compat set, hold under a tenth of each, and
#: all of them loaded together under a fifth (tests/product/test_hostile_load.py).
MAX_LOAD_FILES = 256
MAX_LOAD_BYTES = 4 << 20
MAX_LOAD_NODES = 100_000


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

    __slots__ = ("name", "path", "impl_modules", "label", "problem", "line")
    _defaults = {"impl_modules": (), "label": None, "problem": None, "line": 1}
    name: str
    path: str
    impl_modules: tuple[str, ...]
    label: str | None
    problem: str | None
    line: int

    def sources(self) -> list["Source"]:
        """The pack's rule files; for a pack that cannot be loaded (``problem``
        set, e.g. a broken installed declaration), one Source refused with that
        problem at ``path``:``line``."""
        if self.problem is not None:
            return [Source(self.path, _display(self.path, None, None), self.name, self.problem, self.line)]
        return expand(self.path, self.name, self.label)


class Source(Frozen):
    """One rule file: ``path`` on disk, ``display`` in messages, the ``pack``
    it belongs to, and ``unreadable``: why the file (or its pack's directory)
    cannot be read, found while listing it, or None (reported at ``line``
    with ``code``)."""

    __slots__ = ("path", "display", "pack", "unreadable", "line", "code")
    _defaults = {"pack": "dsv4sel", "unreadable": None, "line": 1, "code": "DSV101"}
    path: str
    display: str
    pack: str
    unreadable: str | None
    line: int
    code: str


def shipped_rules_dir() -> str:
    """The directory of the shipped rules: package data ``dsv4sel/rules`` when
    installed from a wheel, the repository's ``rules/`` in a checkout or an
    editable install."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the dsv4sel package
    for candidate in (os.path.join(here, "rules"), os.path.join(os.path.dirname(here), "rules")):
        if os.path.isfile(os.path.join(candidate, "vocabulary.yaml")):
            return candidate
    raise RuntimeError(f"dsv4sel is installed without its rules: no rules/vocabulary.yaml next to {here}")


def printable_path(path: str) -> str:
    """``path`` as text any output can take: the bytes of a name that is not UTF-8 (which
    Python keeps as lone surrogates, ``\\udcff``) written as ``\\xff``, control characters
    escaped. A file name is as untrusted as the file."""
    return escape(path.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace"))


def _display(path: str, root: str | None, root_label: str | None) -> str:
    """A file's name in messages (:func:`printable_path`)."""
    if root is not None and root_label is not None:
        return printable_path(f"{root_label}/{os.path.relpath(path, root)}")
    rel = os.path.relpath(path)
    return printable_path(path if rel.startswith("..") else rel)


def expand(path: str, pack: str = "dsv4sel", root_label: str | None = None) -> list[Source]:
    """The rule files at ``path``: the file itself, or a directory's ``*.yaml``
    files in name order. A missing path yields one Source whose read fails
    later with a located problem; a directory without rule files, one Source
    refused with :func:`no_rule_files` (DSV306): a pack that is empty is a
    mistake (a wrong path), never an empty pack."""
    if os.path.isdir(path):
        try:
            listed = os.listdir(path)
        except OSError as exc:
            return [Source(path, _display(path, None, None), pack,
                           f"cannot list the rule directory: {escape(exc.strerror or str(exc))}")]
        names = sorted(n for n in listed if _is_rule_file_name(n))
        if not names:
            return [Source(path, _display(path, None, None), pack, no_rule_files(path), code="DSV306")]
        return [Source(os.path.join(path, n), _display(os.path.join(path, n), path, root_label), pack)
                for n in names]
    return [Source(path, _display(path, None, None), pack)]


def _is_rule_file_name(name: str) -> bool:
    return name.endswith(RULE_SUFFIXES) and not name.startswith(".")


#: How many entries of a directory without rule files are looked into for a ``rules/`` folder.
_HINT_SCAN = 64


def no_rule_files(path: str) -> str:
    """Why the directory ``path`` is no pack: it holds no rule files. When a folder
    below it does (``DIR/rules``, or ``DIR/PACKAGE/rules`` at a pack's project root),
    the message names it: the usual mistake is naming the folder above a pack's rules."""
    message = f"no rule files (*.yaml, *.yml) in directory {printable_path(path)}"
    below = _rules_below(path)
    return message + (f"; did you mean {printable_path(below)}?" if below else
                      "; a pack is the directory that holds its rule files")


def _rules_below(path: str) -> str | None:
    """``path/rules`` or ``path/NAME/rules`` (the first by name) when it holds rule files."""
    try:
        names = sorted(os.listdir(path))[:_HINT_SCAN]
    except OSError:
        return None
    for candidate in (os.path.join(path, "rules"),
                      *(os.path.join(path, n, "rules") for n in names if not n.startswith("."))):
        try:
            if any(_is_rule_file_name(n) for n in os.listdir(candidate)):
                return candidate
        except OSError:
            continue
    return None


def shipped_pack() -> Pack:
    return Pack("dsv4sel", shipped_rules_dir(), (), "rules")


def shipped_sources() -> list[Source]:
    return shipped_pack().sources()


def directory_pack(path: str) -> Pack:
    """A pack from a directory (or file) named on the command line or in the environment."""
    parts = os.path.normpath(os.path.abspath(path)).split(os.sep)
    # a pack's YAML usually sits in a folder named `rules`; the folder above names the pack
    name = parts[-2] if parts[-1] == "rules" and len(parts) > 1 else parts[-1]
    return Pack(printable_path(os.path.splitext(name)[0] or path), path)


def installed_packs() -> list[Pack]:
    """Packs of installed distributions (entry point group ``dsv4sel.rules``).

    Found from installed metadata alone: the ``entry_points.txt`` files on
    the import path name each pack's package, whose directory is located
    without importing it, so no code of an installed distribution runs
    during discovery (an ``__init__.py`` that raises or calls ``sys.exit``
    cannot stop ``select()``). Nothing of this is cached: the packs, and the
    impl modules they allow, always follow the installed distributions.

    A declaration that cannot be a pack (a package that is not found, a
    standard-library package, one entry-point name declared by two
    distributions, an ``entry_points.txt`` that mentions the group but is not
    valid INI) becomes a pack whose one source is refused with a problem
    located at that distribution's ``entry_points.txt``."""
    declared = declared_packs()
    # an entry_points.txt that cannot be read: one refused pack, named after its distribution
    packs = [Pack(name, where, (), name, problem, line)
             for name, _module, _folder, where, line, _entry, problem in declared if problem is not None]
    by_name: dict[str, list] = {}
    for item in declared:
        if item[6] is None:
            by_name.setdefault(item[0], []).append(item)
    for name in sorted(by_name):
        items = by_name[name]
        _, module, folder, where, line, entry, problem = items[0]
        if len(items) > 1:
            problem = (f"entry point {name!r} of group {ENTRY_POINT_GROUP} is declared by "
                       + " and by ".join(escape(i[2]) for i in items)
                       + ": two packs cannot share one name; uninstall one of the distributions")
        elif not is_module_path(module):
            problem = f"entry point {escape(name)} = {escape(module)}: not a dotted package name"
        else:
            problem = not_a_pack(module)
            if problem is None:
                path = package_dir(module, entry)
                if path is None:
                    problem = (f"entry point {escape(name)} = {module}: package not found "
                               f"(is {escape(folder)} installed whole?)")
                else:
                    packs.append(Pack(name, path, (module.split(".")[0],), name))
                    continue
        packs.append(Pack(name, where, (), name, problem, line))
    return packs


def load_bound_problem(sources: list[Source]) -> Problem | None:
    """The DSV110 problem of a load of ``sources`` with more than :data:`MAX_LOAD_FILES`
    files or :data:`MAX_LOAD_BYTES` bytes in all (sizes from the listing: nothing is read),
    located at the first file past the bound; None within both."""
    if len(sources) > MAX_LOAD_FILES:
        return Problem(sources[MAX_LOAD_FILES].display, 1, 1,
                       f"{len(sources):,} rule files in one load; a load reads at most {MAX_LOAD_FILES:,} files "
                       f"(this is file {MAX_LOAD_FILES + 1:,}): {split_or_raise('MAX_LOAD_FILES')}", code="DSV110")
    sizes = [_size(s) for s in sources]
    if sum(sizes) <= MAX_LOAD_BYTES:
        return None
    from itertools import accumulate

    crossing = next(src for src, running in zip(sources, accumulate(sizes)) if running > MAX_LOAD_BYTES)
    return Problem(crossing.display, 1, 1,
                   f"the rule files hold {sum(sizes):,} bytes in all; a load reads at most {MAX_LOAD_BYTES:,} "
                   f"(this file crosses it): {split_or_raise('MAX_LOAD_BYTES')}", code="DSV110")


def _size(src: Source) -> int:
    """The size of a rule file as listed (0 for one that cannot be read: it is reported when read)."""
    try:
        return os.stat(src.path).st_size if src.unreadable is None else 0
    except OSError:
        return 0


def split_or_raise(bound: str) -> str:
    """How to get under a bound of one load: what every DSV110 message ends with."""
    return ("load only the packs this process needs (DSV4SEL_RULES_PATH, --rules), split the rules into "
            f"rule sets loaded by separate processes, or raise dsv4sel.engine.sources.{bound}")


def environment_packs() -> list[Pack]:
    value = os.environ.get(RULES_PATH_ENV, "")
    return [directory_pack(p) for p in value.split(os.pathsep) if p.strip()]


def environment_allowed_modules() -> tuple[str, ...]:
    """The modules ``DSV4SEL_ALLOW_IMPL_MODULES`` allows (empty when unset). Each must be a dotted
    Python module name (``my_pack.kernels``, :func:`~dsv4sel.engine.values.allowed_module_problem`,
    as for every way in); anything else is one :class:`RuleError` naming the variable, so a typo
    never silently allows nothing, or something else."""
    from ..errors import Problem, RuleError
    from .values import allowed_module_problem

    names = tuple(part.strip() for part in os.environ.get(ALLOW_IMPL_ENV, "").split(",") if part.strip())
    for name in names:
        problem = allowed_module_problem(name)
        if problem is not None:
            raise RuleError([Problem(f"${ALLOW_IMPL_ENV}", 1, 1, f"{ALLOW_IMPL_ENV}: {problem} (comma-separated)",
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


def fingerprint(sources: list[Source], extra: tuple[str, ...] = (), code: tuple[str, ...] = ()) -> tuple:
    """Everything a compiled table depends on, exactly: the version, ``extra``
    (the allow-list), and the bytes of the engine's modules, of the domain's
    files ``code`` (its profile and rule schema) and of every rule file with
    its name and pack (not its absolute path: the packaged artifact is
    compiled in the build directory and read where the package is
    installed). A cached table is current only when its fingerprint equals
    this one, so an edit is seen even when the file keeps its size and mtime
    (``touch -d``, ``cp -p``, ``rsync -a``, fixed-mtime builds). Reading ~20
    small files costs well under a millisecond. A load past the files or bytes
    bound (:func:`load_bound_problem`) raises RuleError before any file is read."""
    problem = load_bound_problem(sources)
    if problem is not None:
        from ..errors import RuleError

        raise RuleError([problem])
    return (__version__, tuple(extra), tuple(read_bytes(path) for path in (*compiler_files(), *code)),
            tuple((s.display, s.pack, read_bytes(s.path)) for s in sources))


def fingerprint_bytes(sources: list[Source], extra: tuple[str, ...] = (), code: tuple[str, ...] = ()) -> bytes:
    """:func:`fingerprint` as one byte string (every part length-prefixed, so
    no two fingerprints share one encoding): what a cache entry stores and
    is compared with."""
    version, allowed, compiler, files = fingerprint(sources, extra, code)
    parts: list[bytes] = [version.encode(), *(a.encode() for a in allowed), b"--"]
    parts.extend(b"\xff" if c is None else b"=" + c for c in compiler)
    for display, pack, data in files:
        parts.extend((display.encode("utf-8", "surrogateescape"), pack.encode("utf-8", "surrogateescape"),
                      b"\xff" if data is None else b"=" + data))
    return b"".join(len(p).to_bytes(8, "big") + p for p in parts)


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
    for display, pack, data in files:
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
