"""Property tests of the verifier: against brute force, metamorphic, and the
shipped rules under random queries.

Random rule sets come from :mod:`_verify_programs` (small vocabularies,
both hit policies, ``use:`` chains, templates and rewrites); the verifier
under test is the real :func:`dsv4sel.verify_program` / :func:`dsv4sel.verify`.
"""

from __future__ import annotations

import os
import random
import tempfile

from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st


from _verify_programs import BASE_FIELDS, Reference, Spec, build, specs, to_yaml_files  # noqa: E402

import dsv4sel  # noqa: E402
from dsv4sel.api import verify  # noqa: E402
from dsv4sel.check.verifier import verify_program  # noqa: E402
from dsv4sel.dsv4.profile import PROFILE  # noqa: E402

# The conftest's autouse cache fixture is function-scoped; it only points the
# compiled-rules cache at a temp dir, which is harmless to share across examples.
SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FEW = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def gap_inputs(report) -> set[tuple]:
    """(table, point items, requested backend) of every input in a gap finding."""
    out = set()
    for f in report.of_kind("gap"):
        for cube in f.cubes:
            for point in cube.points():
                start = point.pop("backend")
                out.add((f.table, tuple(sorted(point.items())), start))
    return out


def table_gaps(report) -> set[tuple]:
    return {(table, point) for table, point, _ in gap_inputs(report)}


def signature(report, rename=lambda v: v) -> list:
    """Every finding reduced to what must not depend on spelling or files."""
    out = []
    for f in report.findings:
        points = frozenset(tuple(sorted((k, rename(v)) for k, v in p.items())) for c in f.cubes for p in c.points())
        out.append((f.kind, f.severity, f.table, tuple(r.id for r in f.rules), f.count, points))
    return sorted(out, key=repr)


# --------------------------------------------------------------- brute force

@SETTINGS
@given(specs())
def test_checker_equals_brute_force(spec):
    program = build(spec)
    ref = Reference(program)
    report = verify_program(program)

    assert gap_inputs(report) == ref.input_gaps()
    pairs = ref.pairs()
    for kind in ("overlap", "redundant"):
        assert {(f.table, f.rules[0].id, f.rules[1].id) for f in report.of_kind(kind)} == pairs[kind], kind
    shadowed, dead = ref.shadowed_and_dead()
    assert {f.rules[0].id for f in report.of_kind("shadowed")} == shadowed
    assert {f.rules[0].id for f in report.of_kind("dead")} == dead
    assert {f.rules[0].id for f in report.of_kind("fixpoint")} == ref.fixpoint_failures()
    counts = ref.counts()
    for backend in report.coverage.backends:
        c = counts[backend.backend]
        assert (backend.counts.select, backend.counts.reject, backend.counts.undecided) == (
            c["select"], c["reject"], c["undecided"])
    assert report.coverage.points == len(ref.points)
    assert report.coverage.totals.total == report.coverage.inputs
    # every counterexample is a real input showing the problem
    for f in report.of_kind("gap"):
        point = f.counterexample.as_dict()
        start = point.pop("backend")
        assert ref.resolve(start, point)[0] == "gap"
    for f in report.of_kind("overlap") + report.of_kind("redundant"):
        point = f.counterexample.as_dict()
        point.pop("backend")
        table = next(t for t in ref.tables.values() if t.name == f.table)
        hits = {r.ref.id for r in ref.matching(table, point)}
        assert {f.rules[0].id, f.rules[1].id} <= hits


@FEW
@given(specs(empty_tables=False))
def test_yaml_pipeline_gives_the_same_findings(spec):
    """The same rule set written as YAML and verified through load, schema
    and compile gives the findings of the Program built directly."""
    with tempfile.TemporaryDirectory() as directory:
        for name, text in to_yaml_files(spec).items():
            with open(os.path.join(directory, name), "w") as fh:
                fh.write(text)
        report = verify([directory])
    assert report.analysed, [str(f) for f in report.findings]
    assert signature(report) == signature(verify_program(build(spec)))


