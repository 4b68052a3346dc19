"""``dsv4sel test``'s output: a :class:`dsv4sel.tools.testcases.TestReport` as text or diagnostics.

:func:`text` prints every unmet expectation as ``file:line:col: case NAME:
expected ..., got ...`` (the failure's message is the runner's), then the
counts and the rule coverage. :func:`diagnostics` and :func:`problems` are the
failures and a test file's schema problems for ``--format github`` and ``sarif``.
"""

from __future__ import annotations

from ...errors import Loc
from .diagnostics import Diagnostic
from .text import location


def failure_lines(result) -> list[str]:
    """``file:line:col: case NAME: expected ..., got ...``, one per failure of a case's result."""
    return [f"{location(Loc(result.case.file, f.line, f.column))}: case {result.case.name}: {f.message}"
            for f in result.failures]


def text(report) -> str:
    """The human report: the failures, the counts, the rule coverage and the rules no case reached."""
    lines = []
    for result in report.failed:
        lines += failure_lines(result)
    n, failed = len(report.results), len(report.failed)
    files = len(report.files)
    if lines:
        lines.append("")
    lines.append(f"{n} case{'s' if n != 1 else ''} in {files} file{'s' if files != 1 else ''}: "
                 f"{n - failed} passed, {failed} failed")
    scoped = report.scoped
    reached = sum(1 for h in scoped if h.cases)
    pct = f" ({100 * reached // len(scoped)}%)" if scoped else ""
    lines.append(f"rule coverage: {reached} of {len(scoped)} rules reached{pct} ({report.scope})")
    unreached = report.unreached
    if unreached:
        lines.append("not reached by any case:")
        width = max(len(r.id) for r in unreached)
        lines += [f"  {r.id.ljust(width)}  {location(r)}" for r in unreached]
    return "\n".join(lines) + "\n"


def diagnostics(report) -> list[Diagnostic]:
    """One ``DSV510`` diagnostic per unmet expectation, at the expect key that failed."""
    return [Diagnostic("DSV510", "error", f"case {r.case.name}: {f.message}", r.case.file, f.line, f.column)
            for r in report.failed for f in r.failures]


def problems(found) -> list[Diagnostic]:
    """A test file's problems (:class:`dsv4sel.errors.Problem`, located) as diagnostics."""
    return [Diagnostic(p.code, "error", p.message, p.file, p.line, p.column) for p in found]
