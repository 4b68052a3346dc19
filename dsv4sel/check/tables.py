"""Checks of one table at a time: dead, overlapping, redundant and shadowed
rules (per the table's hit policy), and backend tables that never test the
model. Exact over cubes: rule boxes and their pairwise intersections
(:func:`dsv4sel.engine.scan.intersect_masks`), never points."""

from __future__ import annotations

from typing import Iterator, Literal

from .context import CheckContext, table_label
from .findings import ERROR, WARNING, Finding
from ..engine.locations import location
from ..engine.scan import intersect_masks
from ..engine.space import first_bits

#: Overlapping pairs reported one by one per rule; the rest are named in one more finding.
PAIRS_PER_RULE = 5
#: Rules named (in ``Finding.rules``) by that finding.
MORE_NAMED = 20
#: Detailed pair findings per table; past that, one naming finding per rule.
PAIR_DETAILS = 1000


def _outcome_key(outcome) -> tuple:
    """A hashable identity of an outcome (fields hold a dict of rewrites)."""
    fields = tuple((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in outcome.fields)
    return (outcome.kind, fields, outcome.target, outcome.reason, outcome.messages)


def table_findings(ctx: CheckContext, table) -> Iterator[Finding]:
    """Dead, overlapping (``unique``), redundant and shadowed (``first``) rules of ``table``."""
    index = ctx.flow.indexes[table.name]
    full = ctx.flow.table_scan(table)
    masks = intersect_masks(index)
    same: dict[tuple, int] = {}
    keys = []
    for r, rule in enumerate(table.rules):
        key = _outcome_key(rule.outcome)
        keys.append(key)
        same[key] = same.get(key, 0) | (1 << r)
    requests = ctx.requests(table)
    budget = [PAIR_DETAILS]  # detailed pair findings left in this table
    for r, rule in enumerate(table.rules):
        box = index.boxes[r]
        if not all(box):
            yield ctx.finding(ERROR, "dead", f"rule {rule.ref.id} matches no input: {_why_empty(ctx, box)}",
                              rule.ref, rules=(rule.ref,), table=table.name)
            continue
        later = masks[r] >> (r + 1) << (r + 1)
        identical = later & same[keys[r]]
        if table.hit_policy.overlap_is_error:
            yield from _pair_findings(ctx, table, r, later & ~identical, "overlap", requests, budget)
        # under first, overlaps are how the table works; only identical outcomes are suspect
        yield from _pair_findings(ctx, table, r, identical, "redundant", requests, budget)
        if table.hit_policy.can_shadow and not full.won[r]:
            yield _shadow_finding(ctx, table, r, masks[r] & ((1 << r) - 1), requests)


def _why_empty(ctx: CheckContext, box) -> str:
    for d, bits in zip(ctx.space.dims, box):
        if bits:
            continue
        if len(d.inputs) == 1:
            return f"its condition on {d.inputs[0]} accepts no declared value"
        return ("no declared combination of " + " and ".join(d.inputs)
                + " satisfies its conditions (values scoped by " + d.inputs[0] + ")")
    return "empty"  # pragma: no cover - only called for empty boxes


def _pair_findings(ctx: CheckContext, table, r, partners: int, kind: Literal["overlap", "redundant"], requests,
                   budget: list) -> Iterator[Finding]:
    """One finding per pair, with the cube both rules match, for the first
    :data:`PAIRS_PER_RULE` later rules ``r`` overlaps; then one finding
    naming the rest. After :data:`PAIR_DETAILS` detailed pairs in a table
    (``budget``), every rule gets only the naming finding: a table where each
    rule meets thousands of others still gives a report of bounded size."""
    if not partners:
        return
    space, index = ctx.space, ctx.flow.indexes[table.name]
    a = table.rules[r]
    severity = WARNING if kind == "redundant" and not table.hit_policy.redundancy_is_error else ERROR
    detailed = min(PAIRS_PER_RULE, budget[0])
    chosen = first_bits(partners, detailed + MORE_NAMED)
    listed = 0
    rest = chosen[detailed:]
    for s in chosen[:detailed]:
        listed += 1
        b = table.rules[s]
        inter = space.intersect(index.boxes[r], index.boxes[s])
        cubes = tuple(ctx.writer.cubes(inter, requests))
        count = space.size(inter) * len(requests)
        where = "; ".join(c.text for c in cubes)
        if kind == "redundant":
            text = (f"rules {a.ref.id} and {b.ref.id} ({location(b.ref)}) have identical outcomes and "
                    f"both match {count} inputs of {table_label(table)}: {where}")
        else:
            text = (f"rules {a.ref.id} and {b.ref.id} ({location(b.ref)}) both match {count} inputs of "
                    f"{table_label(table)}, whose hit policy is unique: {where}")
        yield ctx.finding(severity, kind, text, a.ref, rules=(a.ref, b.ref), cubes=cubes, count=count,
                          counterexample=ctx.input(inter, requests[0]), table=table.name)
    budget[0] -= listed
    if rest:
        total = partners.bit_count() - listed
        refs = tuple(table.rules[s].ref for s in rest)
        named = ", ".join(f"{ref.id} ({location(ref)})" for ref in refs[:3])
        more = f" and {total - 3} more" if total > 3 else ""
        what = "with identical outcomes " if kind == "redundant" else ""
        also = "also " if listed else ""
        inter = space.intersect(index.boxes[r], index.boxes[rest[0]])
        yield ctx.finding(severity, kind, f"rule {a.ref.id} {also}overlaps {total} later rules {what}of "
                          f"{table_label(table)}: {named}{more}", a.ref, rules=(a.ref, *refs), table=table.name,
                          counterexample=ctx.input(inter, requests[0]))


def _shadow_finding(ctx: CheckContext, table, r, earlier: int, requests) -> Finding:
    index = ctx.flow.indexes[table.name]
    rule = table.rules[r]
    box = index.boxes[r]
    refs = [table.rules[s].ref for s in first_bits(earlier, 3)]
    names = ", ".join(f"{ref.id} ({location(ref)})" for ref in refs)
    n = earlier.bit_count()
    more = f" and {n - 3} more" if n > 3 else ""
    count = ctx.space.size(box) * len(requests)
    fix, at = "", rule.ref
    if not table.backends:
        # The hint names a change in the file its author owns. A rule of a later pack before
        # this one is an `override: true` that took all its inputs: the fix is to narrow that
        # override (the finding is located there), never to edit the earlier pack's rule.
        order = pack_order(ctx.program)
        overriders = [ref for ref in (table.rules[s].ref for s in first_bits(earlier, earlier.bit_count()))
                      if order[ref.pack] > order[rule.ref.pack]]
        if overriders:
            at = overriders[0]
            fix = (f"; {at.id} ({location(at)}) has `override: true` and takes every one of them: if "
                   f"{rule.ref.id} should keep some, narrow {at.id}'s `when:` to the inputs it should take")
        elif any(ref.pack != rule.ref.pack for ref in refs):
            fix = (f"; to take precedence over the default rules of earlier packs, give {rule.ref.id} "
                   "`override: true`")
    named = rule.ref.id if at == rule.ref else f"{rule.ref.id} ({location(rule.ref)})"
    return ctx.finding(ERROR, "shadowed",
                       f"rule {named} never decides an input: earlier rules "
                       f"decide all {count} inputs it matches ({names}{more}); hit policy first{fix}",
                       at, rules=(rule.ref, *refs), count=count,
                       counterexample=ctx.input(box, requests[0]), table=table.name)


def pack_order(program) -> dict:
    """Pack name -> its load rank (the shipped rules first), from the rules' load order."""
    order: dict = {}
    for rule in program.rules:
        order.setdefault(rule.ref.pack, len(order))
    return order


def model_findings(ctx: CheckContext) -> Iterator[Finding]:
    """A warning for each backend table that selects but never tests
    ``model`` while the vocabulary declares several models: requested with
    --attention-backend, it serves every model, e.g. a V4.0 kernel for a V4.1
    query."""
    decl = ctx.program.inputs.get("model")
    if decl is None or len(decl.values) < 2:
        return
    own = decl.default or decl.values[0]
    for table in ctx.flow.tables.values():
        if not table.backends or not any(r.outcome.kind == "select" for r in table.rules):
            continue
        if any(name == "model" for r in table.rules for name, _ in r.conditions):
            continue
        first = table.rules[0].ref
        stem = table.backends[0].lower().replace("_", "-")
        yield Finding(
            WARNING, "model",
            f"table {table.name} never tests `model`, so it selects for every declared model "
            f"({', '.join(decl.values)}) when its backend is requested; if it serves only {own}, make its "
            f"first rule `- {{id: {stem}-other-model, when: {{model: {{not: {own}}}}}, reject: {{reason: "
            f"{table.backends[0]} serves {own} only, not {{model}}.}}}}`, or add a `model:` condition to "
            "its select rules", table.file, table.line, None, rules=(first,), table=table.name)


def host_findings(ctx: CheckContext) -> Iterator[Finding]:
    """A warning (DSV412) for each backend table that selects on a platform a host serves
    (:data:`dsv4sel.dsv4.host_registry.HOST_PLATFORMS`) with a rule naming no class for that host,
    in a rule set written for that host (some rule names it): the host's plugin refuses
    those selections, although ``check`` and ``test`` pass."""
    from ..dsv4.host_registry import HOST_PLATFORMS

    decl = ctx.program.inputs.get("platform")
    if decl is None:
        return
    named = set().union(*(_hosts_of(r) for r in ctx.program.rules if r.outcome.kind == "select"))
    for host, served in HOST_PLATFORMS.items():
        if host not in named:
            continue  # a rule set for another engine (e.g. SGLang's own vocabulary)
        served_here = tuple(p for p in decl.values if p in served)
        for table in ctx.flow.tables.values():
            if table.backends:
                finding = _hostless_finding(ctx, table, host, served_here, frozenset(decl.values))
                if finding is not None:
                    yield finding


def _hosts_of(rule) -> set[str]:
    """The hosts a select rule names a class for (``hosts:``)."""
    return {h for h, _, _ in (rule.outcome.field("hosts") or ())}


def _hostless_rules(selecting: list, host: str, served: tuple[str, ...],
                    platforms_declared: frozenset[str]) -> tuple[list, list[str]]:
    """The rules of ``selecting`` that select on a platform of ``served`` without naming a class
    for ``host``, and those platforms (in ``served``'s order)."""
    missing = []
    platforms: list[str] = []
    for rule in selecting:
        if host in _hosts_of(rule):
            continue
        allowed = dict(rule.conditions).get("platform", platforms_declared)
        hit = [p for p in served if p in allowed]
        if hit:
            missing.append(rule)
            platforms.extend(p for p in hit if p not in platforms)
    return missing, platforms


def _hostless_finding(ctx: CheckContext, table, host: str, served: tuple[str, ...],
                      platforms_declared: frozenset[str]) -> Finding | None:
    """The DSV412 warning for ``table`` and ``host``: its winning select rules that name no
    class for ``host`` on a platform of ``served``; None when every such rule names one."""
    from ..dsv4.host_registry import HOST_NAMES

    won = ctx.flow.table_scan(table).won
    selecting = [rule for r, rule in enumerate(table.rules) if rule.outcome.kind == "select" and won[r]]
    missing, platforms = _hostless_rules(selecting, host, served, platforms_declared)
    if not missing:
        return None
    name, backend = HOST_NAMES.get(host, host), table.backends[0]
    some = len(missing) < len(selecting)
    who = f"its rule{'s' if len(missing) > 1 else ''} {', '.join(r.ref.id for r in missing)} " if some else ""
    first = missing[0].ref
    return Finding(
        WARNING, "hostless",
        f"backend {backend} selects on {', '.join(platforms)}, which {name} serves, but {who}names no "
        f"{name} class (`hosts: {host}`); the {name} plugin refuses every "
        f"{'such ' if some else ''}selection of it: add `hosts: {{{host}: {{class: ..., versions: ...}}}}` "
        f"(the {name} layer class that builds it) to its `defaults:`, or leave it to an engine that builds "
        "the impl "
        "itself", first.file, first.line, None, rules=tuple(r.ref for r in missing), table=table.name)
