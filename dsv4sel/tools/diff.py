"""``dsv4sel diff``: every input whose outcome changes between two rule sets.

Both rule sets are compiled to their outcome tables; every key of either
space is compared by what a serving engine sees (backend, impl, layout, cache
dtype, torch dtype, bytes per token, block size, rewrites, messages, or the
rejection reason) — not by rule ids or line numbers, so moving or renaming a
rule is not a change. Changed inputs with the same (old, new) pair are
grouped into compact cubes, e.g. ``platform=cuda capability=12.x``.
"""

from __future__ import annotations

from ..check.cubes import describe
from ..engine.space import merge
from ..record import Frozen
from ..dsv4.rules import RuleSet

ABSENT = ("absent",)


def _summary(rules: RuleSet, key: tuple) -> tuple[tuple, tuple]:
    """(what is compared, what groups changes): rejections whose reason text
    differs only by the query's values (templates) group by the deciding rule."""
    row = rules.row(key)
    if row is None:
        return ABSENT, ABSENT
    if row.kind == "select":
        summary = ("select", row.backend, row.impl, row.layout, row.cache_dtype, row.torch_dtype,
                   row.bytes_per_token, row.block_size, tuple(row.rewrites), tuple(tuple(m) for m in row.messages),
                   tuple(row.hosts))
        return summary, summary
    rule = rules.rule(row.path[-1]).id if row.path else ""
    detail = row.reason if row.kind == "reject" else row.table
    return (row.kind, row.backend, detail), (row.kind, row.backend, rule)


def describe_outcome(summary: tuple) -> str:
    """One line for an outcome summary."""
    kind = summary[0]
    if kind == "absent":
        return "not in the decision space"
    if kind == "gap":
        return f"undecided (no rule in {summary[2]})"
    if kind == "reject":
        return f"reject ({summary[1] or 'default'}): {summary[2]}"
    _, backend, impl, layout, cache_dtype, torch_dtype, bpt, block, rewrites, messages, hosts = summary
    text = f"select {backend} layout={layout} cache_dtype={cache_dtype} torch={torch_dtype} " \
           f"bytes/token={bpt} block={block}"
    if rewrites:
        text += " rewrites=" + ",".join(f"{k}->{v}" for k, v in rewrites)
    if messages:
        text += f" messages={len(messages)}"
    text += f" impl={impl}"
    for host, cls, _versions in hosts:
        text += f" {host}={cls.rpartition(':')[2]}"
    return text


class Change(Frozen):
    """Inputs (``count`` of them, written as ``cubes``) whose outcome went from ``old`` to ``new``."""

    __slots__ = ("count", "cubes", "old", "new")

    def to_dict(self) -> dict:
        return {"inputs": self.count, "cubes": list(self.cubes),
                "old": describe_outcome(self.old), "new": describe_outcome(self.new)}


class Diff(Frozen):
    """All changes between two rule sets; ``compared`` counts the inputs of both spaces."""

    __slots__ = ("changes", "compared")

    @property
    def changed(self) -> int:
        return sum(c.count for c in self.changes)

    def to_dict(self) -> dict:
        return {"compared": self.compared, "changed": self.changed,
                "changes": [c.to_dict() for c in self.changes]}


def diff(old: RuleSet, new: RuleSet) -> Diff:
    """Compare every input of ``old`` and ``new`` (the union of their spaces)."""
    names = old.key_inputs
    if names != new.key_inputs:
        # a different set of inputs (a pack added one): compare on the union, absent on one side
        names = tuple(dict.fromkeys((*old.key_inputs, *new.key_inputs)))
    domains: list[dict] = [{} for _ in names]

    def widen(rules: RuleSet, key: tuple) -> tuple:
        values = dict(zip(rules.key_inputs, key))
        return tuple(values.get(n, "<absent>") for n in names)

    def narrow(rules: RuleSet, key: tuple) -> tuple:
        values = dict(zip(names, key))
        return tuple(values.get(n) for n in rules.key_inputs)

    keys: dict[tuple, None] = {}
    for rules in (old, new):
        for key in rules.keys():
            wide = widen(rules, key)
            keys.setdefault(wide, None)
            for domain, value in zip(domains, wide):
                domain.setdefault(value, len(domain))
    groups: dict[tuple, list] = {}
    examples: dict[tuple, tuple] = {}
    for key in keys:
        (before, group_before), (after, group_after) = _summary(old, narrow(old, key)), _summary(new, narrow(new, key))
        if before != after:
            box = tuple(1 << domain[v] for domain, v in zip(domains, key))
            group = (group_before, group_after)
            groups.setdefault(group, []).append(box)
            examples.setdefault(group, (before, after))
    changes = []
    ordered = [list(d) for d in domains]
    for group, boxes in groups.items():
        before, after = examples[group]
        cubes = []
        for box, _ in merge((b, frozenset()) for b in boxes):
            parts = []
            for name, bits, domain in zip(names, box, ordered):
                chosen = [v for i, v in enumerate(domain) if bits >> i & 1]
                parts.append(f"{name}={describe(chosen, domain)}")
            cubes.append(" ".join(parts))
        changes.append(Change(len(boxes), tuple(cubes), before, after))
    # changed decisions first (what a reviewer must look at), then inputs a new vocabulary adds
    changes.sort(key=lambda c: (c.old == ABSENT or c.new == ABSENT, -c.count))
    return Diff(tuple(changes), len(keys))
