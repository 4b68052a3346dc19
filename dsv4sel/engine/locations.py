"""Locations as text a user can open: ``file:line[:column]`` with the file written so that it
opens from the working directory (:func:`location`), for every command's text and the
messages of ``check`` and ``test``."""

from __future__ import annotations

from ..errors import Loc
from .sources import shown


def location(where) -> str:
    """``where`` (a :class:`~dsv4sel.errors.Loc`, or anything with one as ``.loc``: a rule,
    a problem, a finding) as ``file:line[:column]``, its file written so that it opens from
    the working directory: the short name where it does (``rules/flashmla.yaml:27`` in a
    checkout; a pack given as a relative path), else :func:`~dsv4sel.engine.sources.openable`
    (the shipped rules of a wheel install, an installed pack). The one way every command's
    text, and every message of ``check`` and ``test``, writes a location; ``--json`` gives
    both (``file`` and ``path``)."""
    loc = where if isinstance(where, Loc) else where.loc
    path = loc.file if not_a_file(loc.file) else shown(loc.file)
    return str(Loc(path, loc.line, loc.column))


def not_a_file(name: str) -> bool:
    """Whether a problem's ``file`` names no file (``<rules>``, ``$DSV4SEL_ALLOW_IMPL_MODULES``):
    it has no path to open, and is shown as it is."""
    return name.startswith(("<", "$"))
