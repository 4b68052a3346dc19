"""``dsv4sel diff``'s output: a :class:`dsv4sel.tools.diff.Diff` as text or as JSON data.

:func:`outcome` is the one line that names an :class:`~dsv4sel.tools.diff.Outcome`
(``select FLASHMLA_SPARSE_DSV4 layout=... impl=...``, ``reject (B): reason``,
``undecided (no rule in T)``, ``not in the decision space``). The text report and the
JSON layout both use it, so the JSON data is made here too (:func:`as_dict`), not by
the value; ``tools/vllm_fix_cubes.py`` writes ``docs/vllm-0.33-fixes.md`` with it.
"""

from __future__ import annotations


def outcome(o) -> str:
    """An :class:`~dsv4sel.tools.diff.Outcome` in words: one line, and for a selection a
    second with its classes (:func:`impl_line`), so that no line runs to hundreds of columns."""
    if o.kind == "absent":
        return "not in the decision space"
    if o.kind == "gap":
        return f"undecided (no rule in {o.table})"
    if o.kind == "reject":
        return f"reject ({o.backend or 'default'}): {o.reason}"
    text = f"select {o.backend} layout={o.layout} cache_dtype={o.cache_dtype} torch={o.torch_dtype} " \
           f"bytes/token={o.bytes_per_token} block={o.block_size}"
    if o.rewrites:
        text += " rewrites=" + ",".join(f"{k}->{v}" for k, v in o.rewrites)
    if o.messages:
        text += f" messages={len(o.messages)}"
    return text + "\n" + impl_line(o)


def impl_line(o) -> str:
    """The classes a selection names: its impl and each host's class."""
    return " ".join([f"impl={o.impl}", *(f"{host}={cls.rpartition(':')[2]}" for host, cls, _ in o.hosts)])


def as_dict(diff) -> dict:
    """``dsv4sel diff --json``: ``compared``, ``changed`` and every change's
    ``inputs``, ``cubes`` and both outcomes as :func:`outcome` writes them."""
    return {"version": 1, "compared": diff.compared, "changed": diff.changed,
            "changes": [{"inputs": c.count, "cubes": list(c.cubes), "old": outcome(c.old).replace("\n", " "),
                         "new": outcome(c.new).replace("\n", " ")}
                        for c in diff.changes]}


def text(diff) -> str:
    """The report ``dsv4sel diff`` prints: a count, then each group of inputs
    with its cubes and the old and new outcome."""
    if not diff.changes:
        return f"no change: {diff.compared} inputs decide the same way\n"
    lines = [f"{diff.changed} of {diff.compared} inputs change, in {len(diff.changes)} groups "
             "(an input a group does not name takes every value)"]
    for change in diff.changes:
        lines += ["", f"{change.count} input{'s' if change.count != 1 else ''}:"]
        lines += [f"  {cube}" for cube in change.cubes]
        for side, o in (("old", change.old), ("new", change.new)):
            lines.append(f"  {side}: " + outcome(o).replace("\n", "\n       "))
    return "\n".join(lines) + "\n"
