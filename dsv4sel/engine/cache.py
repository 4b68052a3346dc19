"""The compiled form on disk: the packaged artifact and the user's cache.

Two places hold compiled rule sets, read by one bounded decoder:

- the **packaged artifact** (``dsv4sel/shipped.dsv4c``), the shipped rules'
  compiled form, written at build time into the package (setup.py's build
  hook) and read from there: with only the shipped rules, ``select()``
  reads nothing a user other than the installer can write;
- the **user cache** (``$DSV4SEL_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/dsv4sel`` or ``~/.cache/dsv4sel``) for rule sets with
  packs. It is used only while the directory and each entry belong to the
  effective user and are writable by nobody else; both are opened without
  following a symbolic link, and every later operation goes through the
  directory's descriptor, so a directory renamed or replaced after the check
  is never used. Anything else is skipped, and the caller compiles.

An entry is ``MAGIC``, three big-endian 32-bit words (the JSON length, the
blob length, the CRC-32 of both parts), a JSON document and a raw blob.
The lengths are checked against the file's size before anything is read,
and JSON (unlike marshal) allocates only in proportion to the bytes present
(no claimed counts, no back-references), so an entry costs at most its size
in reads and a small multiple of it in memory. The CRC-32 catches accidental
damage only: it is no MAC, and whoever may write the cache may forge it.
What protects a reader against a forged entry is the ownership check above,
and that every value is checked again by its reader (``CompiledRules``).

The packaged artifact has the same header under :data:`ARTIFACT_MAGIC`, and
its first part is the same document in marshal (its lists as tuples, the
compiled form's shape): only the installer writes the package, and the
interpreter already trusts it with the code beside it. Decoding it is a
``marshal.loads`` instead of a JSON parse and a walk turning lists into
tuples. :func:`decode` (the user cache) never reads marshal.

Writes go to a temporary file (mode 0600) renamed into place; a failure
leaves no temporary file. A writer killed between the two leaves one, so every
write first removes the stale temporaries of earlier writers: names of the
pattern :func:`write_entry` gives them (``.NAME.PID.RANDOM.tmp``), regular
files owned by the user, whose writer process is gone or which are older than
:data:`STALE_SECONDS`. Pruning removes only entries this module wrote: names
of its own pattern, owned by the user, starting with ``MAGIC``.

A missing cache directory is created 0700, and any missing parent of it
(``~/.cache``) 0700 too, whatever the umask: the user's cache is the user's.
"""

from __future__ import annotations

import os
import stat
import zlib

_KEEP = 16  # entries kept per directory; older ones are pruned on write
#: A temporary file older than this is stale whatever its writer: writing one takes milliseconds.
STALE_SECONDS = 3600
MAGIC = b"dsv4sel-cache-3\n"
#: The packaged artifact's magic (as long as :data:`MAGIC`): its first part is marshal.
ARTIFACT_MAGIC = b"dsv4sel-pkgd-1\n\n"
_HEADER = len(MAGIC) + 12
#: The largest JSON part an entry may hold (a rule set's outcomes, rules and vocabulary).
MAX_JSON_BYTES = 8 << 20
#: The largest blob (the decision array, at most 2 bytes x 2^26 inputs, and the fingerprint).
MAX_BLOB_BYTES = (128 << 20) + (16 << 20)
#: The most JSON lists and objects an entry may hold (the shipped rules' hold ~10,000): counted
#: on the bytes before parsing, as each costs ~60 bytes of memory for 2 bytes of file.
MAX_CONTAINERS = 1 << 19
#: The deepest nesting of lists and objects an entry's JSON may hold (the compiled form needs 5).
MAX_DEPTH = 12
SUFFIX = ".dsv4c"
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)


class Entry:
    """A decoded entry: ``data`` (the JSON part, lists turned into tuples) and
    ``blob`` (a read-only memoryview of the raw part)."""

    __slots__ = ("data", "blob")

    def __init__(self, data: dict, blob: memoryview):
        self.data, self.blob = data, blob


