"""Where rule files come from, what they are called in messages, and the
content hash that keys the compiled cache."""

from __future__ import annotations

import os

from . import __version__
from .record import Frozen

RULE_SUFFIXES = (".yaml", ".yml")


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


def shipped_sources() -> list[Source]:
    return expand(shipped_rules_dir(), "dsv4sel", "rules")


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
