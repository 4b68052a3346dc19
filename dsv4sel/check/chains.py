"""Checks through the chains of tables: coverage, gaps and broken chains.

:func:`walk` follows every request (no backend, then each backend) through
its chain of tables cube by cube (:class:`dsv4sel.engine.flow.Flow`) once, and
returns what the other checks need: the coverage figures, the gap cubes,
and the regions of the selecting rules. Gaps of several requests merge into
one compact cube per table."""

from __future__ import annotations

from typing import Iterator, NamedTuple

from .context import CheckContext, table_label
from .tables import pack_order
from .findings import ERROR, WARNING, BackendCoverage, Counts, Coverage, Finding, RuleCoverage
from ..engine.locations import location
from ..engine.scan import TableIndex, scan
from ..engine.space import iter_bits, merge


class Walk(NamedTuple):
    """What one walk of every request found."""

    coverage: Coverage
    #: (table, box, start, frozenset of routing rule refs) of every gap cube
    gaps: list
    #: (start, label, rule, box) of the selecting rules checked region by region
    regions: list
    #: id(rule) -> (rule, start, box): one input of each other selecting rule
    examples: dict
    #: dangling and cyclic chains (a hand-built Program may have them)
    chain_findings: list
    #: id(default rule) -> [rule, inputs it routes, inputs of them selected, the boxes it routes]
    routes: dict


def walk(ctx: CheckContext) -> Walk:
    program, flow = ctx.program, ctx.flow
    per_rule: dict[int, int] = {}
    backends = []
    totals = {"select": 0, "reject": 0, "undecided": 0}
    gaps: list[tuple] = []
    regions: list[tuple] = []
    examples: dict[int, tuple] = {}
    chains: dict[tuple, Finding] = {}
    routes: dict[int, list] = {}
    for start in ctx.starts:
        counts = {"select": 0, "reject": 0, "undecided": 0}
        for ev in flow.walk(start):
            if ev.kind == "decide":
                counts[ev.rule.outcome.kind] += ev.count
                per_rule[id(ev.rule)] = per_rule.get(id(ev.rule), 0) + ev.count
                if ev.rule.outcome.kind == "select":
                    _selected(ev, start, flow, routes, regions, examples)
            elif ev.kind == "route":
                per_rule[id(ev.rule)] = per_rule.get(id(ev.rule), 0) + ev.count
                if start is None and not ev.path:  # a rule of the default-backend decision
                    routes[id(ev.rule)] = [ev.rule, ev.count, 0, ev.scan.regions[ev.position]]
            elif ev.kind == "gap":
                counts["undecided"] += ev.count
                gaps.append((ev.table, ev.box, start, frozenset(r.ref for r in ev.path)))
            else:  # dangling or cycle: the compiler rejects both; a hand-built Program may not
                counts["undecided"] += ev.count
                chains.setdefault((ev.kind, ev.rule.ref), _chain_finding(ctx, ev, start))
        table = flow.start_table(start)
        backends.append(BackendCoverage(start, table.name, table.file, Counts(**counts)))
        for k in totals:
            totals[k] += counts[k]
    coverage = Coverage(ctx.space.size(ctx.space.full), len(ctx.starts), Counts(**totals),
                        tuple(backends), _rule_coverage(program, flow, per_rule))
    return Walk(coverage, gaps, regions, examples, list(chains.values()), routes)


def _selected(ev, start, flow, routes: dict, regions: list, examples: dict) -> None:
    """Records a select decision: on the route that led there (a default rule's), and as the
    rule's regions (when they are checked region by region) or else one example input."""
    if start is None and ev.path:
        routes[id(ev.path[0])][2] += ev.count
    if ev.position in flow.record[ev.table.name]:
        for box in ev.scan.regions[ev.position]:
            regions.append((start, ev.label, ev.rule, box))
    elif id(ev.rule) not in examples:
        examples[id(ev.rule)] = (ev.rule, start, ev.scan.first[ev.position])


def _rule_coverage(program, flow, per_rule: dict[int, int]) -> tuple[RuleCoverage, ...]:
    """Each rule's inputs (``per_rule``, from the walk) and its first-match points in its own table."""
    won = {}
    for table in flow.tables.values():
        full = flow.table_scan(table)
        for r, rule in enumerate(table.rules):
            won[id(rule)] = full.won[r]
    return tuple(RuleCoverage(rule.ref, rule.table, rule.outcome.kind, per_rule.get(id(rule), 0),
                              won.get(id(rule), 0)) for rule in program.rules)


