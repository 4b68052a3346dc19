"""The shipped rules as SGLang 0.5.23 sees them (dsv4sel.sglang_plugin.translation), against the compat
set (SGLang itself, checked by tests/hosts/sglang/test_sglang523.py) over the whole host space: every input
where they differ is one of the listed fixes (docs/sglang.md), and none is SGLang refusing an input
that dsv4sel serves. Needs no SGLang."""
from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "sglang523"))

import dsv4sel  # noqa: E402
import differential  # noqa: E402
import oracle  # noqa: E402
from dsv4sel.sglang_plugin import translation  # noqa: E402


def _compare():
    compat = dsv4sel.load_rules([str(ROOT / "rules" / "compat" / "sglang-0.5.23")])
    counts: collections.Counter = collections.Counter()
    for platform in ("cuda", "rocm"):
        for point in oracle.points(platform):
            sg = differential.rules_outcome(compat, point)
            try:
                ours = translation.decide(point)
            except dsv4sel.SelectionError as exc:
                ours = str(exc)
            if sg["kind"] == "reject":
                if isinstance(ours, str):
                    counts["late refusal made a start-up one" if sg["late"] else "both refuse"] += 1
                else:
                    counts["SGLang refuses, dsv4sel serves"] += 1
            elif isinstance(ours, str):
                tag = ours[ours.rfind("[") + 1:-1]
                counts["refused: " + (tag.split(" at ")[0] if tag.startswith("rule ") else tag)] += 1
            else:
                theirs = {k: v for k, v in sg["settings"].items() if k != "prefill_attention_backend"}
                same = (sg["class"], theirs) == (ours.cls, ours.settings)
                counts["same" if same else f"layout {theirs['kv_layout']} -> {ours.settings['kv_layout']}"] += 1
    return counts


@pytest.fixture(scope="module")
def counts():
    return _compare()


def test_sglang_never_refuses_what_dsv4sel_serves(counts):
    assert counts["SGLang refuses, dsv4sel serves"] == 0


def test_every_difference_is_a_listed_fix(counts):
    fixes = {"dsv4sel SGLang fix S1", "dsv4sel SGLang fix S2", "dsv4sel SGLang fix S4"}
    shipped_rules = {"rule default-cuda-unsupported", "rule flashmla-unsupported-platform",
                     "rule default-v41-unsupported", "rule flashmla-dsv41-unsupported-platform",
                     "rule rocm-unsupported-arch", "rule rocm-dsv41-unsupported-arch"}
    for key in counts:
        if key.startswith("refused: "):
            assert key[len("refused: "):] in fixes | shipped_rules, key
        else:
            assert key in {"same", "both refuse", "late refusal made a start-up one",
                           "layout v41 -> v4", "layout v4 -> v41"}, key
    # the late failures SGLang has are all start-up refusals here (S3)
    assert counts["late refusal made a start-up one"] > 0 and counts["same"] > 0


def test_the_space_is_the_differential_space(counts):
    assert sum(counts.values()) == 20_480 + 23_040
