"""Adding a built-in input is a profile change plus its vocabulary: the profile's ``key`` grows,
the vocabulary declares the values and a default, and nothing else changes. The compiler holds
the one requirement such an input has: a default, since no query code names it."""

from __future__ import annotations

from pathlib import Path

import pytest

import dsv4sel
from dsv4sel.dsv4.profile import PROFILE
from dsv4sel.engine.build import build_program
from dsv4sel.engine.sources import expand, shipped_sources
from dsv4sel.errors import RuleError

RULES = Path(__file__).with_name("rules") / "profile_inputs"
#: the DeepSeek-V4 profile with one more built-in input, which no Query field names
SPECULATIVE = PROFILE.replace(key=(*PROFILE.key, "speculative"))


def _program(folder: str):
    sources = [*shipped_sources(), *expand(str(RULES / folder), pack="test")]
    return build_program(sources, tuple(dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES), SPECULATIVE)


def test_a_built_in_input_with_a_default_joins_the_key_in_the_profile_s_order():
    program = _program("with_default")
    assert program.inputs["speculative"].default == "off"
    # the built-in inputs in the profile's order, then the others (mega_attn, a V4.1 file's)
    assert list(program.inputs)[:5] == ["model", "platform", "capability", "kv_cache_dtype", "speculative"]
    assert "mega_attn" in list(program.inputs)[5:]
    assert "speculative" not in PROFILE.normalized  # a query carries it in `extra`, as given or at its default


def test_a_built_in_input_the_queries_do_not_name_needs_a_default():
    with pytest.raises(RuleError) as caught:
        _program("without_default")
    assert [(p.code, Path(p.file).name, p.line) for p in caught.value.problems] == [
        ("DSV305", "speculative.vocabulary.yaml", 4)]
