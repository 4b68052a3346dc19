"""``dsv4sel explain``'s text: a :class:`dsv4sel.tools.explain.Explanation` for people.

The query, the outcome with the deciding rule and its ``description:``, the KV wire
contract (each cache pool, per layer) and with ``--tokens`` the KV memory, the
rewrites, the rule messages, the path of rules (``file:line``), why every other
backend of the platform does not serve, and on a rejection the nearest working
alternatives. ``--json`` is the explanation's own ``as_dict()``.
"""

from __future__ import annotations

from ...engine.hosts import described
from ...dsv4.alternatives import flag
from .contract import contract_lines, memory_lines
from .text import Style, align, location as _location, unbroken, where, wrap_lines


def location(where) -> str:
    """A location as one word of a report line (see :func:`~dsv4sel.cli.render.text.unbroken`)."""
    return unbroken(_location(where))

_ACTIONS = {"default": "default backend -> {target}", "use": "hands over to {target}",
            "select": "selects", "reject": "rejects"}


def _input_name(name: str) -> str:
    """How the report names an input: as its flag for the kv dtype, else as the rules do."""
    return "kv-cache-dtype" if name == "kv_cache_dtype" else name


def _pack(rule) -> str:
    """Names the rule pack when the deciding rule is not a shipped one."""
    return "" if rule.pack == "dsv4sel" else "  " + unbroken(f"(pack {rule.pack})")


def report_text(ex, style: Style, width: int | None, origin: str = "") -> str:
    """The text ``dsv4sel explain`` prints: :func:`report_lines` wrapped to ``width``
    columns (a path is never broken), ending in a newline."""
    return "\n".join(wrap_lines(report_lines(ex, style, origin), width)) + "\n"


def report_lines(ex, style: Style, origin: str = "") -> list[str]:
    """The human-readable report, one string per line (no colour when ``style``
    is off; not wrapped: :func:`report_text` wraps it). ``origin`` says where the
    platform came from when it was not given (``detected``, ``from --capability
    MI300X``). Its sections in order: the query (the inputs that decide it), the
    outcome, rewrites, messages, the path, why not, and on a rejection the nearest
    working alternatives."""
    lines = _query_lines(ex, style, origin)
    lines += _selection_lines(ex, style) if ex.selection is not None else _rejection_lines(ex, style)
    lines += _contract_and_memory_lines(ex, style)
    lines += _rewrite_and_message_lines(ex, style)
    lines += _path_lines(ex, style)
    lines += _why_not_lines(ex.why_not, style)
    if ex.rejection is not None:
        lines += _alternative_lines(ex.alternatives, ex.query, style)
    return lines


def _contract_and_memory_lines(ex, style: Style) -> list[str]:
    """The selection's KV wire contract (its cache pools, per layer) and, with ``--tokens``, the
    KV memory that many tokens need."""
    if ex.selection is None:
        return []
    lines = [""] + contract_lines(ex.selection.contract, style)
    if ex.memory is not None:
        lines += [""] + memory_lines(ex.memory, style)
    return lines


def _query_lines(ex, style: Style, origin: str) -> list[str]:
    """The query: the platform (and where it came from), the flags, the model, and of the
    other inputs those whose value decides this query (``flashinfer_sm120`` on SM12x only)."""
    q = ex.query
    head = [f"{where(q)}{f' ({origin})' if origin else ''}", flag("kv_cache_dtype", q.kv_cache_dtype),
            flag("backend", q.backend),
            f"model {q.model}"] + [f"{k}={v}" for k, v in q.extra if k in ex.deciding]
    return [style.bold("query") + "     " + ", ".join(head), ""]


def _selection_lines(ex, style: Style) -> list[str]:
    q, s = ex.query, ex.selection
    how = ("platform default" if q.backend is None
           else f"asked for {q.backend}" if q.backend != s.backend else "as asked")
    lines = [style.paint("selected", "bold", "green") + f"  {style.bold(s.backend)} ({how})"]
    lines += align([
        ["impl", s.impl], ["layout", s.layout], ["cache dtype", s.cache_dtype],
        ["torch dtype", s.torch_dtype_name], ["bytes per token", f"{s.bytes_per_token} per layer (main pool)"],
        ["block size", str(s.block_size)],
        *[row for host, cls, versions, told in described(s.hosts, s.host_settings)
          for row in ([[f"{host} class", f"{cls} " + unbroken(f"({host} {versions})")]]
                      + ([[f"{host} settings", ", ".join(f"{k} {v}" for k, v in told.items())]] if told else []))],
        ["decided by", f"{s.rule.id}  " + style.cyan(location(s.rule)) + _pack(s.rule)],
    ] + ([["why", ex.description]] if ex.description else []), style)
    return lines


