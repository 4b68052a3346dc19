"""The compat rule sets, one small module per engine release (``tools/gen_compat.py`` drives them).

A compat set states, as rules, what one engine release itself decides for DeepSeek-V4. Which
releases there are, and where each one's set lives, is the host registry's
(``dsv4sel/dsv4/host_registry.py``: a release's ``compat`` folder under ``rules/``); the module
that writes a release's set is named after its plugin folder (``vllm_plugin/v0_34`` ->
``vllm_0_34.py``, ``sglang_plugin/v0_5_23`` -> ``sglang_0_5_23.py``) and offers one contract:

- ``HAND_WRITTEN``: files in that folder the module does not write (a README, a hand-written
  vocabulary); every other ``.yaml`` there that ``build()`` does not return is stale;
- ``build() -> dict[str, str]``: every generated file's name and its whole text.

A vLLM release's set is the shipped rules with each deliberate fix reverted (``vllm_tables``
holds the editing machinery every vLLM release shares; a release's module starts from the
previous release's edits and adds what changed). SGLang's set is written from SGLang's own code,
rule by rule. Adding a release is its registry line and one module here.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from dsv4sel.dsv4.host_registry import HOSTS  # noqa: E402


def module_name(host: str, package: str) -> str:
    """The module that writes a release's set: its plugin folder's name under the host's
    (``dsv4sel.vllm_plugin.v0_34`` -> ``vllm_0_34``)."""
    return f"{host}_{package.rpartition('.')[2].removeprefix('v')}"


#: (engine, release) -> (the module under tools/compat/ that writes its set, the set's folder
#: relative to rules/).
RELEASES = {(host.name, r.version): (module_name(host.name, r.package), r.compat)
            for host in HOSTS.values() for r in host.releases}
