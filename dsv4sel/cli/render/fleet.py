"""``dsv4sel fleet``'s text: a :class:`dsv4sel.tools.fleet.FleetReport` for people.

The deployment and who decides it; each side: its engine, machine, what it selects (or why its
rules refuse it) with the deciding rule, and its KV contract; then the verdict: the contract all
sides share, or a table of the differing fields (one column per side, the deciding rules last),
the fixes (the settings to change on which side, and what it then selects) or why no setting
makes the sides agree. ``--json`` is the report's own ``as_dict()``.
"""

from __future__ import annotations

from .text import Style, align, location

MODES = {"dsv4sel": "as dsv4sel makes the engines decide (the shipped rules through its plugins)",
         "engine": "as the engines decide today (each release's compat rule set)"}


def report_lines(report, style: Style) -> list[str]:
    """The human-readable report, one string per line."""
    lines = [style.bold("deployment") + f"  {report.file}, {MODES[report.mode]}", ""]
    for side in report.sides:
        lines += _side_lines(side, style)
    lines.append("")
    if report.compatible:
        contract = report.sides[0].outcome.contract
        return lines + [style.paint("compatible", "bold", "green")
                        + f"  every side writes and reads one KV contract, {style.cyan(contract.fingerprint)}"]
    return lines + _verdict_lines(report, style)


def _side_lines(report, style: Style) -> list[str]:
    side, out = report.side, report.outcome
    where = f"{side.get('platform')} {side.get('capability') or 'capability unknown'}"
    role = f", {side.disaggregation}" if side.disaggregation else ""
    head = (f"{style.bold(side.name)}  {side.engine} {side.version}, {where}{role}, model {report.model}; "
            f"decided by {report.decided_by} ({report.rules})")
    rows = []
    if out.selection is not None:
        sel = out.selection
        rows.append(["selects", f"{sel.backend}, {sel.layout} {sel.bytes_per_token} B/token per layer",
                     f"{out.rule.id}  " + style.cyan(location(out.rule))])
        c = out.contract
        pools = "; ".join(f"{p.name} {p.record} {p.bytes_per_token} B {p.arrangement} fp8 {p.fp8}" for p in c.pools)
        rows.append(["contract", style.cyan(c.fingerprint), f"block {c.block_size}; {pools}"])
    else:
        by = f"{out.rule.id}  " + style.cyan(location(out.rule)) if out.rule is not None else style.cyan(out.origin or "")
        rows.append([style.paint("refused", "red"), out.reason, by])
    rows += [["note", note] for note in out.notes]
    return [head] + align(rows, style)


def _verdict_lines(report, style: Style) -> list[str]:
    refused = [s.name for s in report.sides if s.outcome.contract is None]
    count = len(report.differences)
    why = (f"{', '.join(refused)} selects nothing" if refused
           else f"the sides' KV contracts differ in {count} field{'s' if count != 1 else ''}")
    lines = [style.paint("incompatible", "bold", "red") + f"  {why}"]
    lines += _difference_lines(report.differences, style)
    return lines + ["", style.bold("fixes")] + _fix_lines(report, style)


def _difference_lines(differences, style: Style) -> list[str]:
    """One column per side: each differing field's values, then the rules that decided them."""
    if not differences:
        return []
    names = [name for name, _ in differences[0].values]
    # a pool's encoding follows its record: shown only when the record itself agrees (--json has every field)
    records = {d.field.split(".")[0] for d in differences if d.field.endswith(".record")}
    rows = [["field", *names]]
    rows += [[d.field, *(str(v) for _, v in d.values)] for d in differences
             if not (d.field.endswith(".encoding") and d.field.split(".")[0] in records)]
    rows.append(["decided by", *(f"{ref.id} {location(ref)}" if ref else "-" for _, ref in differences[0].rules)])
    return align(rows, style)


def _setting(key: str, value) -> str:
    shown = "unset" if value is None else value
    return f"{key.removeprefix('env.')}={shown}" if key.startswith("env.") else f"{key} {shown}"


def _fix_lines(report, style: Style) -> list[str]:
    if not report.fixes:
        return ["  none: " + (report.no_fix or "no setting was searched")]
    lines = []
    for n, fix in enumerate(report.fixes, 1):
        parts = [f"on {side}: {', '.join(_setting(k, v) for k, v in changes)} (selects {backend}, "
                 f"{rule.id} {location(rule)})"
                 for (side, changes), (_, backend, rule) in zip(fix.changes, fix.decisions)]
        lines.append(f"  {n}. " + "; ".join(parts) + f" -> {style.cyan(fix.contract.fingerprint)}")
    return lines
