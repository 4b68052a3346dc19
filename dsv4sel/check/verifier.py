"""Prove rule files decide every input exactly once, or say where they do not.

``verify_program(program)`` verifies a compiled Program: gaps, overlaps,
redundancy, shadowed and dead rules, dangling ``use:`` targets, impl
classes, layout ids, selection consistency and rewrite fixpoints, plus the
coverage figures. :func:`problem_report` is the report of rule files that do
not compile. :func:`dsv4sel.verify` (in :mod:`dsv4sel.api`) takes rule paths
through the one pipeline to a Program and calls these.

What counts as a finding (severity ``error`` unless noted):

* gap: inputs whose chain of tables ends in a table where no rule matches;
  one finding per compact cube, in the table that has the gap;
* overlap (hit policy unique): two rules with different outcomes match a
  common input; redundant: two rules with identical outcomes do (a
  ``warning`` under hit policy first, where overlaps are normal);
* shadowed (hit policy first): a rule that matches inputs but decides none;
* dead: a rule that matches no input at all (only dead, never also shadowed);
* dangling / cycle: a ``use:`` target without a table, or a loop;
* hijack (a ``warning``): a default rule whose target table rejects every input it sends there;
* takeover (a ``warning``): a pack's default rule that takes inputs an earlier pack's default
  served and gets them rejected (one not already a hijack);
* hostless (a ``warning``): a backend that selects on a platform a serving engine's plugin serves
  but names no class for that engine (``hosts:``), in a rule set written for it;
* host-layer: a rule served by dsv4sel's vLLM pack layer where vLLM's hosting layer does not fit it
  (no such layer, another layout or cache spec, an impl that cannot read it, no prefill path;
  :mod:`dsv4sel.check.pack_layers`);
* impl / layout / consistency: a selection whose impl class does not import
  from the allowed modules, whose layout ``dsv4sel.kernels.layouts`` does not
  define, or whose torch dtype or bytes per token disagree with the layout
  (or whose impl class's ``supported_layouts`` does not list it);
* fixpoint: selecting again with ``kv_cache_dtype`` = the rewritten
  ``cache_dtype`` (same requested backend) gives another backend, another
  selection, a rejection, a gap, or a further rewrite.

Overlaps are reported per pair (with the cube both rules match) for the
first few partners of each rule; a rule overlapping many more gets one more
finding naming them, so the report stays bounded.

Both are deterministic: the same rules give an equal :class:`Report`.
The space is never enumerated point by point (see :mod:`dsv4sel.engine.scan`).
"""

from __future__ import annotations

from typing import Any, Mapping

from .context import CheckContext
from .chains import gap_findings, hijack_findings, takeover_findings, walk
from .selections import selection_findings
from .pack_layers import pack_layer_findings
from .tables import host_findings, model_findings, table_findings
from ..errors import Problem
from .findings import ERROR, Finding, Report

_KIND_ORDER = {k: i for i, k in enumerate((
    "load", "schema", "vocabulary", "dangling", "compile", "cycle", "dead", "overlap", "shadowed",
    "redundant", "gap", "hijack", "takeover", "impl", "layout", "consistency", "fixpoint", "model", "hostless", "host-layer",
    "translation", "host-gap", "host-dead"))}


def verify_program(program, *, layouts: Mapping[str, Any] | None = None) -> Report:
    """Verify a compiled :class:`~dsv4sel.engine.model.Program`.

    ``layouts`` replaces ``dsv4sel.kernels.layouts.LAYOUTS`` (name -> object
    with ``bytes_per_token`` and ``torch_dtype_name``), e.g. for rule packs
    with their own kernels. Never raises for problems in the program: they
    are findings. The checks are functions of one
    :class:`~dsv4sel.check.context.CheckContext` that yield findings: per table
    (:mod:`dsv4sel.check.tables`), through the chains
    (:mod:`dsv4sel.check.chains`), per selection (:mod:`dsv4sel.check.selections`).
    """
    ctx = CheckContext(program, layouts)
    findings: list[Finding] = []
    for table in ctx.flow.tables.values():
        findings.extend(table_findings(ctx, table))
    walked = walk(ctx)
    findings.extend(walked.chain_findings)
    findings.extend(gap_findings(ctx, walked.gaps))
    hijacks = list(hijack_findings(ctx, walked.routes))
    findings.extend(hijacks)
    findings.extend(takeover_findings(ctx, skip=frozenset(f.rules[0] for f in hijacks)))
    findings.extend(selection_findings(ctx, walked.regions, walked.examples))
    findings.extend(model_findings(ctx))
    findings.extend(host_findings(ctx))
    findings.extend(pack_layer_findings(ctx))
    return Report(tuple(program.sources), _sorted(findings), walked.coverage,
                  rule_count=len(program.rules), table_count=len(ctx.flow.tables))


def problem_report(sources: tuple[str, ...], problems) -> Report:
    """The report of rule files that do not compile: one finding per
    problem, of the kind its code names (:data:`dsv4sel.engine.codes.CODES`).
    The space is not analysed: a program that does not compile has no
    meaning to check."""
    return Report(tuple(sources), _sorted(_finding(p) for p in problems), None, analysed=False)


def _finding(problem: Problem) -> Finding:
    from ..engine.codes import CODES

    kind = CODES.get(problem.code, ("compile",))[0]
    return Finding(ERROR, kind, problem.message, problem.file, problem.line, problem.column, code=problem.code)


def _sorted(findings) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (f.file, f.line, f.column or 0,
                                                 _KIND_ORDER.get(f.kind, 99), f.message)))
