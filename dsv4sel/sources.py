"""Where rule files come from, what they are called in messages, and the
content hash that keys the compiled cache."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass

from . import __version__

RULE_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True, slots=True)
class Source:
    """One rule file: ``path`` on disk, ``display`` in messages, the ``pack`` it belongs to."""

    path: str
    display: str
    pack: str = "dsv4sel"


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


def content_hash(sources: list[Source], extra: tuple[str, ...] = ()) -> str:
    """Hash of everything that changes the compiled result: package version,
    schema, compiler and the name, pack and bytes of every rule file."""
    h = hashlib.sha256()
    h.update(__version__.encode())
    here = os.path.dirname(__file__)
    # the stages that turn YAML into the compiled table: editing any of them
    # must invalidate caches even when the version string stays the same
    for name in ("schema/rules.schema.json", "load.py", "validate.py", "compile.py"):
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
