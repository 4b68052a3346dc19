"""SGLang 0.5.23's vocabulary mapped onto the shipped rules: the data is
``dsv4sel/sglang_plugin/v0_5_23/sglang-0.5.23.yaml`` (a host translation, :mod:`dsv4sel.translation`).

One SGLang input (a point of that file's ``space``: model, platform, capability,
``--dsv4-attn-backend``, ``--kv-cache-dtype``, ``SGLANG_DSV4_KV_LAYOUT``, the deployment and
``SGLANG_HACK_FLASHMLA_BACKEND``) is refused by the file's ``refuse`` rows, or turned into a
dsv4sel query by its ``backend`` / ``kv_cache_dtype`` / ``extra`` rows and decided by the shipped
rules, whose ``hosts: {sglang: ...}`` entry says what SGLang must be told to build the selection.

:func:`decide` returns a :class:`HostDecision` or raises :class:`dsv4sel.SelectionError`. It
never imports SGLang.
"""
from __future__ import annotations

import functools

from ..dsv4.host_registry import HOSTS
from ..translation import HostDecision, Translation, load

__all__ = ["FILE", "HOST", "VERSIONS", "HostDecision", "decide", "translation"]

HOST = "sglang"
_RELEASE = HOSTS[HOST].releases[-1]
FILE = _RELEASE.translation_path
#: the SGLang versions the plugin is written for (the host registry's; the translation file's
#: ``versions`` and the pyproject extra say the same range)
VERSIONS = HOSTS[HOST].supported


@functools.lru_cache(maxsize=1)
def translation() -> Translation:
    """The shipped SGLang translation, loaded and checked once (RuleError on a broken file)."""
    t = load(FILE, _RELEASE.display)
    if (t.host, t.versions) != (HOST, VERSIONS):
        raise ValueError(f"{t.file}: written for {t.host} {t.versions}, not {HOST} {VERSIONS}")
    return t


def decide(point: dict, rules=None, role: str | None = None) -> HostDecision:
    """Decide one SGLang input with the shipped rules (or ``rules``); raises SelectionError.
    ``role``: the process's role under disaggregation (:mod:`dsv4sel.dsv4.roles`)."""
    import dsv4sel

    return translation().decide(point, rules or dsv4sel.default_rules(), role=role)