def hijack_findings(ctx: CheckContext, routes) -> Iterator[Finding]:
    """A warning for each default rule whose target table rejects every input it routes there,
    when another backend, requested, would serve one of them (the warning names it).

    Nothing else catches this: the inputs are decided (no gap), once (no overlap), and the rule
    wins (not shadowed), yet a query without --attention-backend that some backend would serve
    is refused. Typically a pack's ``override: true`` on too wide a ``when:`` (``capability:
    [8.x, 9.x]`` for a SM12x backend), which takes the inputs away from the shipped default.
    """
    for rule, count, selected, boxes in routes.values():
        target = rule.outcome.target
        table = ctx.program.tables.get(target)
        if selected or table is None:  # no table: a dangling `use:`, its own finding
            continue
        example, served = _served_example(ctx, rule, boxes)
        if not served:
            continue  # no backend serves them: the routing loses nothing
        yield ctx.finding(
            WARNING, "hijack",
            f"rule {rule.ref.id} sends {count} inputs to {target}, whose table rejects every one of them "
            f"(e.g. {example}{served}): a query without --attention-backend there gets no backend; narrow "
            f"{rule.ref.id}'s `when:` to the inputs {target} serves"
            + (", or drop its `override: true`" if _overrides(ctx, rule) else ""),
            rule.ref, rules=(rule.ref,), count=count, counterexample=example, table=table.name)


def _served_example(ctx: CheckContext, rule, boxes):
    """An input ``rule`` routes (its regions ``boxes``) that another backend's table would
    select when requested, with that backend and rule (what the operator lost); else no text."""
    for box in boxes:
        for backend in ctx.program.backends:
            if backend == rule.outcome.target:
                continue
            for ev in ctx.flow.walk(backend, box):
                if ev.kind == "decide" and ev.rule.outcome.kind == "select":
                    return (ctx.input(ev.scan.first[ev.position], None), f", which --attention-backend "
                            f"{backend} serves with {ev.rule.ref.id} ({location(ev.rule.ref)})")
    return ctx.input(boxes[0], None), ""


def _overrides(ctx: CheckContext, rule) -> bool:
    """Whether ``rule`` comes before default rules of packs loaded earlier (``override: true``)."""
    order = pack_order(ctx.program)
    rules = ctx.program.default_table.rules
    later = rules[rules.index(rule) + 1:]
    return any(order[r.ref.pack] < order[rule.ref.pack] for r in later)



class _Lost(NamedTuple):
    """Inputs a pack's default rule took from an earlier pack's default, which served them."""

    box: tuple
    #: the rule that rejects them now (the pack's default rule itself, or its target's rule)
    rejecting: object
    #: the earlier pack's default rule that decided them before, and the rule that then selected
    before: object
    selecting: object


def takeover_findings(ctx: CheckContext, skip=frozenset()) -> Iterator[Finding]:
    """A warning (DSV414) for each default rule of a pack that takes inputs the default rules
    of earlier packs served (a query without --attention-backend got a backend) and turns them
    into rejections, with the count, one such input, the rule that served it and the rule that
    rejects it now.

    Typically an ``override: true`` widened past the inputs its target serves (``capability:
    [8.x, 9.x]`` for a SM8x backend: every H100 loses FlashMLA), which :func:`hijack_findings`
    does not see when the target serves some of them. A rule it already reports (``skip``:
    their refs) gets no second finding. Exact over cubes: the earlier packs' rules are scanned
    over the rejected cubes only, and their chains followed as the walk follows them."""
    table = ctx.program.default_table
    order = pack_order(ctx.program)
    # the rules before a rule of an earlier pack (`override: true`): only they can take inputs
    # another pack's default decided; any other rule gets only inputs no earlier pack's rule matched
    ranks = [order[rule.ref.pack] for rule in table.rules]
    lowest_after = [len(order)] * len(ranks)  # the earliest pack among the rules after each one
    for r in range(len(ranks) - 2, -1, -1):
        lowest_after[r] = min(lowest_after[r + 1], ranks[r + 1])
    taking = {r: [o for o in table.rules[r + 1:] if order[o.ref.pack] < ranks[r]]
              for r, rule in enumerate(table.rules)
              if lowest_after[r] < ranks[r] and rule.ref not in skip and rule.outcome.kind in ("use", "reject")}
    if not taking:
        return  # one pack, or no override: nothing to scan
    full = ctx.flow.table_scan(table, detail=True)
    for r, earlier in taking.items():
        rule = table.rules[r]
        index = TableIndex(ctx.space, [o.conditions for o in earlier])
        lost = [item for box in full.regions.get(r, ()) for item in _lost(ctx, rule, box, earlier, index)]
        if lost:
            yield _takeover_finding(ctx, rule, lost, full.won[r])