def _rejection_lines(ex, style: Style) -> list[str]:
    q, r = ex.query, ex.rejection
    who = (r.backend + (" (platform default)" if q.backend is None else "")) if r.backend \
        else f"no DeepSeek-V4 backend for {where(q)}"
    lines = [style.paint("rejected", "bold", "red") + f"  {style.bold(who)}"]
    rows = [["reason", r.reason]]
    if r.blocked_by:
        rows.append(["blocked by", _input_name(r.blocked_by)])
    if r.rule is not None:
        rows.append(["decided by", f"{r.rule.id}  " + style.cyan(location(r.rule)) + _pack(r.rule)])
        if ex.description:
            rows.append(["why", ex.description])
    return lines + align(rows, style)


def _rewrite_and_message_lines(ex, style: Style) -> list[str]:
    lines: list[str] = []
    if ex.rewrites:
        lines += ["", style.bold("rewrites")]
        lines += align([[w.attribute, f"{'?' if w.before is None else w.before} -> {w.after}"]
                        for w in ex.rewrites], style)
    if ex.messages:
        lines += ["", style.bold("messages")]
        lines += align([[(m.level, "yellow") if m.level == "warning" else m.level, str(m)]
                        for m in ex.messages], style)
    return lines


def _path_lines(ex, style: Style) -> list[str]:
    """The rules that led to the outcome, each with its ``description:`` under its id."""
    lines = ["", style.bold("path")]
    steps = align([[str(n), step.rule.id, (location(step.rule), "cyan"),
                    _action(step)]
                   for n, step in enumerate(ex.path, 1)], style)
    for step, line in zip(ex.path, steps):
        lines.append(line)
        if step.description:  # why the rule exists, under its id
            lines.append(" " * (5 + len(str(len(ex.path))) - 1) + step.description)
    if ex.rejection is not None and ex.rejection.gap:
        lines.append("  " + style.yellow(ex.rejection.reason))
    return lines


def _action(step) -> str:
    """What a path step did, its target kept with the word before it (``-> BACKEND``) when wrapped."""
    text = _ACTIONS[step.action].format(target=step.target)
    head, _, last = text.rpartition(" ")
    if step.target is None or not head:
        return text
    head, _, arrow = head.rpartition(" ")
    return f"{head} {unbroken(f'{arrow} {last}')}"


def _why_not_lines(why_not, style: Style) -> list[str]:
    """Why each other backend of the platform does not serve the query."""
    if not why_not:
        return []
    lines = ["", style.bold("why not")]
    heads = align([[w.backend,
                    w.verdict.replace("_", " ") + (f" ({_input_name(w.blocked_by)})" if w.blocked_by else ""),
                    w.rule.id if w.rule else "-", (location(w.rule), "cyan") if w.rule else ""]
                   for w in why_not], style)
    for w, head in zip(why_not, heads):
        lines += [head, "      " + w.reason]
        if w.verdict == "rejects" and w.accepts:
            lines.append("      accepts here: --kv-cache-dtype " + ", ".join(w.accepts))
    return lines


def _alternative_lines(alternatives, q, style: Style) -> list[str]:
    """A rejection's nearest working alternatives: the flags to change and what they select."""
    lines = ["", style.bold("nearest working alternatives")]
    if not alternatives:
        return lines + [f"  none: no backend and kv-cache dtype select on {where(q)}; "
                        "`dsv4sel table` lists the supported platforms"]
    rows = []
    for a in alternatives:
        change = a.flags + (f" (or {', '.join(a.also)})" if a.also else "")
        sel = a.selection
        rows.append([(change, "green"), sel.backend, sel.layout, f"{sel.bytes_per_token} B/token",
                     (location(sel.rule), "cyan")])
    return lines + align(rows, style)
