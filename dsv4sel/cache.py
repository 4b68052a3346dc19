"""The compiled-rules cache: ``Program.to_table()`` data stored with marshal.

marshal is in the interpreter core, so a warm start neither parses YAML nor
imports yaml or jsonschema. Each entry stores the stamp (sizes and mtimes)
and the content hash of what it was compiled from; :func:`dsv4sel.load_rules`
trusts an entry only when one of them matches. A cache that cannot be written
is silently skipped (read-only homes, sandboxes).
"""

from __future__ import annotations

import marshal
import os

_KEEP = 16  # entries kept per directory; older ones are pruned on write


def cache_dir() -> str:
    explicit = os.environ.get("DSV4SEL_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dsv4sel")


def enabled() -> bool:
    return os.environ.get("DSV4SEL_NO_CACHE", "") in ("", "0")


def read_entry(name: str) -> dict | None:
    """The entry ``name``, or None when missing, unreadable or corrupt."""
    if not enabled():
        return None
    try:
        with open(os.path.join(cache_dir(), name + ".marshal"), "rb") as fh:
            data = marshal.loads(fh.read())  # load(fh) reads object by object: ~10x slower
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def read(name: str) -> dict | None:
    """A compiled table entry, or None when missing, unreadable or corrupt."""
    data = read_entry(name)
    return data if data is not None and "digest" in data and "stamp" in data else None


def write(name: str, data: dict) -> None:
    """Store a compiled table (pruning old ones)."""
    write_entry(name, data, prune=True)


def write_entry(name: str, data: dict, prune: bool = False) -> None:
    if not enabled():
        return
    import tempfile  # ~6 ms of imports; only a cache miss pays it

    directory = cache_dir()
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            marshal.dump(data, fh)
        os.replace(tmp, os.path.join(directory, name + ".marshal"))
        if not prune:
            return
        entries = sorted((e for e in os.scandir(directory) if e.name.endswith(".marshal")),
                         key=lambda e: e.stat().st_mtime, reverse=True)
        for stale in entries[_KEEP:]:
            os.unlink(stale.path)
    except OSError:
        pass