def _lost(ctx: CheckContext, rule, box, earlier: list, index: TableIndex) -> Iterator[_Lost]:
    """The cubes of ``box`` (where ``rule`` wins) that ``rule`` gets rejected and the ``earlier``
    rules (those of earlier packs, in table order; ``index`` their masks) got selected."""
    if rule.outcome.kind == "reject":
        rejected = [(box, rule)]
    else:
        target = ctx.program.tables.get(rule.outcome.target)
        if target is None:
            return  # a dangling `use:`: its own finding
        rejected = [(b, r) for b, r in _decided(ctx, target, box, ()) if r.outcome.kind == "reject"]
    for region, rejecting in rejected:
        before = scan(index, region)
        for position, cubes in before.regions.items():
            default = earlier[position]
            target = ctx.program.tables.get(default.outcome.target) if default.outcome.kind == "use" else None
            if target is None:
                continue  # rejected (or dangling) before, too
            for cube in cubes:
                for selected, selecting in _decided(ctx, target, cube, ()):
                    if selecting.outcome.kind == "select":
                        yield _Lost(selected, rejecting, default, selecting)


def _decided(ctx: CheckContext, table, box, seen: tuple) -> Iterator[tuple]:
    """``(cube, rule)`` for each cube of ``box`` a rule of ``table``'s chain decides (select or
    reject), following `use:` as the walk does; gaps, dangling targets and loops decide nothing."""
    found = ctx.flow.table_scan(table, box, detail=True)
    for position, cubes in found.regions.items():
        rule = table.rules[position]
        if rule.outcome.kind != "use":
            yield from ((cube, rule) for cube in cubes)
            continue
        target = ctx.program.tables.get(rule.outcome.target)
        if target is None or target.name in seen or target is table:
            continue
        for cube in cubes:
            yield from _decided(ctx, target, cube, (*seen, table.name))


def _takeover_finding(ctx: CheckContext, rule, lost: list, taken: int) -> Finding:
    count = sum(ctx.space.size(item.box) for item in lost)
    first = lost[0]
    example = ctx.input(first.box, None)
    where = (f"sends them to {rule.outcome.target}, whose table rejects them" if rule.outcome.kind == "use"
             else "rejects them")
    now = "" if first.rejecting is rule else f"; now {first.rejecting.ref.id} ({location(first.rejecting.ref)}) rejects it"
    fix = (f"narrow {rule.ref.id}'s `when:` to the inputs {rule.outcome.target} serves" if rule.outcome.kind == "use"
           else f"narrow {rule.ref.id}'s `when:` to the inputs it should refuse")
    return ctx.finding(
        WARNING, "takeover",
        f"rule {rule.ref.id} turns {count} inputs that earlier packs' default rules served into rejections (of "
        f"the {taken} inputs it takes): it {where} (e.g. {example}: {first.before.ref.id} "
        f"({location(first.before.ref)}) chose {first.before.outcome.target}, which selects it with "
        f"{first.selecting.ref.id} ({location(first.selecting.ref)}){now}): a query without --attention-backend "
        f"there no longer gets a backend; {fix}" + (", or drop its `override: true`" if _overrides(ctx, rule) else ""),
        rule.ref, rules=(rule.ref, first.before.ref, first.selecting.ref), count=count, counterexample=example,
        table=rule.outcome.target if rule.outcome.kind == "use" else rule.table)


def _chain_finding(ctx: CheckContext, ev, start) -> Finding:
    """One finding per broken ``use:`` rule, not one per region."""
    rule = ev.rule
    if ev.kind == "dangling":
        text = f"rule {rule.ref.id}: `use: {rule.outcome.target}` names a backend without a table"
    else:
        text = (f"rule {rule.ref.id}: `use: {rule.outcome.target}` loops back: "
                + " -> ".join(r.ref.id for r in ev.path))
    return ctx.finding(ERROR, ev.kind, text, rule.ref, rules=tuple(r.ref for r in ev.path), count=ev.count,
                       counterexample=ctx.input(ev.box, start), table=ev.table.name)


def gap_findings(ctx: CheckContext, gaps) -> Iterator[Finding]:
    """One finding per compact gap cube, located at the table that has the gap."""
    # one backend "dimension" more, so that gaps of several requested
    # backends merge into one cube: backend=<none>,FLASHMLA_SPARSE_DSV4
    writer, space = ctx.writer, ctx.space
    position = {b: i for i, b in enumerate(writer.backend_domain)}
    by_table: dict[str, list] = {}
    tables = {}
    for table, box, start, routes in gaps:
        tables[table.name] = table
        by_table.setdefault(table.name, []).append((box + (1 << position[start],), routes))
    for name, items in by_table.items():
        table = tables[name]
        for box, routes in merge(items):
            starts = [writer.backend_domain[i] for i in iter_bits(box[-1])]
            inner = box[:-1]
            cubes = tuple(writer.cubes(inner, starts))
            count = space.size(inner) * len(starts)
            refs = tuple(sorted(routes, key=lambda r: (r.file, r.line)))
            via = (" (routed there by " + ", ".join(f"{r.id} ({location(r)})" for r in refs) + ")"
                   if refs else "")
            yield Finding(
                ERROR, "gap", f"no rule of {table_label(table)} decides {count} inputs{via}: "
                + "; ".join(c.text for c in cubes), table.file, table.line, None, rules=refs,
                counterexample=ctx.input(inner, starts[0]), cubes=cubes, count=count, table=name)
