"""The on-disk cache of compiled rule sets and installed-pack scans.

marshal is in the interpreter core, so a warm start neither parses YAML nor
imports yaml or jsonschema. The cache directory is untrusted, like a rule
file: a damaged, truncated or hand-edited entry must never change a decision
or crash a later ``select()``. Hence:

- every entry is ``MAGIC + CRC-32 of the body + marshal body``; an entry
  whose checksum fails is ignored (and rebuilt by the caller). CRC-32 finds
  every single-byte change and every burst of up to 32 bits;
- what an entry holds is checked again by its reader (``RuleSet`` checks a
  compiled table's shape and that every impl lies inside the allow-list
  the *process* was configured with; the allow-list is never read from here);
- only regular files of bounded size are read;
- a write goes to a temporary file that is renamed into place, and is
  removed again when anything fails (a full disk leaves no ``.tmp``).

A cache that cannot be read or written is skipped (read-only homes,
sandboxes): the caller compiles instead.
"""

from __future__ import annotations

import marshal
import os
import stat
import zlib

_KEEP = 16  # table entries kept per directory; older ones are pruned on write
_MAGIC = b"dsv4sel-cache-2\n"
_HEADER = len(_MAGIC) + 4
_MAX_ENTRY_BYTES = 256 << 20
_SUFFIX = ".marshal"


def cache_dir() -> str:
    explicit = os.environ.get("DSV4SEL_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dsv4sel")


def enabled() -> bool:
    return os.environ.get("DSV4SEL_NO_CACHE", "") in ("", "0")


def entry_path(name: str) -> str:
    return os.path.join(cache_dir(), name + _SUFFIX)


def decode(raw: bytes) -> dict | None:
    """The dict stored in ``raw`` (a whole entry file), or None when it is not
    an intact entry."""
    if len(raw) < _HEADER or not raw.startswith(_MAGIC):
        return None
    body = memoryview(raw)[_HEADER:]
    if zlib.crc32(body) != int.from_bytes(raw[len(_MAGIC):_HEADER], "big"):
        return None
    try:
        data = marshal.loads(body)
    except (EOFError, ValueError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def encode(data: dict) -> bytes:
    body = marshal.dumps(data)
    return _MAGIC + zlib.crc32(body).to_bytes(4, "big") + body


def read_entry(name: str) -> dict | None:
    """The entry ``name``, or None when missing, unreadable or damaged."""
    if not enabled():
        return None
    try:
        fd = os.open(entry_path(name), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > _MAX_ENTRY_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            raw = fh.read(_MAX_ENTRY_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return decode(raw)


def write_entry(name: str, data: dict, prune: bool = False) -> None:
    """Store ``data`` as entry ``name`` atomically; never raises for a cache
    that cannot be written, and leaves no temporary file behind."""
    if not enabled():
        return
    import tempfile  # ~6 ms of imports; only a cache miss pays it

    directory = cache_dir()
    tmp = None
    try:
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "wb") as fh:
            fh.write(encode(data))
        os.replace(tmp, entry_path(name))
        tmp = None
        if prune:
            _prune(directory)
    except (OSError, ValueError):  # ValueError: marshal cannot store the value
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _prune(directory: str) -> None:
    entries = sorted((e for e in os.scandir(directory) if e.name.endswith(_SUFFIX)),
                     key=lambda e: e.stat().st_mtime, reverse=True)
    for stale in entries[_KEEP:]:
        os.unlink(stale.path)
