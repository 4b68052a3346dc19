"""Checks of every selection: the catalogue and the rewrite fixpoint.

Each selecting rule is checked over the regions it wins, split only by the
inputs its templates name: the impl class must resolve from the allowed
modules, the layout must exist and agree with the torch dtype and bytes per
token (and the impl must read it), and a rewrite of a field that restates an
input (``Profile.restates``; DeepSeek-V4's ``cache_dtype`` restates
``kv_cache_dtype``) must be a fixpoint: selecting again with the input set to
the rewritten value (same requested backend) gives the same selection and
rewrites nothing new.
"""

from __future__ import annotations

from typing import Iterator

from .context import CheckContext, table_label
from .findings import ERROR, WARNING, Finding
from ..engine.codes import kind_code
from ..engine.locations import location
from .outcomes import SELECTION_FIELDS, placeholders, render_fields


def selection_findings(ctx: CheckContext, regions, examples) -> Iterator[Finding]:
    """Every selection checked against the catalogue (impl resolves, layout exists and fits)
    and, for a rewrite of a restated field, against selecting again with the rewritten value."""
    reported: dict[tuple, list] = {}

    impls: dict[str, list] = {}  # one finding per unresolvable impl, naming every rule that selects it
    # a problem of a field the rules inherit from `defaults:`: one finding there, naming the rules
    inherited: dict[tuple, list] = {}

    def report(kind, message, rule, start, box, count=0, extra_rules=()):
        key = (kind, rule.ref, message)
        slot = reported.get(key)
        if slot is None:
            reported[key] = [count, rule, start, box, extra_rules]
        else:
            slot[0] += count

    def field_problems(rule, start, box, fields):
        origin = dict(rule.outcome.inherited)
        for kind, message in ctx.checker.field_problems(fields):
            loc = origin.get(_field_of(kind, message))
            if loc is not None:
                slot = inherited.setdefault((kind, message, loc), [rule, start, box, []])
                if rule.ref not in slot[3]:
                    slot[3].append(rule.ref)
            elif kind == "impl":
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
        for assignment, sub in ctx.space.split_by(box, names):
            values = dict(assignment, backend=label or "")
            fields, rewrites = render_fields(rule, values)
            field_problems(rule, start, sub, fields)
            for field, name in ctx.restates:
                if field in rewrites:
                    _fixpoint(ctx, rule, start, label, sub, fields, rewrites, report, field, name)
    if ctx.checker.layout_error:
        first = next(iter(examples.values()), None) or next(
            ((r, s, b) for s, _, r, b in regions), None)
        if first:
            report("layout", ctx.checker.layout_error, first[0], first[1], first[2])
    for message, (rule, start, box, refs) in impls.items():
        refs = sorted(refs, key=lambda r: (r.file, r.line))
        yield ctx.finding(ERROR, "impl", f"{_who(refs)}: {message}", refs[0], rules=tuple(refs),
                          counterexample=ctx.input(box, start), table=rule.table)
    for (kind, message, (file, line, column)), (rule, start, box, refs) in inherited.items():
        refs = sorted(refs, key=lambda r: (r.file, r.line))
        yield Finding(ERROR, kind, f"defaults: {message} (inherited by {_who(refs)})", file, line, column,
                      rules=tuple(refs), counterexample=ctx.input(box, start), table=rule.table)
    for (kind, ref, message), (count, rule, start, box, extra) in reported.items():
        reason = dict(rule.acknowledged).get(kind_code(kind))
        severity, text = (ERROR, message) if reason is None else (WARNING, f"{message} (acknowledged: {reason})")
        yield ctx.finding(severity, kind, text, ref, rules=(ref, *extra), count=count,
                          counterexample=ctx.input(box, start), table=rule.table)

def _who(refs) -> str:
    return (f"rule {refs[0].id}" if len(refs) == 1 else
            f"rules {', '.join(r.id for r in refs[:3])}" + (f" and {len(refs) - 3} more" if len(refs) > 3 else ""))


def _field_of(kind: str, message: str) -> str | None:
    """The select field a problem of :meth:`FieldChecker.field_problems` is about."""
    if kind in ("impl", "layout"):
        return kind
    if kind == "consistency":
        name = message.split(" ", 1)[0]
        return name if name in ("torch_dtype", "bytes_per_token") else "impl"
    return None


