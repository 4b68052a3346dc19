"""Hypothesis: any query, arbitrary strings included, yields a Selection or a SelectionError."""

from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4sel
from dsv4sel import Selection, SelectionError

RULES = dsv4sel.default_rules()
KV = list(RULES.values("kv_cache_dtype"))
BACKENDS = [None, *RULES.backends]
PLATFORMS = list(RULES.values("platform"))
CAPS = [c for p in PLATFORMS for c in RULES.values("capability", p)]

text = st.text(max_size=24)
capability = st.one_of(st.none(), st.sampled_from(CAPS), text,
                       st.tuples(st.integers(-2, 20), st.integers(-2, 20)), st.integers(), st.floats(),
                       st.lists(st.integers(), max_size=2))


@settings(max_examples=400, deadline=None)
@given(platform=st.one_of(st.sampled_from(PLATFORMS), text, st.none(), st.integers()),
       capability=capability,
       backend=st.one_of(st.sampled_from(BACKENDS), text, st.integers()),
       kv=st.one_of(st.sampled_from(KV), text, st.none()),
       model=st.one_of(st.just("deepseek_v4"), text))
def test_any_query_selects_or_raises_selection_error(platform, capability, backend, kv, model):
    try:
        result = dsv4sel.select(platform=platform, capability=capability, backend=backend,
                                kv_cache_dtype=kv, model=model)
    except SelectionError as exc:
        assert str(exc)
        return
    assert isinstance(result, Selection)
    # the rewrite is a fixpoint: selecting again with the rewritten dtype changes nothing more
    again = dsv4sel.select(platform=result.query.platform, capability=result.query.capability,
                           backend=result.query.backend, kv_cache_dtype=result.cache_dtype, model=model)
    assert (again.backend, again.layout, again.cache_dtype) == (result.backend, result.layout, result.cache_dtype)
    assert dict(again.rewrites) == {}


@settings(max_examples=200, deadline=None)
@given(platform=st.sampled_from(PLATFORMS), data=st.data(), backend=st.sampled_from(BACKENDS),
       kv=st.sampled_from(KV))
def test_every_suggestion_of_a_rejection_selects(platform, data, backend, kv):
    capability = data.draw(st.sampled_from(RULES.values("capability", platform)))
    try:
        dsv4sel.select(platform=platform, capability=capability, backend=backend, kv_cache_dtype=kv)
    except SelectionError as exc:
        query = exc.query
        alternatives = RULES.alternatives(query)
        assert exc.suggestions == tuple(alt.suggestion for alt in alternatives)
        for alt in alternatives:
            sel = dsv4sel.select(platform=platform, capability=capability, backend=alt.backend,
                                 kv_cache_dtype=alt.kv_cache_dtype)
            assert sel == alt.selection
