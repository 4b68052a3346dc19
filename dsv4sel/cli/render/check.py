"""``dsv4sel check``'s output: a :class:`dsv4sel.check.findings.Report` as text or diagnostics.

:func:`text` is the human report: every finding (its own ``str``, then the rules
involved and one concrete input), the coverage figures per requested backend and
per rule, and the summary line. :func:`diagnostics` are the findings as
:class:`~dsv4sel.cli.render.diagnostics.Diagnostic` values for ``--format github``
and ``sarif``.
"""

from __future__ import annotations

from ...errors import Loc
from .diagnostics import Diagnostic
from .text import Style, align, location


def diagnostics(report) -> list[Diagnostic]:
    """One diagnostic per finding, at its ``file:line:column``."""
    return [Diagnostic(f.code, f.severity, f.message, f.file, f.line, f.column) for f in report.findings]


def _table(rows: list[tuple], right: set[int]) -> list[str]:
    """Rows aligned in columns; columns in ``right`` (numbers) right-aligned; never coloured."""
    return align([[str(c) for c in row] for row in rows], Style(False), right=right)


def text(report) -> str:
    """The human-readable report (the text ``dsv4sel check`` prints)."""
    head = f"dsv4sel check: {len(report.sources)} files"
    if report.analysed:
        head += f", {report.rule_count} rules, {report.table_count} tables"
    lines = [head]
    for f in report.findings:
        # as Finding's own str, with locations that open from here (a wheel's rules too)
        lines.append(f"{location(f)}: {f.severity} {f.code} [{f.kind}] {f.message}")
        if f.rules:
            lines.append("    rules:   " + ", ".join(f"{r.id} ({location(r)})" for r in f.rules))
        if f.counterexample is not None:
            lines.append(f"    e.g.:    {f.counterexample}")
    if report.coverage is not None:
        lines += _coverage_lines(report.coverage)
    for h in report.hosts:  # dsv4sel.check.host_spaces
        lines += [f"host {h.host}: {h.inputs} inputs of its space ({h.file}): select {h.selected} (each with "
                  f"the host's class for this release), refuse {h.refused}", ""]
    lines += _verdict_lines(report)
    return "\n".join(lines) + "\n"


def summary(report) -> str:
    """``dsv4sel check --summary``: the findings as :func:`text` lists them, then one line,
    without the coverage tables: for a clean rule set that one line is all
    (``dsv4sel check: clean, 15 files, 96 rules: ...``)."""
    lines = []
    for f in report.findings:
        lines.append(f"{location(f)}: {f.severity} {f.code} [{f.kind}] {f.message}")
    head = f"dsv4sel check: {len(report.sources)} files"
    if report.analysed:
        head += f", {report.rule_count} rules"
    if report.ok:
        lines.append(f"dsv4sel check: clean, {head[len('dsv4sel check: '):]}: all {report.coverage.inputs} inputs "
                     "decided exactly once")
    else:
        lines += [f"{head}: {line}" if i == 0 else line for i, line in enumerate(_verdict_lines(report))]
    return "\n".join(lines) + "\n"


def _coverage_lines(cov) -> list[str]:
    """The size of the space, then each backend's and each rule's share of it."""
    t = cov.totals
    lines = ["", f"coverage: {cov.points} points x {cov.backend_choices} backend choices "
             f"(none or one of {cov.backend_choices - 1} backends) = {cov.inputs} inputs",
             f"  select {t.select}, reject {t.reject}, undecided {t.undecided}", ""]
    rows = [("backend", "first table", "select", "reject", "undecided")]
    groups: dict[tuple, list] = {}
    for b in cov.backends:  # backends sharing one table have identical figures
        groups.setdefault((b.table, b.backend is None), []).append(b)
    for members in groups.values():
        b = members[0]
        name = "<none>" if b.backend is None else b.backend
        if len(members) > 1:
            name += f" +{len(members) - 1} more, each"
        # the default decision may span several files (packs add default rules)
        where = location(Loc(b.file, 1))[:-2] if b.backend is not None else "<default-backend decision>"
        rows.append((name, where, b.counts.select, b.counts.reject, b.counts.undecided))
    lines += _table(rows, {2, 3, 4}) + [""]
    rows = [("rule", "location", "outcome", "inputs", "points")]
    rows += [(r.rule.id, location(r.rule), r.outcome, r.inputs, r.points) for r in cov.rules]
    return lines + _table(rows, {3, 4}) + [""]


def _verdict_lines(report) -> list[str]:
    """The last line(s): clean, or how many findings of each severity."""
    if report.ok:
        return [f"clean: all {report.coverage.inputs} inputs are decided; no rule overlaps, shadows or repeats "
                "another, and every selection resolves and is consistent"]
    e, w = len(report.errors), len(report.warnings)
    lines = [f"{len(report.findings)} finding{'s' if len(report.findings) != 1 else ''}: "
             f"{e} error{'s' if e != 1 else ''}, {w} warning{'s' if w != 1 else ''}"]
    if not report.analysed:
        lines.append("the decision space was not analysed: fix the problems above first")
    return lines