def cache_dir() -> str:
    explicit = os.environ.get("DSV4SEL_CACHE_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "dsv4sel")


def enabled() -> bool:
    return os.environ.get("DSV4SEL_NO_CACHE", "") in ("", "0")


def _tuples(value, depth: int = 0):
    """``value`` with every JSON list as a tuple (the compiled form's shape);
    raises ValueError past :data:`MAX_DEPTH` levels."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deeply")
    kind = value.__class__
    if kind is list:
        return tuple([_tuples(v, depth + 1) for v in value])
    if kind is dict:
        return {k: _tuples(v, depth + 1) for k, v in value.items()}
    return value


def _shared(value, memo: dict):
    """``value`` with its equal strings, numbers and tuples made one object each, so that
    marshal writes a reference for every repeat (the shipped rules' artifact: 285 kB -> 112 kB,
    and reading it creates a third of the objects). Keyed by type, and a tuple by the
    identities of its (already shared) items: 1 and True, (1,) and (True,) stay apart."""
    kind = value.__class__
    if kind is dict:
        return {_shared(k, memo): _shared(v, memo) for k, v in value.items()}
    if kind is tuple:
        value = tuple([_shared(v, memo) for v in value])
        return memo.setdefault((tuple, tuple(map(id, value))), value)
    if kind in (str, int, bool) or value is None:
        return memo.setdefault((kind, value), value)
    return value


def encode(data: dict, blob: bytes = b"", packaged: bool = False) -> bytes:
    """An entry holding ``data`` (JSON-able: dicts with str keys, tuples,
    lists, str, int, bool, None) and ``blob``; with ``packaged``, the packaged
    artifact's form: the value the JSON document decodes to, in marshal."""
    import json  # the user cache's format: json costs a cold start that reads the package ~6M instructions

    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    if packaged:
        import marshal

        text = marshal.dumps(_shared(_tuples(json.loads(text)), {}), 4)
    if len(text) > MAX_JSON_BYTES or len(blob) > MAX_BLOB_BYTES:
        raise ValueError("the compiled form is larger than a cache entry holds")
    crc = zlib.crc32(blob, zlib.crc32(text))
    return b"".join((ARTIFACT_MAGIC if packaged else MAGIC, len(text).to_bytes(4, "big"),
                     len(blob).to_bytes(4, "big"), crc.to_bytes(4, "big"), text, blob))


def _lengths(header: bytes, size: int, magic: bytes = MAGIC) -> tuple[int, int] | None:
    """``(json length, blob length)`` from an entry's header, when they are
    within bounds and add up to exactly ``size`` bytes; else None."""
    if len(header) < _HEADER or not header.startswith(magic):
        return None
    n_json = int.from_bytes(header[len(MAGIC):len(MAGIC) + 4], "big")
    n_blob = int.from_bytes(header[len(MAGIC) + 4:len(MAGIC) + 8], "big")
    if n_json > MAX_JSON_BYTES or n_blob > MAX_BLOB_BYTES or _HEADER + n_json + n_blob != size:
        return None
    return n_json, n_blob


def _parts(raw: bytes, magic: bytes) -> tuple[memoryview, memoryview] | None:
    """The two parts of the entry in ``raw`` when its header and CRC-32 are intact; else None."""
    lengths = _lengths(raw[:_HEADER], len(raw), magic)
    if lengths is None:
        return None
    n_json, _ = lengths
    view = memoryview(raw)
    text, blob = view[_HEADER:_HEADER + n_json], view[_HEADER + n_json:]
    if zlib.crc32(blob, zlib.crc32(text)) != int.from_bytes(raw[len(MAGIC) + 8:_HEADER], "big"):
        return None
    return text, blob


def decode(raw: bytes) -> Entry | None:
    """The entry stored in ``raw`` (a whole entry file), or None when it is
    not an intact entry of this format. Work and memory are bounded by
    ``len(raw)``: the lengths are checked before anything is parsed."""
    parts = _parts(raw, MAGIC)
    if parts is None:
        return None
    text, blob = parts
    import json

    raw_text = bytes(text)
    if raw_text.count(b"[") + raw_text.count(b"{") > MAX_CONTAINERS:  # an over-count (strings) only refuses
        return None
    try:
        data = _tuples(json.loads(raw_text))
    except (ValueError, RecursionError, MemoryError):  # UnicodeDecodeError is a ValueError
        return None
    return Entry(data, blob.toreadonly()) if isinstance(data, dict) else None


def decode_packaged(raw: bytes) -> Entry | None:
    """The packaged artifact stored in ``raw``, or None when it is not an
    intact one (a damaged file, or marshal of another interpreter's making)."""
    import marshal

    parts = _parts(raw, ARTIFACT_MAGIC)
    if parts is None:
        return None
    text, blob = parts
    try:
        data = marshal.loads(text)
    except (ValueError, EOFError, TypeError):
        return None
    return Entry(data, blob.toreadonly()) if isinstance(data, dict) else None


def _owned(info: os.stat_result) -> bool:
    """The user's own, and writable by no one else (group and others)."""
    return info.st_uid == os.geteuid() and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _open_dir(create: bool) -> int | None:
    """A descriptor of the cache directory when it is the user's own and
    writable by no one else (created 0700 when missing and ``create``); else None."""
    directory = cache_dir()
    if create:
        _make_private(os.path.abspath(directory))
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
    except OSError:
        os.close(fd)
        return None
    if not stat.S_ISDIR(info.st_mode) or not _owned(info):
        os.close(fd)
        return None
    return fd


def _make_private(directory: str) -> None:
    """Create ``directory`` and every missing parent of it with mode 0700 (os.makedirs
    would give the parents 0777 less the umask: 0777 itself under umask 000). One that
    exists is left as it is; the directory itself is checked when opened."""
    missing = []
    path = directory
    while path and not os.path.lexists(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # mkdir's mode is masked by the umask; this one is not
        except OSError:
            return  # exists already (made meanwhile: checked when opened), or cannot be made: skipped


def _read_at(dir_fd: int | None, path: str, owned: bool) -> Entry | None:
    """Read and decode one entry (``path`` relative to ``dir_fd``), refusing a
    link, anything but a regular file, a size the header does not account
    for and, with ``owned``, a file that is not the user's own or that
    others may write. Without ``owned`` (the package's), the packaged form."""
    magic = MAGIC if owned else ARTIFACT_MAGIC
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (owned and not _owned(info)):
            return None
        size = info.st_size
        if size > _HEADER + MAX_JSON_BYTES + MAX_BLOB_BYTES:
            return None
        with os.fdopen(fd, "rb", closefd=False) as fh:
            if _lengths(fh.read(_HEADER), size, magic) is None:
                return None
            fh.seek(0)
            raw = fh.read(size + 1)
    except (OSError, MemoryError):
        return None
    finally:
        os.close(fd)
    if len(raw) != size:
        return None
    return decode(raw) if owned else decode_packaged(raw)


def read_packaged(path: str) -> Entry | None:
    """The artifact at ``path`` inside the installed package, or None when it
    is missing or not intact (the caller compiles then)."""
    return _read_at(None, path, owned=False)


def read_entry(name: str) -> Entry | None:
    """The user-cache entry ``name``, or None when missing, damaged, or not
    trusted (see the module docstring)."""
    if not enabled():
        return None
    dir_fd = _open_dir(create=False)
    if dir_fd is None:
        return None
    try:
        return _read_at(dir_fd, name + SUFFIX, owned=True)
    finally:
        os.close(dir_fd)


def write_file(path: str, raw: bytes) -> None:
    """Write the bytes of an entry to ``path`` (the build hook's packaged artifact); raises on failure."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as fh:
        fh.write(raw)
    os.replace(tmp, path)


def write_entry(name: str, data: dict, blob: bytes = b"", prune: bool = False) -> None:
    """Store entry ``name`` in the user cache atomically; never raises for a
    cache that cannot (or must not) be written, and leaves no temporary file."""
    if not enabled():
        return
    dir_fd = _open_dir(create=True)
    if dir_fd is None:
        return
    tmp = None
    try:
        _remove_stale_temporaries(dir_fd)
        raw = encode(data, blob)
        tmp = f".{name}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=dir_fd)
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
        os.replace(tmp, name + SUFFIX, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        tmp = None
        if prune:
            _prune(dir_fd, name + SUFFIX)
    except (OSError, ValueError, TypeError):  # ValueError/TypeError: not JSON-able, or too large
        pass
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError:
                pass
        os.close(dir_fd)


def _temporary_writer(name: str) -> int | None:
    """The writer's process id in a temporary file name :func:`write_entry` gives
    (``.NAME.PID.RANDOM.tmp``: NAME an entry's eight hex digits, RANDOM eight more), else None."""
    parts = name.split(".")
    if (len(parts) != 5 or parts[0] or parts[4] != "tmp" or not _is_entry_name(parts[1] + SUFFIX)
            or not parts[2].isdigit() or not parts[2].isascii() or not _is_entry_name(parts[3] + SUFFIX)):
        return None
    pid = int(parts[2])
    return pid if pid > 0 else None


def _gone(pid: int) -> bool:
    """Whether no process ``pid`` runs here (one of another user still counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError, ValueError):
        return False
    return False


def _remove_stale_temporaries(dir_fd: int) -> None:
    """Remove the temporary files of writers killed between writing and renaming (see the
    module docstring): only names of :func:`write_entry`'s pattern, regular files owned by
    the user, whose writer is gone or that are older than :data:`STALE_SECONDS`."""
    import time

    now = time.time()
    with os.scandir(dir_fd) as it:
        for e in it:
            pid = _temporary_writer(e.name)
            if pid is None:
                continue
            try:
                info = e.stat(follow_symlinks=False)
                if (stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid()
                        and (now - info.st_mtime > STALE_SECONDS or _gone(pid))):
                    os.unlink(e.name, dir_fd=dir_fd)
            except OSError:
                continue


def _is_entry_name(name: str) -> bool:
    """The names :func:`write_entry` gives: eight lowercase hex digits and :data:`SUFFIX`."""
    stem = name[:-len(SUFFIX)]
    return name.endswith(SUFFIX) and len(stem) == 8 and all(c in "0123456789abcdef" for c in stem)


def _prune(dir_fd: int, keep: str) -> None:
    """Remove all but the newest :data:`_KEEP` entries this module wrote.

    Only names of the entry pattern, regular files owned by the user and
    starting with :data:`MAGIC` count; ``keep`` (just written) is never
    removed. A modification time in the future counts as now, so a planted
    (or clock-skewed) entry cannot push the fresh one out at every start."""
    import time

    now = time.time()
    found = []
    with os.scandir(dir_fd) as it:
        for e in it:
            if not _is_entry_name(e.name) or e.name == keep:
                continue
            try:
                info = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                continue
            found.append((min(info.st_mtime, now), e.name))
    found.sort(reverse=True)
    for _, stale in found[_KEEP - 1:]:
        try:
            fd = os.open(stale, os.O_RDONLY | _NOFOLLOW | _NONBLOCK, dir_fd=dir_fd)
            try:
                ours = os.read(fd, len(MAGIC)) == MAGIC
            finally:
                os.close(fd)
            if ours:
                os.unlink(stale, dir_fd=dir_fd)
        except OSError:
            pass
