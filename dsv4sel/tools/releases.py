"""A host release by the name a person gives it, and the compat rule set that states what it
decides by itself: the one lookup ``dsv4sel upgrade`` and ``dsv4sel fleet`` share, over the host
registry (:data:`dsv4sel.dsv4.host_registry.HOSTS`)."""

from __future__ import annotations

import os

from ..dsv4.host_registry import HOSTS, Host, Release
from ..errors import SelectionError


class UnknownRelease(SelectionError):
    """A host or release the registry does not know, or a release whose compat set is not here."""


def release_name(version: str) -> str:
    """How a release is named to people: its tested version without a trailing ``.0``
    (``0.34.0`` -> ``0.34``, ``0.5.23`` stays), as the command line accepts it."""
    return version[:-2] if version.count(".") >= 2 and version.endswith(".0") else version


def find_release(host_name: str, version: str) -> tuple[Host, Release]:
    """The registry's host ``host_name`` and its release ``version`` (``0.34`` or ``0.34.0``).
    Raises :class:`UnknownRelease` listing the hosts or releases there are."""
    from ..engine.suggest import did_you_mean
    from ..engine.text import escape

    host = HOSTS.get(host_name)
    if host is None:
        raise UnknownRelease(f"unknown host {escape(host_name)!r}{did_you_mean(host_name, HOSTS)}; "
                             f"known hosts: {', '.join(sorted(HOSTS))}")
    release = host.release(version)
    if release is None:
        known = ", ".join(r.version if release_name(r.version) == r.version else f"{release_name(r.version)} ({r.version})"
                          for r in host.releases)
        raise UnknownRelease(f"{host.label} has no release {escape(version)!r} that dsv4sel follows; "
                             f"known releases: {known}")
    return host, release


def compat_dir(host: Host, release: Release, root: str | None = None) -> str:
    """The directory of ``release``'s compat rule set under ``root`` (None: the shipped rules'
    directory). Raises :class:`UnknownRelease` when it is not there."""
    from ..engine.sources import shipped_rules_dir
    from ..engine.text import escape

    path = os.path.join(root if root is not None else shipped_rules_dir(), *release.compat.split("/"))
    if not os.path.isdir(path):
        raise UnknownRelease(f"{host.label} {release.version}'s compat rule set is not here: no directory "
                             f"{escape(path)} (the registry names {release.compat} under the rules directory)")
    return path
