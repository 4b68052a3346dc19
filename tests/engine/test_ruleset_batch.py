"""The rule set's batch read and its one key builder: ``CompiledRules.around`` answers a
point and its neighbours exactly as one lookup per neighbour would, and ``RuleSet.key``
builds every key in the profile's order with inputs replaced by name."""

from __future__ import annotations

import itertools
import random

import pytest

import dsv4sel
from dsv4sel.dsv4.profile import PROFILE
from dsv4sel.tools import probe


@pytest.fixture(scope="module")
def rules():
    return dsv4sel.load_rules()


def _declared_values(rules, name: str, point: dict) -> tuple:
    """The values of input ``name`` where ``point`` is (a scoped input: its parent's)."""
    if name == "backend":
        return (None, *rules.backends)
    by, _ = rules.scope(name)
    return rules.values(name, point[by]) if by is not None else rules.values(name)


def _brute_force(rules, key: tuple, vary: dict) -> set[int]:
    """What ``around`` must give: a lookup per neighbour, keys outside the space left out."""
    names = rules.key_inputs
    point = dict(zip(names, key))
    choices = []
    for name in names:
        if name not in vary:
            choices.append((point[name],))
        elif vary[name] is not None:
            choices.append(vary[name])
        else:  # every value: an input's undeclared combinations are outside the space
            choices.append((None, *rules.backends) if name == "backend" else rules.values(name))
    found = set()
    for combo in itertools.product(*choices):
        index = rules.index(combo)
        if index is not None:
            found.add(index)
    return found


def test_around_is_the_union_of_single_lookups(rules):
    rng = random.Random(19)
    names = rules.key_inputs
    for _ in range(60):
        point: dict = {}
        for name in names:
            if name == "backend":
                continue
            point[name] = rng.choice(_declared_values(rules, name, point))
        point["backend"] = rng.choice((None, *rules.backends))
        key = tuple(point[n] for n in names)
        varied = rng.sample([n for n in names], rng.randint(0, 3))
        vary = {}
        for name in varied:
            if rng.random() < 0.5:
                vary[name] = None
            else:
                values = _declared_values(rules, name, point)
                vary[name] = tuple(rng.sample(values, rng.randint(1, len(values))))
        assert rules.around(key, **vary) == _brute_force(rules, key, vary), (key, vary)


def test_around_with_nothing_varied_is_the_point_itself(rules):
    query, _ = rules.normalize(platform="cuda", capability="9.0", kv_cache_dtype="fp8")
    key = rules.key(query)
    assert rules.around(key) == {rules.index(key)}


def test_a_key_outside_the_space_at_a_fixed_input_finds_nothing(rules):
    query, _ = rules.normalize(platform="cuda", capability="9.0", kv_cache_dtype="fp8")
    key = rules.key(query, capability="no-such-capability")
    assert rules.around(key, kv_cache_dtype=None) == set()


def test_the_key_follows_the_profile_then_the_packs_inputs(rules):
    assert rules.key_inputs[:len(PROFILE.key)] == PROFILE.key
    query, _ = rules.normalize(platform="cuda", capability="9.0", kv_cache_dtype="fp8")
    assert rules.key(query) == tuple(query.point()[name] for name in rules.key_inputs)
    assert tuple(query.point())[:len(PROFILE.key)] == PROFILE.key


def test_the_key_replaces_built_in_and_pack_inputs_by_name(rules):
    query, _ = rules.normalize(platform="cuda", capability="9.0", kv_cache_dtype="fp8")
    pack_input = rules.extra_inputs[0]
    other = next(v for v in rules.values(pack_input) if v != dict(query.extra)[pack_input])
    key = rules.key(query, backend="FLASHMLA_SPARSE_DSV4", kv_cache_dtype="auto", **{pack_input: other})
    at = dict(zip(rules.key_inputs, key))
    assert (at["backend"], at["kv_cache_dtype"], at[pack_input]) == ("FLASHMLA_SPARSE_DSV4", "auto", other)
    assert at["platform"] == "cuda" and at["capability"] == "9.0"
    # the key of the query asked that way is the same key
    asked, _ = rules.normalize(platform="cuda", capability="9.0", kv_cache_dtype="auto",
                               backend="FLASHMLA_SPARSE_DSV4", extra={**dict(query.extra), pack_input: other})
    assert rules.key(asked) == key


def test_serves_somewhere_agrees_with_a_scan_of_every_neighbour(rules):
    """The batch answer of "does backend X select anywhere on this platform?" is the one a
    lookup per capability, kv dtype and pack-input combination gives."""
    query, _ = rules.normalize(platform="cuda", capability="9.0", kv_cache_dtype="fp8")
    for backend in (None, *rules.backends):
        scanned = False
        for cap in rules.values("capability", query.platform):
            for extra in probe.extra_combos(rules):
                for kv in rules.values("kv_cache_dtype"):
                    row = rules.row(rules.key(query, backend=backend, capability=cap, kv_cache_dtype=kv,
                                              **dict(extra)))
                    scanned = scanned or (row is not None and probe.serves(row, backend))
        assert probe.serves_somewhere(rules, query, backend) is scanned, backend

