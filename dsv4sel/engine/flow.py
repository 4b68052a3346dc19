"""Following inputs through the chain of tables, cube by cube.

A query names a backend (its table decides) or none (the default table
decides, usually by ``use: BACKEND``, whose table then decides). ``use:``
rules inside backend tables chain further. :class:`Flow` runs this chain
for a whole cube at once: it scans the first table over the cube
(:func:`dsv4sel.engine.scan.scan`), and for each ``use`` rule scans the target
table over the cubes that rule won, and so on. Scans are memoized per
(table, cube), so the default table's routes reuse the backend tables' own
scans, and every table is scanned over the whole space exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from .scan import Scan, TableIndex, scan
from .space import Box, Space, merge


@dataclass(frozen=True)
class Event:
    """One step of a flow.

    ``kind``: ``decide`` (rule ``rule`` of ``table`` decides ``count`` inputs
    with a select or reject), ``route`` (``use`` rule ``rule`` sends ``count``
    inputs on), ``gap`` (no rule of ``table`` matches ``box``), ``dangling``
    (a ``use`` target without a table) or ``cycle`` (the chain revisits a
    table). ``label`` is the backend whose table is consulted (None: the
    default table); ``path`` the ``use`` rules that led here.
    """

    kind: str
    table: object
    label: str | None
    path: tuple
    count: int
    rule: object = None
    position: int = -1
    box: Box | None = None
    scan: Scan | None = None


class Flow:
    """Walks a :class:`~dsv4sel.engine.compile.Program` over cubes of its space.

    ``needs`` returns True for rules whose win regions a caller wants per
    cube (beyond ``use`` rules, whose regions the walk itself needs).
    """

    def __init__(self, program, space: Space, needs=lambda rule: False):
        self.program = program
        self.space = space
        self.tables = {program.default_table.name: program.default_table}
        for table in (*program.tables.values(), *program.request_tables.values()):
            self.tables.setdefault(table.name, table)
        self.indexes: dict[str, TableIndex] = {
            name: TableIndex(space, [rule.conditions for rule in table.rules])
            for name, table in self.tables.items()}
        self.record: dict[str, frozenset[int]] = {
            name: frozenset(i for i, rule in enumerate(table.rules)
                            if rule.outcome.kind == "use" or needs(rule))
            for name, table in self.tables.items()}
        self._memo: dict[tuple, Scan] = {}

    def table_scan(self, table, box: Box | None = None, detail: bool = False) -> Scan:
        """The (memoized) scan of ``table`` over ``box`` (None: everything).
        ``detail`` keeps every rule's win regions, not just the needed ones."""
        full = self.space.full
        key = (table.name, full if box is None else tuple(box), detail)
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = scan(self.indexes[table.name], key[1],
                                         None if detail else self.record[table.name])
        return hit

    def start_table(self, backend: str | None):
        return self.program.table_for(backend)

    def walk(self, backend: str | None, box: Box | None = None, detail: bool = False) -> Iterator[Event]:
        """The events of deciding every input of ``box`` requested with ``backend``."""
        yield from self._walk(self.start_table(backend), backend, box, (), detail)

    def _walk(self, table, label, box, path, detail) -> Iterator[Event]:
        result = self.table_scan(table, box, detail)
        for gap in result.gaps:
            yield Event("gap", table, label, path, self.space.size(gap), box=gap)
        for position, count in enumerate(result.won):
            if not count:
                continue
            rule = table.rules[position]
            if rule.outcome.kind != "use":
                yield Event("decide", table, label, path, count, rule, position, scan=result)
                continue
            yield Event("route", table, label, path, count, rule, position, scan=result)
            target = rule.outcome.target
            regions = merge((b, frozenset()) for b in result.regions.get(position, ()))
            if target not in self.program.tables:
                for region, _ in regions:
                    yield Event("dangling", table, label, path + (rule,), self.space.size(region), rule,
                                position, box=region)
                continue
            nxt = self.program.tables[target]
            if nxt.name in {r.table for r in path} or nxt is table:
                for region, _ in regions:
                    yield Event("cycle", table, label, path + (rule,), self.space.size(region), rule,
                                position, box=region)
                continue
            for region, _ in regions:
                yield from self._walk(nxt, target, region, path + (rule,), detail)
