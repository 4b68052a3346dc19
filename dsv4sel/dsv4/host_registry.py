"""The serving engines (hosts) dsv4sel decides for, and the releases of each: one record per host.

Everything the rest of dsv4sel needs to know about a host is read from :data:`HOSTS`: ``dsv4sel
check`` (which hosts must be named a class, which translation files to prove complete over their
host's space), the plugins (which release folder to wire for the installed version), the fleet
tool (which compat rule set states what a release does), packaging and the layer test. Adding a
release of an engine is one :class:`Release` line here plus its folder (plugin code that differs
by release, its translation file) and its data (compat rules, tests); nothing else names versions.

Data only: nothing here imports a host or a plugin.
"""

from __future__ import annotations

import os

from ..record import Frozen

#: the installed dsv4sel package directory (translation paths are relative to it)
PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Release(Frozen):
    """One release line of a host that dsv4sel's plugin is written for.

    ``version`` is the release the suite tests against (``"0.34.0"``); ``versions`` the range the
    plugin serves with this release's folder (``">=0.34.0,<0.35"``); ``package`` that folder as a
    module (its code that differs by release); ``translation`` the host translation file, relative
    to the dsv4sel package (the host's inputs in the rules' words, proven complete by ``check``);
    ``compat`` the compat rule set that states what the release itself decides, relative to the
    shipped rules' directory."""

    __slots__ = ("version", "versions", "package", "translation", "compat")  # noqa: RUF023  constructor order
    version: str
    versions: str
    package: str
    translation: str
    compat: str

    @property
    def translation_path(self) -> str:
        return os.path.join(PACKAGE_DIR, *self.translation.split("/"))

    @property
    def display(self) -> str:
        """The translation file as messages name it (``dsv4sel/vllm_plugin/v0_34/vllm-0.34.yaml``)."""
        return "dsv4sel/" + self.translation


class Host(Frozen):
    """A serving engine: its distribution ``name`` (the key of ``hosts:`` in rule files), how
    messages spell it (``label``), the platforms its plugin decides on, its plugin's entry point
    (``group``, ``target``), the releases it supports (oldest first) and whether its plugin
    refuses a selection whose rule names it no class (``requires_class``: ``check`` then warns,
    DSV412, about a backend that selects on the host's platforms without one)."""

    __slots__ = ("name", "label", "platforms", "group", "target", "releases", "requires_class")  # noqa: RUF023
    name: str
    label: str
    platforms: tuple[str, ...]
    group: str
    target: str
    releases: tuple[Release, ...]
    requires_class: bool

    @property
    def plugin(self) -> str:
        """The plugin package (``dsv4sel.vllm_plugin``)."""
        return self.target.partition(":")[0]

    @property
    def supported(self) -> str:
        """Every release the plugin serves, as one spec for messages and the extra (``>=0.33.0,<0.35``)."""
        lows = [r.versions.split(",")[0].strip() for r in self.releases]
        highs = [r.versions.split(",")[-1].strip() for r in self.releases]
        return f"{lows[0]},{highs[-1]}"

    def release_for(self, version: str) -> Release | None:
        """The release folder that serves the installed ``version``, or None (ValueError for a
        version string that is not PEP 440)."""
        from ..engine.hosts import version_matches

        return next((r for r in self.releases if version_matches(version, r.versions)), None)

    def release(self, version: str) -> Release | None:
        """The release whose tested ``version`` or range holds ``version`` (``"0.34"`` and
        ``"0.34.0"`` both name 0.34), or None."""
        for r in self.releases:
            if version in (r.version, r.version.rsplit(".", 1)[0]):
                return r
        try:
            return self.release_for(version)
        except ValueError:
            return None


HOSTS: dict[str, Host] = {
    "vllm": Host(
        name="vllm", label="vLLM", platforms=("cuda", "rocm", "cpu", "xpu"),
        group="vllm.general_plugins", target="dsv4sel.vllm_plugin:register", requires_class=True,
        releases=(
            Release(version="0.33.0", versions=">=0.33.0,<0.34", package="dsv4sel.vllm_plugin.v0_33",
                    translation="vllm_plugin/v0_33/vllm-0.33.yaml", compat="compat/vllm-0.33"),
            Release(version="0.34.0", versions=">=0.34.0,<0.35", package="dsv4sel.vllm_plugin.v0_34",
                    translation="vllm_plugin/v0_34/vllm-0.34.yaml", compat="compat/vllm-0.34"),
        )),
    "sglang": Host(
        name="sglang", label="SGLang", platforms=("cuda", "rocm"),
        group="sglang.srt.plugins", target="dsv4sel.sglang_plugin:register", requires_class=False,
        releases=(
            Release(version="0.5.23", versions=">=0.5.23,<0.5.24", package="dsv4sel.sglang_plugin.v0_5_23",
                    translation="sglang_plugin/v0_5_23/sglang-0.5.23.yaml", compat="compat/sglang-0.5.23"),
        )),
}

#: The hosts whose plugin builds only the class a selection names under ``hosts:``, and the
#: platforms each serves: ``dsv4sel check`` warns (DSV412) about a backend that selects on one of
#: them but names no class for that host, in a rule set written for that host (one rule names it).
HOST_PLATFORMS: dict[str, tuple[str, ...]] = {h.name: h.platforms for h in HOSTS.values() if h.requires_class}
#: How messages spell a host.
HOST_NAMES: dict[str, str] = {h.name: h.label for h in HOSTS.values()}
