"""``dsv4sel doctor``'s text: a :class:`dsv4sel.tools.doctor.Report` for people.

The machine (with its probed inputs), the selection for every kv dtype, every
impl class's verdict with its reason, and the one-line conclusion the exit
status agrees with. ``--json`` is the report's own ``as_dict()``.
"""

from __future__ import annotations

from ...dsv4.platform import INFERRED
from ...dsv4.rules import Rejection
from .text import Style, align, location, unbroken, where, wrap_lines

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .text import Cell


def report_text(report, style: Style, width: int | None) -> str:
    """The text ``dsv4sel doctor`` prints: :func:`report_lines` wrapped to ``width``
    columns (a path is never broken), ending in a newline."""
    return "\n".join(wrap_lines(report_lines(report, style), width)) + "\n"


def report_lines(report, style: Style) -> list[str]:
    """One string per line, not wrapped; colour only when ``style`` is enabled."""
    lines = _machine_lines(report, style)
    if report.query is not None:
        lines += _selection_lines(report, style)
    lines += _kernel_lines(report, style)
    return lines + ["", _verdict(report, style)]


def _machine_lines(report, style: Style) -> list[str]:
    """The machine: platform, capability, torch, python, dsv4sel, the probed inputs and notes."""
    import platform as pyplatform

    from ..._version import __version__

    m, query = report.machine, report.query
    if m.platform is None:
        plat = style.yellow("not detected") + f": {m.problem} (here: --platform P [--capability C])"
        cap = "-"
    elif m.source == INFERRED:
        plat = f"{m.platform} (from --capability {m.capability_given or m.capability})"
    else:
        plat = f"{m.platform} (from {m.source})"
    if m.platform is not None:
        cap = query.capability
        written = m.capability_given or m.capability
        if written not in (None, cap):
            cap += f" (given {written})"
    lines = [style.bold("machine")]
    lines += align([
        ["platform", plat], ["capability", cap],
        ["torch", m.torch or style.yellow(m.torch_problem or "torch not installed")],
        ["python", pyplatform.python_version()],
        ["dsv4sel", f"{__version__}, rules {report.rules_digest[:12]} ({len(report.rule_files)} files)"],
    ] + [[p.name, f"{p.value} (probe {p.impl}: {p.reason})" if p.asked else f"{p.value} ({p.reason})"]
         for p in report.probes], style)
    for note in report.notes:
        lines.append("  " + style.yellow(f"{note.level}: {note}"))
    return lines


def _selection_lines(report, style: Style) -> list[str]:
    """The selection for every kv dtype on the query's platform, with the deciding rule."""
    query = report.query
    given = ", ".join([f"model {query.model}"] + [f"{k}={v}" for k, v in query.extra if k in report.deciding])
    lines = ["", style.bold(f"selection on {where(query)}") + f" ({given}, no --attention-backend)"]
    rows: list[list[Cell]] = [["kv dtype", "backend", "layout", "cache dtype", "rule", "at"]]
    for kv, outcome in report.selections:
        ref = outcome.rule
        decided_by = [ref.id, (unbroken(location(ref)), "cyan")] if ref is not None else ["-", ""]
        if isinstance(outcome, Rejection):
            rows.append([kv, ("rejected", "red"), "-", "-", *decided_by])
        else:
            rows.append([kv, (outcome.backend, "green"), outcome.layout, outcome.cache_dtype, *decided_by])
    table = align(rows, style)
    lines += [style.dim(table[0])] + table[1:]
    lines.append(f"  why: dsv4sel explain --platform {query.platform} --capability {query.capability} "
                 "--kv-cache-dtype D")
    return lines


def _kernel_lines(report, style: Style) -> list[str]:
    """Every impl class's verdict, for the platform asked about or this machine."""
    m, query = report.machine, report.query
    target = f"{query.platform} {query.capability}" if query is not None and m.given else "this machine"
    lines = ["", style.bold(f"kernels (for {target})")]
    heads = align([[("ok", "green") if c.available else ("unavailable", "red"), c.impl, ", ".join(c.backends)]
                   for c in report.impls], style)
    for check, head in zip(report.impls, heads):
        lines += [head, "      " + check.reason]
    return lines


def _verdict(report, style: Style) -> str:
    """The one-line conclusion the exit status agrees with."""
    auto, query = report.auto, report.query
    if report.ok:
        return style.green("ok") + f": {auto.backend} ({auto.impl}) can run for kv dtype {report.selections[0][0]}"
    if query is None:
        return style.red("not ok") + ": the platform is unknown"
    if isinstance(auto, Rejection):
        return style.red("not ok") + f": kv dtype {report.selections[0][0]} is rejected on {where(query)}"
    return style.red("not ok") + f": {auto.impl} cannot run"
