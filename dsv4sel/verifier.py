"""Prove rule files decide every input exactly once, or say where they do not.

Two entry points, both exported lazily from :mod:`dsv4sel`:

``verify(rules=None, *, allowed_impl_modules=None)``
    Load, schema-check and compile rule files, then verify the program.
    ``rules`` is what :func:`dsv4sel.load_rules` takes: None (the default
    rule set: shipped rules, installed packs, ``DSV4SEL_RULES_PATH``), or a
    list of rule packs (directories, files, :class:`dsv4sel.sources.Pack`);
    or a :class:`~dsv4sel.ruleset.RuleSet` (its source files are re-read and
    must still hash to the RuleSet's digest); or a compiled
    :class:`~dsv4sel.compile.Program`. Problems in the files (YAML, schema,
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

from .cubes import CubeWriter
from .errors import Problem, RuleError
from .findings import (ERROR, WARNING, BackendCoverage, Counts, Coverage, Finding, Report,
                       RuleCoverage, VerifyError)
from .flow import Flow
from .outcomes import SELECTION_FIELDS, FieldChecker, needs_regions, placeholders, render_fields
from .scan import intersect_masks
from .space import Space, first_bits, iter_bits, merge

KV = "kv_cache_dtype"
#: Overlapping pairs reported one by one per rule; the rest are named in one more finding.
PAIRS_PER_RULE = 5
#: Rules named (in ``Finding.rules``) by that finding.
MORE_NAMED = 20
#: Detailed pair findings per table; past that, one naming finding per rule.
PAIR_DETAILS = 1000
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
    from .compile import Program
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
    """Verify a compiled :class:`~dsv4sel.compile.Program`.

    ``layouts`` replaces ``dsv4sel.kernels.layouts.LAYOUTS`` (name -> object
    with ``bytes_per_token`` and ``torch_dtype_name``), e.g. for rule packs
    with their own kernels. Never raises for problems in the program: they
    are findings.
    """
    return _Verifier(program, layouts).run()


def _sorted(findings) -> tuple[Finding, ...]:
    return tuple(sorted(findings, key=lambda f: (f.file, f.line, f.column or 0,
                                                 _KIND_ORDER.get(f.kind, 99), f.message)))


def _outcome_key(outcome) -> tuple:
    """A hashable identity of an outcome (fields hold a dict of rewrites)."""
    fields = tuple((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in outcome.fields)
    return (outcome.kind, fields, outcome.target, outcome.reason, outcome.messages)


def _table_label(table) -> str:
    return "the default-backend decision" if not table.backends else f"table {table.name}"


class _Verifier:
    def __init__(self, program, layouts):
        self.program = program
        self.space = Space(program.inputs)
        self.writer = CubeWriter(self.space, program.inputs, program.backends)
        self.flow = Flow(program, self.space, needs=needs_regions)
        self.checker = FieldChecker(tuple(program.allowed_impl_modules), layouts)
        self.findings: list[Finding] = []
        self.starts: tuple[str | None, ...] = (None, *program.backends)
        self.has_kv = KV in program.inputs
        self._chains: set[tuple] = set()
        self._details: dict[str, int] = {}  # table -> detailed pair findings left

    # ------------------------------------------------------------ helpers
    def _requests(self, table) -> tuple[str | None, ...]:
        """The backends whose requests consult ``table`` first."""
        return tuple(table.backends) if table.backends else (None,)

    def _input(self, box, backend):
        return self.writer.input(self.space.first_point(box), backend)

    def _add(self, severity, kind, message, ref, **extra) -> None:
        self.findings.append(Finding(severity, kind, message, ref.file, ref.line, None, **extra))

    # -------------------------------------------------------------- driver
    def run(self) -> Report:
        program = self.program
        for table in self.flow.tables.values():
            self._table_findings(table)
        coverage, gaps, regions, examples = self._walk_all()
        self._gap_findings(gaps)
        self._selection_findings(regions, examples)
        self._model_findings()
        return Report(tuple(program.sources), _sorted(self.findings), coverage,
                      rule_count=len(program.rules), table_count=len(self.flow.tables))

    # ------------------------------------------------- one table at a time
    def _table_findings(self, table) -> None:
        index = self.flow.indexes[table.name]
        full = self.flow.table_scan(table)
        masks = intersect_masks(index)
        same: dict[tuple, int] = {}
        keys = []
        for r, rule in enumerate(table.rules):
            key = _outcome_key(rule.outcome)
            keys.append(key)
            same[key] = same.get(key, 0) | (1 << r)
        requests = self._requests(table)
        for r, rule in enumerate(table.rules):
            box = index.boxes[r]
            if not all(box):
                self._add(ERROR, "dead", f"rule {rule.ref.id} matches no input: {self._why_empty(box)}",
                          rule.ref, rules=(rule.ref,), table=table.name)
                continue
            later = masks[r] >> (r + 1) << (r + 1)
            identical = later & same[keys[r]]
            if table.hit_policy.overlap_is_error:
                self._pair_findings(table, r, later & ~identical, "overlap", requests)
            # under first, overlaps are how the table works; only identical outcomes are suspect
            self._pair_findings(table, r, identical, "redundant", requests)
            if table.hit_policy.can_shadow and not full.won[r]:
                self._shadow_finding(table, r, masks[r] & ((1 << r) - 1), requests)

    def _why_empty(self, box) -> str:
        for d, bits in zip(self.space.dims, box):
            if bits:
                continue
            if len(d.inputs) == 1:
                return f"its condition on {d.inputs[0]} accepts no declared value"
            return ("no declared combination of " + " and ".join(d.inputs)
                    + " satisfies its conditions (values scoped by " + d.inputs[0] + ")")
        return "empty"  # pragma: no cover - only called for empty boxes

    def _pair_findings(self, table, r, partners: int, kind: str, requests) -> None:
        """One finding per pair, with the cube both rules match, for the first
        :data:`PAIRS_PER_RULE` later rules ``r`` overlaps; then one finding
        naming the rest. After :data:`PAIR_DETAILS` detailed pairs in a table,
        every rule gets only the naming finding: a table where each rule
        meets thousands of others still gives a report of bounded size."""
        if not partners:
            return
        index = self.flow.indexes[table.name]
        a = table.rules[r]
        severity = WARNING if kind == "redundant" and not table.hit_policy.redundancy_is_error else ERROR
        budget = self._details.get(table.name, PAIR_DETAILS)
        detailed = min(PAIRS_PER_RULE, budget)
        chosen = first_bits(partners, detailed + MORE_NAMED)
        listed = 0
        rest = chosen[detailed:]
        for s in chosen[:detailed]:
            listed += 1
            b = table.rules[s]
            inter = self.space.intersect(index.boxes[r], index.boxes[s])
            cubes = tuple(self.writer.cubes(inter, requests))
            count = self.space.size(inter) * len(requests)
            where = "; ".join(c.text for c in cubes)
            if kind == "redundant":
                text = (f"rules {a.ref.id} and {b.ref.id} ({b.ref.location}) have identical outcomes and "
                        f"both match {count} inputs of {_table_label(table)}: {where}")
            else:
                text = (f"rules {a.ref.id} and {b.ref.id} ({b.ref.location}) both match {count} inputs of "
                        f"{_table_label(table)}, whose hit policy is unique: {where}")
            self._add(severity, kind, text, a.ref, rules=(a.ref, b.ref), cubes=cubes, count=count,
                      counterexample=self._input(inter, requests[0]), table=table.name)
        self._details[table.name] = budget - listed
        if rest:
            total = partners.bit_count() - listed
            refs = tuple(table.rules[s].ref for s in rest)
            named = ", ".join(f"{ref.id} ({ref.location})" for ref in refs[:3])
            more = f" and {total - 3} more" if total > 3 else ""
            what = "with identical outcomes " if kind == "redundant" else ""
            also = "also " if listed else ""
            inter = self.space.intersect(index.boxes[r], index.boxes[rest[0]])
            self._add(severity, kind, f"rule {a.ref.id} {also}overlaps {total} later rules {what}of "
                      f"{_table_label(table)}: {named}{more}", a.ref, rules=(a.ref, *refs), table=table.name,
                      counterexample=self._input(inter, requests[0]))

    def _shadow_finding(self, table, r, earlier: int, requests) -> None:
        index = self.flow.indexes[table.name]
        rule = table.rules[r]
        box = index.boxes[r]
        refs = [table.rules[s].ref for s in first_bits(earlier, 3)]
        names = ", ".join(f"{ref.id} ({ref.location})" for ref in refs)
        n = earlier.bit_count()
        more = f" and {n - 3} more" if n > 3 else ""
        count = self.space.size(box) * len(requests)
        fix = ""
        if not table.backends and any(ref.pack != rule.ref.pack for ref in refs):
            fix = (f"; to take precedence over the default rules of earlier packs, give {rule.ref.id} "
                   "`override: true`")
        self._add(ERROR, "shadowed",
                  f"rule {rule.ref.id} never decides an input: earlier rules decide all {count} inputs "
                  f"it matches ({names}{more}); hit policy first{fix}",
                  rule.ref, rules=(rule.ref, *refs), count=count,
                  counterexample=self._input(box, requests[0]), table=table.name)

    def _model_findings(self) -> None:
        """A warning for each backend table that selects but never tests
        ``model`` while the vocabulary declares several models: requested
        with --attention-backend, it serves every model, e.g. a V4.0 kernel
        for a V4.1 query."""
        decl = self.program.inputs.get("model")
        if decl is None or len(decl.values) < 2:
            return
        own = decl.default or decl.values[0]
        for table in self.flow.tables.values():
            if not table.backends or not any(r.outcome.kind == "select" for r in table.rules):
                continue
            if any(name == "model" for r in table.rules for name, _ in r.conditions):
                continue
            first = table.rules[0].ref
            stem = table.backends[0].lower().replace("_", "-")
            self.findings.append(Finding(
                WARNING, "model",
                f"table {table.name} never tests `model`, so it selects for every declared model "
                f"({', '.join(decl.values)}) when its backend is requested; if it serves only {own}, make its "
                f"first rule `- {{id: {stem}-other-model, when: {{model: {{not: {own}}}}}, reject: {{reason: "
                f"{table.backends[0]} serves {own} only, not {{model}}.}}}}`, or add a `model:` condition to "
                "its select rules", table.file, table.line, None, rules=(first,), table=table.name))

    # ------------------------------------------------ through the chains
    def _walk_all(self):
        program = self.program
        per_rule: dict[int, int] = {}
        backends = []
        totals = {"select": 0, "reject": 0, "undecided": 0}
        gaps: list[tuple] = []
        regions: list[tuple] = []  # (start, label, rule, box) for rules checked per region
        examples: dict[int, tuple] = {}  # id(rule) -> (rule, start, box) for the others
        for start in self.starts:
            counts = {"select": 0, "reject": 0, "undecided": 0}
            for ev in self.flow.walk(start):
                if ev.kind == "decide":
                    counts[ev.rule.outcome.kind] += ev.count
                    per_rule[id(ev.rule)] = per_rule.get(id(ev.rule), 0) + ev.count
                    if ev.rule.outcome.kind != "select":
                        continue
                    if ev.position in self.flow.record[ev.table.name]:
                        for box in ev.scan.regions[ev.position]:
                            regions.append((start, ev.label, ev.rule, box))
                    elif id(ev.rule) not in examples:
                        examples[id(ev.rule)] = (ev.rule, start, ev.scan.first[ev.position])
                elif ev.kind == "route":
                    per_rule[id(ev.rule)] = per_rule.get(id(ev.rule), 0) + ev.count
                elif ev.kind == "gap":
                    counts["undecided"] += ev.count
                    gaps.append((ev.table, ev.box, start, frozenset(r.ref for r in ev.path)))
                else:  # dangling or cycle: the compiler rejects both; a hand-built Program may not
                    counts["undecided"] += ev.count
                    self._chain_finding(ev, start)
            table = self.flow.start_table(start)
            backends.append(BackendCoverage(start, table.name, table.file, Counts(**counts)))
            for k in totals:
                totals[k] += counts[k]
        won = {}
        for table in self.flow.tables.values():
            full = self.flow.table_scan(table)
            for r, rule in enumerate(table.rules):
                won[id(rule)] = full.won[r]
        rules = [RuleCoverage(rule.ref, rule.table, rule.outcome.kind, per_rule.get(id(rule), 0),
                              won.get(id(rule), 0)) for rule in program.rules]
        coverage = Coverage(self.space.size(self.space.full), len(self.starts), Counts(**totals),
                            tuple(backends), tuple(rules))
        return coverage, gaps, regions, examples

    def _chain_finding(self, ev, start) -> None:
        rule = ev.rule
        if ev.kind == "dangling":
            text = f"rule {rule.ref.id}: `use: {rule.outcome.target}` names a backend without a table"
        else:
            text = (f"rule {rule.ref.id}: `use: {rule.outcome.target}` loops back: "
                    + " -> ".join(r.ref.id for r in ev.path))
        key = (ev.kind, rule.ref)
        if key in self._chains:  # one finding per rule, not one per region
            return
        self._chains.add(key)
        self._add(ERROR, ev.kind, text, rule.ref, rules=tuple(r.ref for r in ev.path), count=ev.count,
                  counterexample=self._input(ev.box, start), table=ev.table.name)

    def _gap_findings(self, gaps) -> None:
        # one backend "dimension" more, so that gaps of several requested
        # backends merge into one cube: backend=<none>,FLASHMLA_SPARSE_DSV4
        position = {b: i for i, b in enumerate(self.writer.backend_domain)}
        by_table: dict[str, list] = {}
        tables = {}
        for table, box, start, routes in gaps:
            tables[table.name] = table
            by_table.setdefault(table.name, []).append((box + (1 << position[start],), routes))
        for name, items in by_table.items():
            table = tables[name]
            for box, routes in merge(items):
                starts = [self.writer.backend_domain[i] for i in iter_bits(box[-1])]
                inner = box[:-1]
                cubes = tuple(self.writer.cubes(inner, starts))
                count = self.space.size(inner) * len(starts)
                refs = tuple(sorted(routes, key=lambda r: (r.file, r.line)))
                via = (" (routed there by " + ", ".join(f"{r.id} ({r.location})" for r in refs) + ")"
                       if refs else "")
                self.findings.append(Finding(
                    ERROR, "gap", f"no rule of {_table_label(table)} decides {count} inputs{via}: "
                    + "; ".join(c.text for c in cubes), table.file, table.line, None, rules=refs,
                    counterexample=self._input(inner, starts[0]), cubes=cubes, count=count, table=name))

    # --------------------------------------------------------- selections
    def _selection_findings(self, regions, examples) -> None:
        reported: dict[tuple, list] = {}

        impls: dict[str, list] = {}  # one finding per unresolvable impl, naming every rule that selects it

        def report(kind, message, rule, start, box, count=0, extra_rules=()):
            key = (kind, rule.ref, message)
            slot = reported.get(key)
            if slot is None:
                reported[key] = [count, rule, start, box, extra_rules]
            else:
                slot[0] += count

        def field_problems(rule, start, box, fields):
            for kind, message in self.checker.field_problems(fields):
                if kind == "impl":
                    slot = impls.setdefault(message, [rule, start, box, []])
                    if rule.ref not in slot[3]:
                        slot[3].append(rule.ref)
                else:
                    report(kind, f"rule {rule.ref.id}: {message}", rule, start, box)

        for rule, start, box in examples.values():
            fields, _ = render_fields(rule, {})
            field_problems(rule, start, box, fields)
        for start, label, rule, box in regions:
            names = placeholders(rule) - {"backend"}
            for assignment, sub in self.space.split_by(box, names):
                values = dict(assignment, backend=label or "")
                fields, rewrites = render_fields(rule, values)
                field_problems(rule, start, sub, fields)
                if "cache_dtype" in rewrites and self.has_kv:
                    self._fixpoint(rule, start, label, sub, fields, rewrites, report)
        if self.checker.layout_error:
            first = next(iter(examples.values()), None) or next(
                ((r, s, b) for s, _, r, b in regions), None)
            if first:
                report("layout", self.checker.layout_error, first[0], first[1], first[2])
        for message, (rule, start, box, refs) in impls.items():
            refs = sorted(refs, key=lambda r: (r.file, r.line))
            who = (f"rule {refs[0].id}" if len(refs) == 1 else
                   f"rules {', '.join(r.id for r in refs[:3])}" + (f" and {len(refs) - 3} more" if len(refs) > 3 else ""))
            self._add(ERROR, "impl", f"{who}: {message}", refs[0], rules=tuple(refs),
                      counterexample=self._input(box, start), table=rule.table)
        for (kind, ref, message), (count, rule, start, box, extra) in reported.items():
            self._add(ERROR, kind, message, ref, rules=(ref, *extra), count=count,
                      counterexample=self._input(box, start), table=rule.table)

    def _fixpoint(self, rule, start, label, sub, fields, rewrites, report) -> None:
        """Re-select every input of ``sub`` with kv_cache_dtype = the rewritten
        cache dtype; the result must be the same selection, rewriting nothing new."""
        space = self.space
        target = rewrites["cache_dtype"]
        declared = self.program.inputs[KV].values
        if target not in declared:
            from .compile import nearest

            report("fixpoint", f"rule {rule.ref.id} rewrites cache_dtype to {target!r}, which is not a "
                   f"declared {KV} value, so the result cannot be selected again" + nearest(target, declared),
                   rule, start, sub, space.size(sub))
            return
        moved = [v for v in space.project(sub, KV) if v != target]
        if not moved:
            return  # the rewrite is a no-op on every input here
        orig = space.restrict(sub, KV, moved)
        image = space.substitute(orig, KV, target)
        if image is None:
            report("fixpoint", f"rule {rule.ref.id} rewrites cache_dtype to {target!r}, but {KV}={target} "
                   "is not a declared input together with the other inputs", rule, start, orig,
                   space.size(orig))
            return
        again = f"selecting again with {KV}={target} (the rewritten cache dtype)"

        def preimage(box):
            point = space.first_point(box)
            for v in moved:
                cube = space.point_cube({**point, KV: v})
                if cube is not None and all(c & o == c for c, o in zip(cube, orig)):
                    return cube
            return orig  # pragma: no cover - every image point has a preimage

        for ev in self.flow.walk(start, image, detail=True):
            if ev.kind in ("route",):
                continue
            if ev.kind != "decide":
                where = _table_label(ev.table)
                report("fixpoint", f"rule {rule.ref.id}: {again} is undecided (no rule of {where} matches)",
                       rule, start, preimage(ev.box), ev.count * len(moved))
                continue
            other = ev.rule
            for box in ev.scan.regions[ev.position]:
                if other.outcome.kind != "select":
                    report("fixpoint", f"rule {rule.ref.id}: {again} is rejected by {other.ref.id} "
                           f"({other.ref.location})", rule, start, preimage(box), space.size(box) * len(moved),
                           (other.ref,))
                    continue
                if ev.label != label:
                    report("fixpoint", f"rule {rule.ref.id}: {again} selects backend {ev.label} instead of "
                           f"{label} ({other.ref.id}, {other.ref.location})", rule, start, preimage(box),
                           space.size(box) * len(moved), (other.ref,))
                    continue
                names = placeholders(other) - {"backend"}
                for assignment, part in space.split_by(box, names):
                    fields2, rewrites2 = render_fields(other, dict(assignment, backend=ev.label or ""))
                    problems = [f"selects {k} {fields2[k]!r} instead of {fields[k]!r}"
                                for k in SELECTION_FIELDS if fields2[k] != fields[k]]
                    again_to = rewrites2.get("cache_dtype", target)
                    if again_to != target:
                        problems.append(f"rewrites cache_dtype again, to {again_to!r}")
                    problems += [f"rewrites {k} to {v!r} instead of {rewrites.get(k)!r}"
                                 for k, v in rewrites2.items() if k != "cache_dtype" and rewrites.get(k) != v]
                    if problems:
                        report("fixpoint", f"rule {rule.ref.id}: {again} " + "; ".join(problems)
                               + f" ({other.ref.id}, {other.ref.location})", rule, start, preimage(part),
                               space.size(part) * len(moved), (other.ref,))
