"""What the installed distributions declare: the packs of entry-point group ``dsv4sel.rules``.

Read from installed metadata alone, never through ``importlib.metadata`` (its
import costs the cold start ~20 ms) and without importing any package: the
``entry_points.txt`` files on the import path are scanned as directory
listings, and a pack's package directory is located without running its
code. :func:`dsv4sel.engine.sources.installed_packs` turns what is found here
into packs.
"""

from __future__ import annotations

import os

ENTRY_POINT_GROUP = "dsv4sel.rules"

# a rule file larger than the loader's limit fails to load anyway; reading a
# little past it keeps a /dev/zero link from filling memory here
MAX_READ_BYTES = 1 << 20


#: One declaration: (entry-point name, module, distribution folder, its entry_points.txt, line,
#: path entry, problem). ``problem`` is None, or why the file declares nothing readable.
Declaration = tuple[str, str, str, str, int, str, "str | None"]


def declared_packs() -> list[Declaration]:
    """Every pack declaration on the import path (see :func:`declared`)."""
    return declared(entry_point_metadata())


def entry_point_metadata() -> tuple:
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
            text = read_bytes(os.path.join(entry or ".", name, "entry_points.txt"))
            if text is not None and group in text:
                declared.append((name, text))
        out.append((entry, tuple(names), tuple(declared)))
    return tuple(out)


def _dist_name(folder: str) -> str:
    """The normalized distribution name of a ``NAME-VERSION.dist-info`` folder
    (PEP 503: case and runs of ``-_.`` do not count)."""
    name = folder.rsplit(".", 1)[0].split("-", 1)[0]
    return "".join("_" if c in "-_." else c for c in name.lower()).replace("__", "_")


def declared(key: tuple) -> list[Declaration]:
    """``(entry-point name, module, distribution, entry_points.txt path, line, path entry,
    None)`` for each pack that the metadata ``key`` (see :func:`entry_point_metadata`)
    declares, read as importlib.metadata reads it: an INI file of ``[group]``
    headers and ``name = module[:attr]`` lines, the first distribution of a
    name on the path shadowing later copies of it. An ``entry_points.txt`` that
    mentions the group but is not valid INI gives one declaration named after
    its distribution, with the reason as its problem: its packs cannot be read,
    and silently dropping them would serve a decision without them."""
    if not any(declared for _entry, _names, declared in key):
        return []  # no pack installed: spare the cold start configparser's import
    import configparser

    out: list[Declaration] = []
    seen: set[str] = set()
    for entry, _names, declared in key:
        for folder, text in declared:
            dist = _dist_name(folder)
            if dist in seen:
                continue  # a second copy of one distribution further down the path is shadowed
            seen.add(dist)
            parser = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            # entry-point names are case-sensitive; configparser documents assigning optionxform
            # for that, which typeshed's method type does not allow
            parser.optionxform = str  # type: ignore[assignment,method-assign]
            decoded = text.decode("utf-8", "replace")
            where = os.path.join(entry or ".", folder, "entry_points.txt")
            try:
                parser.read_string(decoded)
            except configparser.Error as exc:
                out.append((dist, "", folder, where, _error_line(exc), entry or ".", _not_ini(exc)))
                continue
            if not parser.has_section(ENTRY_POINT_GROUP):
                continue
            lines = decoded.splitlines()
            for name, value in parser.items(ENTRY_POINT_GROUP):
                line = next((i + 1 for i, t in enumerate(lines)
                             if t.split("=", 1)[0].strip() == name and "=" in t), 1)
                out.append((name, value.split(":")[0].strip(), folder, where, line, entry or ".", None))
    return out


def _error_line(exc: Exception) -> int:
    """The line configparser's error names (a ParsingError lists its bad lines), else 1."""
    line = getattr(exc, "lineno", None)
    errors = getattr(exc, "errors", None)
    if line is None and errors:
        line = errors[0][0]
    return line if isinstance(line, int) and line > 0 else 1


def _not_ini(exc: Exception) -> str:
    """Why an entry_points.txt that mentions the group cannot be read, in one line."""
    import configparser

    from .text import escape

    if isinstance(exc, configparser.MissingSectionHeaderError):
        reason = "a line before any [section] header"
    elif isinstance(exc, configparser.DuplicateSectionError):
        reason = f"section [{escape(str(exc.section))}] twice"
    elif isinstance(exc, configparser.DuplicateOptionError):
        reason = f"{escape(str(exc.option))!r} twice in section [{escape(str(exc.section))}]"
    elif isinstance(exc, configparser.ParsingError):
        reason = "a line that is neither a [section] header nor name = value"
    else:
        reason = type(exc).__name__
    return (f"this entry_points.txt mentions {ENTRY_POINT_GROUP} but is not valid INI ({reason}), so the "
            "rule packs it declares cannot be read; reinstall the distribution or fix the file")


def is_module_path(module: str) -> bool:
    return bool(module) and all(part.isidentifier() for part in module.split("."))


def package_dir(module: str, entry: str) -> str | None:
    """The directory of package ``module``, found without importing anything:
    first under the distribution's own path entry ``entry``, then through the
    finders of the top-level name (an editable install's). ``find_spec`` of a
    top-level name runs no code of the package; only a dotted name would
    import its parents, so the rest of the path is walked as directories."""
    parts = module.split(".")
    here = os.path.join(entry, *parts)
    if os.path.isdir(here):
        return here
    from importlib.util import find_spec

    try:
        spec = find_spec(parts[0])
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or ()) if spec is not None else ():
        candidate = os.path.join(location, *parts[1:])
        if os.path.isdir(candidate):
            return candidate
    return None


def not_a_pack(module: str) -> str | None:
    """Why the top-level package of ``module`` may not be a pack's (its
    modules join the impl allow-list), or None."""
    import sys

    top = module.split(".")[0]
    if top in getattr(sys, "stdlib_module_names", ()) or top in sys.builtin_module_names:
        return f"{top} is a standard-library module; a pack's rules live in the pack's own package"
    if top == __name__.split(".")[0]:
        return f"{top} is dsv4sel itself; a pack's rules live in the pack's own package"
    return None


def read_bytes(path: str) -> bytes | None:
    """The first bytes of a regular file, or None for anything else: a FIFO
    must not block the fingerprint, nor a link to /dev/zero fill memory (the
    loader then reports the file)."""
    import stat

    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        return _read_upto(fd, info.st_size, MAX_READ_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read_upto(fd: int, size: int, limit: int) -> bytes:
    """The first ``limit`` bytes of ``fd`` (all of it when shorter). The first read asks for
    ``size`` (fstat's) and one byte more, so a small file costs a buffer of its own size, not
    one of ``limit`` (a file object's ``read(limit)`` maps and unmaps a megabyte per file);
    a file that grew since is read on to the limit."""
    parts = []
    total = 0
    want = min(size + 1, limit)
    while want > 0:
        chunk = os.read(fd, want)
        if not chunk:
            break
        parts.append(chunk)
        total += len(chunk)
        want = min(max(want, 1 << 16), limit - total)
    return parts[0] if len(parts) == 1 else b"".join(parts)


# a rule file larger than the loader's limit fails to load anyway; reading a
# little past it keeps a /dev/zero link from filling memory here
MAX_READ_BYTES = 1 << 20