def _fixpoint(ctx: CheckContext, rule, start, label, sub, fields, rewrites, report, field: str, restated: str) -> None:
    """Re-select every input of ``sub`` with input ``restated`` = the rewritten value
    of ``field``; the result must be the same selection, rewriting nothing new."""
    space = ctx.space
    target = rewrites[field]
    declared = ctx.program.inputs[restated].values
    if target not in declared:
        from ..engine.suggest import did_you_mean

        report("fixpoint", f"rule {rule.ref.id} rewrites {field} to {target!r}, which is not a "
               f"declared {restated} value, so the result cannot be selected again" + did_you_mean(target, declared),
               rule, start, sub, space.size(sub))
        return
    moved = [v for v in space.project(sub, restated) if v != target]
    if not moved:
        return  # the rewrite is a no-op on every input here
    orig = space.restrict(sub, restated, moved)
    image = space.substitute(orig, restated, target)
    if image is None:
        report("fixpoint", f"rule {rule.ref.id} rewrites {field} to {target!r}, but {restated}={target} "
               "is not a declared input together with the other inputs", rule, start, orig,
               space.size(orig))
        return
    again = f"selecting again with {restated}={target} (the rewritten {field})"

    def preimage(box):
        return _preimage(space, box, restated, moved, orig)

    for ev in ctx.flow.walk(start, image, detail=True):
        if ev.kind in ("route",):
            continue
        if ev.kind != "decide":
            where = table_label(ev.table)
            report("fixpoint", f"rule {rule.ref.id}: {again} is undecided (no rule of {where} matches)",
                   rule, start, preimage(ev.box), ev.count * len(moved))
            continue
        other = ev.rule
        for box in ev.scan.regions[ev.position]:
            if other.outcome.kind != "select":
                report("fixpoint", f"rule {rule.ref.id}: {again} is rejected by {other.ref.id} "
                       f"({location(other.ref)})", rule, start, preimage(box), space.size(box) * len(moved),
                       (other.ref,))
                continue
            if ev.label != label:
                report("fixpoint", f"rule {rule.ref.id}: {again} selects backend {ev.label} instead of "
                       f"{label} ({other.ref.id}, {location(other.ref)})", rule, start, preimage(box),
                       space.size(box) * len(moved), (other.ref,))
                continue
            names = placeholders(other) - {"backend"}
            for assignment, part in space.split_by(box, names):
                fields2, rewrites2 = render_fields(other, dict(assignment, backend=ev.label or ""))
                problems = _reselection_problems(fields, rewrites, fields2, rewrites2, field, target)
                if problems:
                    report("fixpoint", f"rule {rule.ref.id}: {again} " + "; ".join(problems)
                           + f" ({other.ref.id}, {location(other.ref)})", rule, start, preimage(part),
                           space.size(part) * len(moved), (other.ref,))


def _preimage(space, box, restated: str, moved: list[str], orig):
    """The cube of ``orig`` (the inputs before the rewrite) whose rewrite is ``box``'s first point."""
    point = space.first_point(box)
    for v in moved:
        cube = space.point_cube({**point, restated: v})
        if cube is not None and all(c & o == c for c, o in zip(cube, orig)):
            return cube
    return orig  # pragma: no cover - every image point has a preimage


def _reselection_problems(fields, rewrites, fields2, rewrites2, field: str, target: str) -> list[str]:
    """How selecting again (``fields2``, ``rewrites2``) differs from the first selection
    (``fields``, ``rewrites``, which rewrote ``field`` to ``target``)."""
    problems = [f"selects {k} {fields2[k]!r} instead of {fields[k]!r}"
                for k in SELECTION_FIELDS if fields2[k] != fields[k]]
    again_to = rewrites2.get(field, target)
    if again_to != target:
        problems.append(f"rewrites {field} again, to {again_to!r}")
    problems += [f"rewrites {k} to {v!r} instead of {rewrites.get(k)!r}"
                 for k, v in rewrites2.items() if k != field and rewrites.get(k) != v]
    return problems
