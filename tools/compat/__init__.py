"""The compat rule sets, one small module per engine release (``tools/gen_compat.py`` drives them).

A compat set states, as rules, what one engine release itself decides for DeepSeek-V4. Each
release's module holds only that release's knowledge and offers one contract:

- ``OUT``: the set's folder under ``rules/compat/`` (``vllm-0.34``);
- ``HAND_WRITTEN``: files in that folder the module does not write (a README, a hand-written
  vocabulary); every other ``.yaml`` there that ``build()`` does not return is stale;
- ``build() -> dict[str, str]``: every generated file's name and its whole text.

A vLLM release's set is the shipped rules with each deliberate fix reverted (``vllm_tables``
holds the editing machinery every vLLM release shares; a release's module starts from the
previous release's edits and adds what changed). SGLang's set is written from SGLang's own code,
rule by rule. Adding a release is one module here and one line in :data:`RELEASES`.
"""
from __future__ import annotations

#: (engine, release) -> the module under tools/compat/ that writes its set.
RELEASES = {
    ("vllm", "0.33.0"): "vllm_0_33",
    ("vllm", "0.34.0"): "vllm_0_34",
    ("sglang", "0.5.23"): "sglang_0_5_23",
}