# ---------------------------------------------------------------- metamorphic

@SETTINGS
@given(specs(), st.randoms(use_true_random=False))
def test_copying_a_rule_is_always_found(spec, rnd):
    tables = [t for t in spec.tables if t[2]]
    assume(tables)
    backends, policy, rules = rnd.choice(tables)
    position = rnd.randrange(len(rules))
    rule_id, conds, outcome = rules[position]
    copy = spec.copy()
    target = next(t for t in copy.tables if t[0] == backends)
    target[2].insert(rnd.randrange(len(target[2]) + 1), (rule_id + "-copy", dict(conds), outcome))
    report = verify_program(build(copy))
    involved = {f.kind for f in report.findings if any(r.id == rule_id + "-copy" for r in f.rules)}
    dead = any(f.rules[0].id == rule_id for f in verify_program(build(spec)).of_kind("dead"))
    if dead:  # a copy of a rule that matches nothing matches nothing either
        assert "dead" in involved
    else:
        assert involved & {"overlap", "redundant", "shadowed"}, involved


@SETTINGS
@given(specs(), st.randoms(use_true_random=False))
def test_deleting_a_rule_never_removes_a_gap(spec, rnd):
    """Within each table: a rule only ever adds matches, so removing one
    cannot close a gap. (Across tables it can: deleting a ``use`` rule may
    let a later rule decide inputs that used to be routed into a gap.)"""
    tables = [t for t in spec.tables if t[2]]
    assume(tables)
    backends, _, rules = rnd.choice(tables)
    smaller = spec.copy()
    target = next(t for t in smaller.tables if t[0] == backends)
    del target[2][rnd.randrange(len(target[2]))]
    before = table_gaps(verify_program(build(spec)))
    after = table_gaps(verify_program(build(smaller)))
    assert before <= after


@SETTINGS
@given(specs(), st.data())
def test_renaming_a_value_everywhere_changes_no_finding(spec, data):
    name, values, _, _ = data.draw(st.sampled_from(spec.inputs))
    old = data.draw(st.sampled_from(list(values)))
    new = "renamed_" + old.replace(".", "_")
    assume(new not in values)
    before = signature(verify_program(build(spec)))
    after = signature(verify_program(build(_renamed(spec, name, old, new))), rename=lambda v: old if v == new else v)
    assert before == after


def _renamed(spec: Spec, name: str, old: str, new: str, *, restated: bool = True) -> Spec:
    """``spec`` with value ``old`` of input ``name`` spelt ``new`` everywhere
    it is written: the vocabulary, the conditions, and (for a kv dtype) every
    select field that restates the input. ``restated=False`` leaves those
    fields alone: see :func:`test_a_restated_field_is_a_spelling_of_its_input`."""

    def rn(v):
        return new if v == old else v

    renamed = Spec(
        [(n, tuple(rn(v) for v in vals) if n == name else tuple(vals), by,
          {rn(p) if by == name else p: [rn(v) for v in vs] if n == name else list(vs) for p, vs in s.items()}
          if s else None)
         for n, vals, by, s in spec.inputs],
        [(b, p, [(i, {k: [rn(v) for v in vs] if k == name else list(vs) for k, vs in c.items()}, o)
                 for i, c, o in rules]) for b, p, rules in spec.tables])
    # the select fields that restate input ``name`` (DeepSeek-V4: cache_dtype restates kv_cache_dtype)
    fields = [f for f, restated_input in PROFILE.restates if restated_input == name]
    if fields:
        renamed = Spec(renamed.inputs, [(b, p, [(i, c, _rename_outcome(o, rn, fields, restated)) for i, c, o in rules])
                                        for b, p, rules in renamed.tables])
    return renamed


