"""The compiled form equals per-point resolution everywhere (differential).

``Program.to_table`` paints the regions of the verifier's exact scan into the
decision array; ``Program.resolve`` decides one point by walking the tables
rule by rule. The second is the specification of the first: for the
shipped rules and for random rule sets, every (point, backend) must give
the same outcome row.
"""

from __future__ import annotations


import pytest
from hypothesis import HealthCheck, assume, given, settings


from _verify_programs import build, specs  # noqa: E402

import dsv4sel  # noqa: E402
from dsv4sel.dsv4.profile import PROFILE  # noqa: E402
from dsv4sel.engine import artifact  # noqa: E402
from dsv4sel.engine.build import build_program  # noqa: E402
from dsv4sel.engine.lower import to_table  # noqa: E402
from dsv4sel.dsv4.rules import RuleSet  # noqa: E402
from dsv4sel.engine.sources import shipped_sources  # noqa: E402
from dsv4sel.check.verifier import verify_program  # noqa: E402


def resolved_row(program, backend, point) -> tuple:
    """The outcome row of one input, decided point by point."""
    index = {id(rule): i for i, rule in enumerate(program.rules)}
    res = program.resolve(backend, point)
    path = tuple(index[id(r)] for r in res.path)
    if res.kind == "select":
        f = dict(res.fields)
        rewrites = tuple(sorted((k, v) for k, v in f.get("rewrites", {}).items()
                                if not (k == "cache_dtype" and v == point["kv_cache_dtype"])))
        return ("select", res.backend, f["impl"], f["layout"], f["cache_dtype"], f["torch_dtype"],
                f["bytes_per_token"], f["block_size"], rewrites, res.messages, path, tuple(f.get("hosts", ())),
                tuple(f.get("host_settings", ())))
    if res.kind == "reject":
        return ("reject", res.backend, res.reason, path, res.messages)
    return ("gap", res.backend, res.table, path)


def assert_table_equals_resolution(program) -> int:
    data = to_table(program)
    rules = RuleSet(data, "digest", program.allowed_impl_modules)
    compared = 0
    for point in program.points():
        extras = tuple(point[n] for n in rules.extra_inputs)
        for backend in (None, *program.backends):
            key = (point["model"], point["platform"], point["capability"], backend,
                   point["kv_cache_dtype"], *extras)
            got = rules.row(key)
            assert tuple(got) == resolved_row(program, backend, point), (point, backend)
            compared += 1
    assert compared == rules.size
    return compared


def test_the_shipped_rules_compile_to_what_resolution_decides():
    program = build_program(shipped_sources(), dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES, PROFILE)
    rules = dsv4sel.default_rules()
    assert assert_table_equals_resolution(program) == rules.size


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(specs())
def test_random_rule_sets_compile_to_what_resolution_decides(spec):
    program = build(spec)
    kinds = {f.kind for f in verify_program(program).findings}
    assume(not kinds & {"dangling", "cycle"})  # the builder refuses those before compiling
    assert_table_equals_resolution(program)


@pytest.mark.parametrize("bits,runs", [
    (0b0, []), (0b1, [(0, 1)]), (0b1110, [(1, 3)]), (0b1011_0111, [(0, 3), (4, 2), (7, 1)]),
    ((1 << 70) - 1, [(0, 70)]),
])
def test_runs_of_set_bits(bits, runs):
    assert list(artifact._runs(bits)) == runs


def test_a_space_beyond_the_compiled_form_is_one_rule_error(monkeypatch):
    program = build_program(shipped_sources(), dsv4sel.DEFAULT_ALLOWED_IMPL_MODULES, PROFILE)
    size = dsv4sel.default_rules().size
    monkeypatch.setattr(artifact, "MAX_INPUTS", size - 1)
    with pytest.raises(dsv4sel.RuleError) as info:
        to_table(program)
    (problem,) = info.value.problems
    assert problem.file == program.default_table.file  # the table every query starts from
    assert f"= {size:,} inputs; the compiled form holds at most {size - 1:,}" in str(problem)
    assert problem.code == "DSV314"
