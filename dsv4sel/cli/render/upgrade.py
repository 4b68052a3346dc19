"""``dsv4sel upgrade``'s output: a :class:`dsv4sel.tools.upgrade.Upgrade` as text or as JSON data.

The text fits a screen: per category a count and its largest groups (at most
:data:`GROUPS_SHOWN`, each with its first cube), both sides of a group written by
:func:`gist_text` (``FLASHMLA_MEGA_ATTN_DSV41 vllm=DeepseekV4MegaAttnAttention cache_dtype=nvfp4_ds_mla``,
``refused``); the categories that only reword a refusal or a log line are counted in one
line each. ``--json`` (:func:`as_dict`) holds every group, every cube and each exact outcome.
"""

from __future__ import annotations

from ...tools.releases import release_name
from ...tools.upgrade import WORDING

#: How many groups of one category the text shows (the largest; ``--json`` has all).
GROUPS_SHOWN = 3
#: Categories the text counts in one line instead of listing.
COUNTED = WORDING
#: The categories the last line names when they are empty, in its words.
UNCHANGED = {"input": "new inputs that decide", "accepted": "names accepted", "refused": "names refused",
             "default": "default backends", "backend": "backends a name builds",
             "to_refusal": "decisions that became refusals", "to_decision": "refusals that became decisions",
             "class": "classes", "format": "cache formats", "block": "block sizes"}
#: Field names as the group lines write them (``dsv4sel diff``'s spellings).
_LABELS = {"layout": "layout", "cache_dtype": "cache_dtype", "torch_dtype": "torch", "bytes_per_token": "bytes/token",
           "block_size": "block", "rewrites": "rewrites", "impl": "impl", "messages": "log"}


def titles(result) -> dict[str, str]:
    """Each category's heading, in the words of the releases compared."""
    old, new, label = release_name(result.old), release_name(result.new), result.label
    return {
        "accepted": f"names newly accepted: an --attention-backend {old} refuses, {new} builds",
        "refused": f"names newly refused: an --attention-backend {old} builds, {new} refuses",
        "default": "another default backend (no --attention-backend)",
        "backend": "a named --attention-backend builds another backend",
        "to_refusal": "decisions that became refusals or errors (no --attention-backend)",
        "to_decision": "refusals or errors that became decisions (no --attention-backend)",
        "class": f"another {label} class",
        "format": "another cache format (layout, cache dtype, torch dtype, bytes per token, rewrites)",
        "block": "another block size",
        "other": "only log lines or dsv4sel's own impl differ; not listed",
        "reworded": "refused (or unknown) in both releases, for another reason; not listed",
    }


def title(result, category) -> str:
    if category.name == "input":
        return f"{category.input} decides now ({result.label} {release_name(result.old)} ignores it)"
    return titles(result)[category.name]


def _value(name: str, value) -> str:
    if name == "host_class":
        return "none" if value is None else str(value).rpartition(":")[2]
    if name == "rewrites":
        return ",".join(f"{k}->{v}" for k, v in value) or "none"
    if name == "impl":
        return str(value).rpartition(":")[2]
    if name == "messages":
        return "; ".join(text for _, text in value) or "none"
    return str(value)


#: The most values one input of a cube shows in the text before the rest is counted.
VALUES_SHOWN = 6


def clipped(cube: str) -> str:
    """``cube`` with each input's value list cut to :data:`VALUES_SHOWN` values and a count of
    the rest (``backend=<none>,CUTLASS_MSA,...(+40)``): the names vLLM ignores would fill a screen."""
    parts = []
    for part in cube.split(" "):
        name, sep, values = part.partition("=")
        items = values.split(",")
        if sep and len(items) > VALUES_SHOWN + 1 and not values.startswith("not("):
            part = f"{name}={','.join(items[:VALUES_SHOWN])},...(+{len(items) - VALUES_SHOWN})"
        parts.append(part)
    return " ".join(parts)


def gist_text(g, host: str, release: str) -> str:
    """One side of a group in words (:class:`~dsv4sel.tools.upgrade.Gist`)."""
    if g.kind == "refused":
        return "refused" + (f" by {g.backend}" if g.backend else "")
    if g.kind == "undecided":
        return "undecided"
    if g.kind == "absent":
        return f"unknown to {release}"
    parts = [g.backend]
    for name, value in g.fields:
        label = host if name == "host_class" else _LABELS[name]
        parts.append(f"{label}={_value(name, value)}")
    return " ".join(parts)