def _rename_outcome(outcome, rn, fields, restated=True):
    """A select outcome with the renamed value renamed where it is written:
    in the ``rewrites`` of ``fields`` (their targets are values of the
    input), and in each of ``fields`` itself (the fields restating the
    input, ``Profile.restates``), including the value a rule inherits from
    BASE_FIELDS (``cache_dtype: fp8_ds_mla``). A template
    (``{kv_cache_dtype}``) renders the new spelling by itself; the layout id
    ``fp8_ds_mla`` names a layout, not a kv dtype, and keeps its name."""
    if outcome[0] != "select":
        return outcome
    out = dict(outcome[1])
    for f in fields if restated else ():
        out[f] = rn(out.get(f, BASE_FIELDS[f]))
    if "rewrites" in out:
        out["rewrites"] = {k: rn(v) if k in fields else v for k, v in out["rewrites"].items()}
    return ("select", out)


#: The rare failure of the property above, shrunk: r2 selects cache_dtype
#: fp8_ds_mla (inherited) and rewrites kv auto to fp8_ds_mla; selecting again
#: reaches r1, whose cache_dtype is the template {kv_cache_dtype}: fp8_ds_mla
#: again, a fixpoint.
RESTATED = Spec(
    [("model", ("m0",), None, None), ("platform", ("cuda",), None, None),
     ("capability", ("9.0",), "platform", {"cuda": ["9.0"]}),
     ("kv_cache_dtype", ("auto", "fp8", "fp8_ds_mla"), None, None)],
    [((), "first", [("r0", {}, ("use", "B0"))]),
     (("B0",), "first", [
         ("r1", {"kv_cache_dtype": ["fp8_ds_mla"]}, ("select", {"cache_dtype": "{kv_cache_dtype}"})),
         ("r2", {"kv_cache_dtype": ["auto"]}, ("select", {"rewrites": {"cache_dtype": "fp8_ds_mla"}})),
         ("r3", {"kv_cache_dtype": ["fp8"]}, ("reject", "unsupported"))])])


def test_a_restated_field_is_a_spelling_of_its_input():
    """``cache_dtype`` restates ``kv_cache_dtype``: a rule's constant
    ``cache_dtype: fp8_ds_mla`` spells a kv dtype, so renaming the kv dtype
    fp8_ds_mla everywhere renames it there too. The property once renamed
    only the vocabulary, conditions and rewrites; r2 then still selected
    cache_dtype fp8_ds_mla while re-selecting with the renamed dtype gave
    r1's cache_dtype renamed_fp8_ds_mla: another selection, and the
    verifier rightly reported a fixpoint finding for rules that were no
    longer the same rules respelt. The verifier was right both times; the
    renaming was incomplete."""
    old, new = "fp8_ds_mla", "renamed_fp8_ds_mla"
    assert not verify_program(build(RESTATED)).of_kind("fixpoint")
    half = verify_program(build(_renamed(RESTATED, "kv_cache_dtype", old, new, restated=False)))
    assert [f.rules[0].id for f in half.of_kind("fixpoint")] == ["r2"]
    assert "selects cache_dtype 'renamed_fp8_ds_mla' instead of 'fp8_ds_mla'" in half.of_kind("fixpoint")[0].message
    before = signature(verify_program(build(RESTATED)))
    after = signature(verify_program(build(_renamed(RESTATED, "kv_cache_dtype", old, new))),
                      rename=lambda v: old if v == new else v)
    assert before == after


# ------------------------------------------------------------ shipped rules

def _layouts():
    from dsv4sel.kernels.layouts import LAYOUTS

    return LAYOUTS


rules = dsv4sel.default_rules
ANY = st.one_of(st.none(), st.text(max_size=12), st.integers(-3, 20), st.booleans(),
                st.tuples(st.integers(0, 13), st.integers(0, 9)), st.lists(st.integers(), max_size=2))


def _vocab(name):
    return st.sampled_from(rules().values(name))


def _mostly(draw, values, other=ANY):
    """A declared value nine times in ten (so that selections are common),
    otherwise anything at all."""
    return draw(st.sampled_from(values)) if draw(st.integers(0, 9)) else draw(other)


