"""Prove rule files decide every input exactly once, or say where they do not.

Two entry points, both exported lazily from :mod:`dsv4sel`:

``verify(rules=None, *, allowed_impl_modules=None)``
    Load, schema-check and compile rule files, then verify the program.
    ``rules`` is what :func:`dsv4sel.load_rules` takes: None (the default
    rule set: shipped rules, installed packs, ``DSV4SEL_RULES_PATH``), or a
    list of rule packs (directories, files, :class:`dsv4sel.sources.Pack`);
    or a :class:`~dsv4sel.ruleset.RuleSet` (its source files are re-read and
    must still hash to the RuleSet's digest); or a compiled
    :class:`~dsv4sel.model.Program`. Problems in the files (YAML, schema,
    vocabulary typos, dangling references, ...) come back as findings with
    ``file:line:column``; when there are any, the space is not analysed,
    because a program that does not compile has no meaning to check.
    Raises :class:`~dsv4sel.findings.VerifyError` (a ValueError) only when
    there is nothing to verify: a missing path, a directory without rule
    files.

``verify_program(program)``
    Verify a compiled Program: gaps, overlaps, redundancy, shadowed and dead
    rules, dangling ``use:`` targets, impl classes, layout ids, selection
    consistency and rewrite fixpoints, plus the coverage figures.

What counts as a finding (severity ``error`` unless noted):

* gap: inputs whose chain of tables ends in a table where no rule matches;
  one finding per compact cube, in the table that has the gap;
* overlap (hit policy unique): two rules with different outcomes match a
  common input; redundant: two rules with identical outcomes do (a
  ``warning`` under hit policy first, where overlaps are normal);
* shadowed (hit policy first): a rule that matches inputs but decides none;
* dead: a rule that matches no input at all (only dead, never also shadowed);
* dangling / cycle: a ``use:`` target without a table, or a loop;
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
The space is never enumerated point by point (see :mod:`dsv4sel.scan`).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from .check_context import CheckContext
from .check_flow import gap_findings, walk
from .check_selections import selection_findings
from .check_tables import model_findings, table_findings
from .errors import Problem, RuleError
from .findings import ERROR, Finding, Report, VerifyError

_KIND_ORDER = {k: i for i, k in enumerate((
    "load", "schema", "vocabulary", "dangling", "compile", "cycle", "dead", "overlap", "shadowed",
    "redundant", "gap", "impl", "layout", "consistency", "fixpoint", "model"))}


# ------------------------------------------------------------------ sources

def _packs_for(rules) -> list:
    """The rule packs named by ``rules`` (None: the default packs, as select() uses)."""
    from . import sources as _sources

    if rules is None:
        return _sources.default_packs()
    if isinstance(rules, (str, bytes, _sources.Pack)) or hasattr(rules, "__fspath__"):
        rules = [rules]
    packs = []
    for item in rules:
        if isinstance(item, _sources.Pack):
            packs.append(item)
            continue
        path = os.fsdecode(item)
        if not os.path.exists(path):
            raise VerifyError(f"rule path {path!r} does not exist")
        pack = _sources.directory_pack(path)
        if not pack.sources():
            raise VerifyError(f"no rule files (*.yaml, *.yml) in directory {path!r}")
        packs.append(pack)
    if not packs:
        raise VerifyError("no rule paths given")
    return _sources.unique_packs(packs)  # as load_rules: a directory reached twice loads once


def _packs_of_ruleset(ruleset) -> list:
    """The packs a RuleSet was compiled from, proven by its content hash.

    A RuleSet keeps only its files' display names; the default packs, or one
    directory pack per directory of those names, are tried, and accepted only
    when they hash to the RuleSet's digest, so a verified RuleSet is always
    the one that was loaded."""
    from . import sources as _sources

    default = _sources.default_packs()
    known = {s.display for p in default for s in p.sources()}
    def dirs(names):
        return [_sources.directory_pack(d) for d in dict.fromkeys(os.path.dirname(n) or "." for n in names)]
    # the default set; directory packs alone (--only-rules); the default set plus directory packs (--rules)
    candidates = [default, dirs(ruleset.sources), [*default, *dirs(n for n in ruleset.sources if n not in known)]]
    for packs in candidates:
        srcs = [s for p in packs for s in p.sources()]
        if tuple(s.display for s in srcs) != tuple(ruleset.sources):
            continue
        if _sources.content_hash(srcs, tuple(ruleset.allowed_impl_modules)) == ruleset.digest:
            return packs
    raise VerifyError("cannot find the rule files this RuleSet was compiled from (or they changed "
                      "since it was loaded); pass their paths to verify() instead")


def _problem(problem: Problem, kind: str | None = None) -> Finding:
    """A finding for a stage's problem; its kind is its code's (:data:`dsv4sel.codes.CODES`)."""
    from .codes import CODES

    kind = kind or CODES.get(problem.code, ("compile",))[0]
    return Finding(ERROR, kind, problem.message, problem.file, problem.line, problem.column, code=problem.code)


def verify(rules=None, *, allowed_impl_modules=None) -> Report:
    """Verify rule files (or a RuleSet or Program); see the module docstring."""
    from .values import DEFAULT_ALLOWED_IMPL_MODULES
    from .model import Program
    from .ruleset import RuleSet

    if isinstance(rules, Program):
        return verify_program(rules)
    packs = _packs_of_ruleset(rules) if isinstance(rules, RuleSet) else _packs_for(rules)
    srcs = [s for pack in packs for s in pack.sources()]
    if isinstance(allowed_impl_modules, str):
        allowed_impl_modules = (allowed_impl_modules,)
    # as load_rules: allowed_impl_modules adds to the default allow-list
    base = (*DEFAULT_ALLOWED_IMPL_MODULES, *(allowed_impl_modules or ()),
            *(rules.allowed_impl_modules if isinstance(rules, RuleSet) else ()))
    # as load_rules does: a pack may name impl classes inside its own package
    allowed = tuple(dict.fromkeys((*base, *(m for pack in packs for m in pack.impl_modules))))
    from .build import load_source
    from .compile import compile_files

    findings: list[Finding] = []
    files = []
    for src in srcs:
        loaded, problems, schema = load_source(src)
        findings.extend(_problem(p, "load") for p in problems)
        findings.extend(_problem(p, "schema") for p in schema)
        if loaded is not None and not problems and not schema:
            files.append(loaded)
    displays = tuple(s.display for s in srcs)
    if findings:  # later stages would only report consequences of these
        return Report(displays, _sorted(findings), None, analysed=False)
    try:
        program = compile_files(files, allowed_impl_modules=allowed,
                                packs={s.display: s.pack for s in srcs})
    except RuleError as exc:
        return Report(displays, _sorted(_problem(p) for p in exc.problems),
                      None, analysed=False)
    return verify_program(program)


def verify_program(program, *, layouts: Mapping[str, Any] | None = None) -> Report:
    """Verify a compiled :class:`~dsv4sel.model.Program`.

    ``layouts`` replaces ``dsv4sel.kernels.layouts.LAYOUTS`` (name -> object
    with ``bytes_per_token`` and ``torch_dtype_name``), e.g. for rule packs
    with their own kernels. Never raises for problems in the program: they
    are findings. The checks are functions of one
    :class:`~dsv4sel.check_context.CheckContext` that yield findings: per table
    (:mod:`dsv4sel.check_tables`), through the chains
    (:mod:`dsv4sel.check_flow`), per selection (:mod:`dsv4sel.check_selections`).
    """
    ctx = CheckContext(program, layouts)
    findings: list[Finding] = []
    for table in ctx.flow.tables.values():
        findings.extend(table_findings(ctx, table))
    walked = walk(ctx)
    findings.extend(walked.chain_findings)
    findings.extend(gap_findings(ctx, walked.gaps))
    findings.extend(selection_findings(ctx, walked.regions, walked.examples))
    findings.extend(model_findings(ctx))
    return Report(tuple(program.sources), _sorted(findings), walked.coverage,
                  rule_count=len(program.rules), table_count=len(ctx.flow.tables))


def _sorted(findings) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (f.file, f.line, f.column or 0,
                                                 _KIND_ORDER.get(f.kind, 99), f.message)))
