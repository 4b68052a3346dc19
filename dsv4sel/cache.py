"""The compiled-rules cache: ``Program.to_table()`` data stored with marshal.

marshal is in the interpreter core, so a warm start neither parses YAML nor
imports yaml or jsonschema. Entries are keyed by the content hash of the rule
files, schema, compiler and version, so a stale entry is never read; a cache
that cannot be written is silently skipped (read-only homes, sandboxes).
"""

from __future__ import annotations

import marshal
import os
import tempfile

_KEEP = 16  # entries kept per directory; older ones are pruned on write


def cache_dir() -> str:
    explicit = os.environ.get("DSV4SEL_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dsv4sel")


def enabled() -> bool:
    return os.environ.get("DSV4SEL_NO_CACHE", "") in ("", "0")


def read(digest: str) -> dict | None:
    if not enabled():
        return None
    try:
        with open(os.path.join(cache_dir(), digest + ".marshal"), "rb") as fh:
            data = marshal.load(fh)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return data if isinstance(data, dict) and data.get("digest") == digest else None


def write(digest: str, data: dict) -> None:
    if not enabled():
        return
    directory = cache_dir()
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            marshal.dump({**data, "digest": digest}, fh)
        os.replace(tmp, os.path.join(directory, digest + ".marshal"))
        entries = sorted((e for e in os.scandir(directory) if e.name.endswith(".marshal")),
                         key=lambda e: e.stat().st_mtime, reverse=True)
        for stale in entries[_KEEP:]:
            os.unlink(stale.path)
    except OSError:
        pass