def _inputs(count: int) -> str:
    return f"{count:,} input{'s' if count != 1 else ''}"


def _listed(result, category) -> list[str]:
    """A listed category: its heading and count, then its largest groups, each as
    ``count  old -> new`` over its first cube."""
    old, new = release_name(result.old), release_name(result.new)
    lines = ["", f"{title(result, category)}: {_inputs(category.count)}"]
    for group in category.groups[:GROUPS_SHOWN]:
        lines.append(f"  {group.count:>6}  {gist_text(group.old, result.host, old)} -> {gist_text(group.new, result.host, new)}")
        more = len(group.cubes) - 1
        lines.append(f"          {clipped(group.cubes[0])}" + (f"  (+{more} more cube{'s' if more != 1 else ''})" if more else ""))
    hidden = len(category.groups) - GROUPS_SHOWN
    if hidden > 0:
        lines.append(f"          ... and {hidden} more group{'s' if hidden != 1 else ''} (--json lists every one)")
    return lines


def text(result) -> str:
    """The report ``dsv4sel upgrade`` prints."""
    head = f"{result.label} {result.old} -> {result.new}"
    if not result.categories:
        return f"{head}: no change: {result.compared:,} inputs decide the same way\n"
    reworded = result.changed - result.decided
    lines = [f"{head}: {result.decided:,} of {result.compared:,} inputs decide differently"
             + (f", {reworded:,} more only reword a refusal or a log line" if reworded else ""),
             f"({result.old_rules} -> {result.new_rules}; a cube names only the inputs that do not take every value)"]
    counted = [f"{_inputs(c.count)}: {title(result, c)}" for c in result.categories if c.name in COUNTED]
    for category in result.categories:
        if category.name not in COUNTED:
            lines += _listed(result, category)
    if counted:
        lines += ["", *counted]
    present = {c.name for c in result.categories}
    unchanged = [short for name, short in UNCHANGED.items() if name not in present]
    if unchanged:
        lines += ["", "no change in: " + ", ".join(unchanged)]
    return "\n".join(lines) + "\n"


def view_dict(v) -> dict:
    """One exact outcome as data: ``kind``, the ``backend`` that selects or refuses, and for a
    selection its ``class`` (the host's, for this release), every select field, ``block_size``
    as this release builds it, ``rewrites``, ``messages``; for a refusal its ``reason``."""
    o = v.outcome
    if o.kind == "absent":
        return {"kind": "absent"}
    if o.kind == "gap":
        return {"kind": "undecided", "table": o.table}
    if o.kind == "reject":
        return {"kind": "reject", "backend": o.backend, "reason": o.reason}
    return {"kind": "select", "backend": o.backend, "class": v.host_class, "impl": o.impl, "layout": o.layout,
            "cache_dtype": o.cache_dtype, "torch_dtype": o.torch_dtype, "bytes_per_token": o.bytes_per_token,
            "block_size": v.block_size, "rewrites": dict(o.rewrites),
            "messages": [{"level": level, "text": message} for level, message in o.messages]}


def as_dict(result) -> dict:
    """``dsv4sel upgrade --json``: the releases and rule sets compared, ``compared``,
    ``changed`` and ``decided`` inputs (``changed`` less what only rewords), and every category (``category``, ``input``, ``title``, ``inputs``)
    with every group (``inputs``, ``cubes``, ``old``/``new`` as the text writes them, and
    ``changes``: each exact outcome pair with its ``inputs``, ``cubes``, ``old`` and ``new``)."""
    old, new = release_name(result.old), release_name(result.new)
    return {"version": 1, "host": result.host, "old": result.old, "new": result.new,
            "old_rules": result.old_rules, "new_rules": result.new_rules,
            "compared": result.compared, "changed": result.changed, "decided": result.decided,
            "categories": [{"category": c.name, "input": c.input, "title": title(result, c), "inputs": c.count,
                            "groups": [{"inputs": g.count, "cubes": list(g.cubes),
                                        "old": gist_text(g.old, result.host, old), "new": gist_text(g.new, result.host, new),
                                        "changes": [{"inputs": d.count, "cubes": list(d.cubes),
                                                     "old": view_dict(d.old), "new": view_dict(d.new)}
                                                    for d in g.details]}
                                       for g in c.groups]}
                           for c in result.categories]}