@st.composite
def queries(draw):
    rs = rules()
    platform = _mostly(draw, rs.values("platform"))
    scoped = rs.values("capability", platform) if platform in rs.values("platform") else ()
    query = {
        "platform": platform,
        "capability": _mostly(draw, scoped or rs.values("capability")),
        "backend": draw(st.one_of(st.none(), st.sampled_from(rs.backends), ANY)),
        "kv_cache_dtype": _mostly(draw, rs.values("kv_cache_dtype")),
        "model": _mostly(draw, rs.values("model")),
    }
    for name in rs.extra_inputs:
        if draw(st.booleans()):
            query[name] = _mostly(draw, rs.values(name))
    if draw(st.integers(0, 9)) == 0:
        query[draw(st.sampled_from(["bogus", "Platform", "kv"]))] = draw(ANY)
    return query


def _consistent(sel) -> list[str]:
    problems = []
    layout = _layouts().get(sel.layout)
    if layout is None:
        return [f"unknown layout {sel.layout}"]
    if layout.torch_dtype_name != sel.torch_dtype_name:
        problems.append(f"torch dtype {sel.torch_dtype_name} vs {layout.torch_dtype_name}")
    if layout.bytes_per_token != sel.bytes_per_token:
        problems.append(f"bytes per token {sel.bytes_per_token} vs {layout.bytes_per_token}")
    try:
        cls = sel.load_impl()
    except Exception as exc:  # noqa: BLE001 - any failure is the problem reported
        return problems + [f"impl: {exc}"]
    if sel.layout not in getattr(cls, "supported_layouts", {sel.layout}):
        problems.append(f"{cls.__name__} does not read {sel.layout}")
    return problems


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queries())
@example({"platform": "cuda", "capability": "9.0", "kv_cache_dtype": "auto", "backend": None, "model": "deepseek_v4"})
@example({"platform": "cuda", "capability": "12.0", "kv_cache_dtype": "fp8", "backend": None,
          "model": "deepseek_v4_1"})
def test_shipped_rules_answer_every_query_consistently(query):
    """Any query, arbitrary strings and types included, gives a Selection or
    a SelectionError; a Selection is consistent with its layout, its impl
    resolves, and its cache-dtype rewrite is a fixpoint."""
    try:
        sel = dsv4sel.select(**query)
    except dsv4sel.SelectionError:
        return
    assert isinstance(sel, dsv4sel.Selection)
    assert _consistent(sel) == [], query
    target = sel.rewrites.get("cache_dtype")
    if target is not None:
        again = dsv4sel.select(**{**query, "kv_cache_dtype": target})
        same = ("backend", "impl", "layout", "cache_dtype", "torch_dtype_name", "bytes_per_token", "block_size")
        assert [getattr(again, k) for k in same] == [getattr(sel, k) for k in same], query
        assert again.rewrites.get("cache_dtype", target) == target, query


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queries())
def test_shipped_rules_never_fail_with_another_exception(query):
    """Without the example-biased search above: fully random queries give a
    Selection or a SelectionError, never another exception, and a rewrite
    re-selects to the same backend, layout and cache dtype."""
    try:
        sel = dsv4sel.select(**query)
    except dsv4sel.SelectionError:
        return
    target = sel.rewrites.get("cache_dtype")
    if target is not None:
        again = dsv4sel.select(**{**query, "kv_cache_dtype": target})
        assert (again.backend, again.layout, again.cache_dtype) == (sel.backend, sel.layout, sel.cache_dtype)
        assert again.rewrites.get("cache_dtype", target) == target


def test_random_queries_reach_selections():
    """The query strategy is not vacuous: plain vocabulary queries select."""
    rs = rules()
    rnd = random.Random(0)
    selected = 0
    for _ in range(200):
        platform = rnd.choice(rs.values("platform"))
        try:
            dsv4sel.select(platform=platform, capability=rnd.choice(rs.values("capability", platform)),
                           kv_cache_dtype=rnd.choice(rs.values("kv_cache_dtype")),
                           model=rnd.choice(rs.values("model")))
            selected += 1
        except dsv4sel.SelectionError:
            pass
    assert selected > 10
