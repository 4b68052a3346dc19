"""The values :func:`dsv4sel.verify` returns: findings, coverage, the report.

All are frozen dataclasses of plain values (strings, ints, tuples,
:class:`~dsv4sel.engine.values.RuleRef`), so a report can be compared, hashed,
pickled and turned into JSON with :meth:`Report.to_dict`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator

from ..engine.sources import openable
from ..engine.values import RuleRef
from ..errors import Loc

if TYPE_CHECKING:
    from ..engine.codes import Kind

ERROR, WARNING = "error", "warning"


class VerifyError(ValueError):
    """Verification could not start: a rule path does not exist, a directory
    holds no rule files, or a RuleSet's files can no longer be found.

    Problems *inside* rule files are not raised: they are findings.
    """


def _show(value: str | None) -> str:
    return "<none>" if value is None else value


@dataclass(frozen=True)
class Input:
    """One concrete input of the decision: every input's value plus the
    requested backend (None: no backend requested, the platform default)."""

    values: tuple[tuple[str, str | None], ...]

    def as_dict(self) -> dict[str, str | None]:
        return dict(self.values)

    def __str__(self) -> str:
        return " ".join(f"{k}={_show(v)}" for k, v in self.values)


@dataclass(frozen=True)
class Cube:
    """A set of inputs written compactly: every input with the values it
    takes. The set is the product of them, keeping only declared inputs:
    ``scopes`` lists, for each scoped input (capability), its parent input
    (platform) and the values declared per parent value, so
    ``platform=cuda,rocm capability=*`` means every capability of either.
    ``text`` abbreviates: ``*`` for all declared values, ``12.x`` for a
    whole family, ``not(a,b)`` for all but a few."""

    values: tuple[tuple[str, tuple[str | None, ...]], ...]
    text: str
    scopes: tuple[tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...]], ...] = ()

    def points(self) -> Iterator[dict[str, str | None]]:
        names = [k for k, _ in self.values]
        # keyed by str | None: a point's value may be None (no backend requested), a parent's never is
        allowed: list[tuple[str, str, dict[str | None, set[str]]]] = [
            (child, parent, {p: set(vals) for p, vals in table}) for child, parent, table in self.scopes]
        for combo in itertools.product(*(v for _, v in self.values)):
            point = dict(zip(names, combo))
            if all(point[child] in table.get(point[parent], ()) for child, parent, table in allowed):
                yield point

    @property
    def size(self) -> int:
        return sum(1 for _ in self.points())

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class Finding:
    """One problem found in the rules.

    ``file``/``line``/``column`` locate it (``column`` is None for findings
    about whole rules, which are located at the rule's line). ``rules`` are
    the rules involved, each with file and line. ``counterexample`` is one
    concrete input showing the problem (None for dead rules, which match no
    input, and for problems found before the space could be analysed).
    ``cubes`` is the set of inputs concerned (gaps and overlaps) as a union
    of disjoint cubes, ``count`` its size in inputs (0 when not
    applicable). ``table`` names the table.
    """

    severity: str
    kind: Kind
    message: str
    file: str
    line: int
    column: int | None = None
    rules: tuple[RuleRef, ...] = ()
    counterexample: Input | None = None
    cubes: tuple[Cube, ...] = ()
    count: int = 0
    table: str | None = None
    #: the stable code (``DSV401``...; :mod:`dsv4sel.engine.codes`); a problem of a
    #: stage brings its own, a finding of the verifier takes its kind's
    code: str = ""

    def __post_init__(self) -> None:
        from ..engine.text import escape

        # a message may quote what an impl module raised at import, or a file name: what
        # verify()'s callers and every format get holds no control character
        object.__setattr__(self, "message", escape(self.message, keep_newlines=True))
        object.__setattr__(self, "file", escape(self.file))
        if not self.code:
            from ..engine.codes import kind_code

            object.__setattr__(self, "code", kind_code(self.kind))

    @property
    def loc(self) -> Loc:
        return Loc(self.file, self.line, self.column)

    @property
    def location(self) -> str:
        """``file:line[:column]``: ``str(self.loc)``."""
        return str(self.loc)

    def __str__(self) -> str:
        return f"{self.location}: {self.severity} {self.code} [{self.kind}] {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "code": self.code,
            "severity": self.severity,
            "kind": self.kind,
            "message": self.message,
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": openable(self.file),
            "table": self.table,
            "rules": [{"id": r.id, "file": r.file, "line": r.line, "path": openable(r.file)} for r in self.rules],
            "counterexample": self.counterexample.as_dict() if self.counterexample else None,
            "cubes": [{"text": c.text, "values": {k: list(v) for k, v in c.values}} for c in self.cubes],
            "count": self.count,
        }


@dataclass(frozen=True)
class Counts:
    """How many inputs select, reject, or are undecided (gaps)."""

    select: int = 0
    reject: int = 0
    undecided: int = 0

    @property
    def total(self) -> int:
        return self.select + self.reject + self.undecided

    def to_dict(self) -> dict[str, int]:
        return {"select": self.select, "reject": self.reject, "undecided": self.undecided,
                "total": self.total}


@dataclass(frozen=True)
class BackendCoverage:
    """The inputs that request ``backend`` (None: no backend requested)."""

    backend: str | None
    table: str
    file: str
    counts: Counts


@dataclass(frozen=True)
class RuleCoverage:
    """One rule's share of the space.

    ``inputs``: inputs whose decision path includes the rule (for a ``use``
    rule, the inputs it routes; otherwise those it decides). ``points``:
    points of its own table's space where it is the first match.
    """

    rule: RuleRef
    table: str
    outcome: str
    inputs: int
    points: int


@dataclass(frozen=True)
class Coverage:
    """The size of the decision space and how the rules divide it.

    ``points`` counts combinations of the vocabulary's inputs; each is asked
    with every one of ``backend_choices`` (no backend, or one of the declared
    backends), so ``inputs == points * backend_choices == totals.total``.
    """

    points: int
    backend_choices: int
    totals: Counts
    backends: tuple[BackendCoverage, ...]
    rules: tuple[RuleCoverage, ...]

    @property
    def inputs(self) -> int:
        return self.points * self.backend_choices

    def to_dict(self) -> dict[str, Any]:
        return {
            "points": self.points,
            "backend_choices": self.backend_choices,
            "inputs": self.inputs,
            "totals": self.totals.to_dict(),
            "backends": [{"backend": b.backend, "table": b.table, "file": b.file, **b.counts.to_dict()}
                         for b in self.backends],
            "rules": [{"id": r.rule.id, "file": r.rule.file, "line": r.rule.line, "table": r.table,
                       "outcome": r.outcome, "inputs": r.inputs, "points": r.points}
                      for r in self.rules],
        }


@dataclass(frozen=True)
class Report:
    """The result of verifying a rule set.

    ``findings`` are sorted by file, line, kind. ``coverage`` is None when
    load, schema or compile problems kept the space from being analysed
    (``analysed`` False): those problems are then the findings.
    ``ok`` is True exactly when there are no findings.
    """

    sources: tuple[str, ...]
    findings: tuple[Finding, ...]
    coverage: Coverage | None
    rule_count: int = 0
    table_count: int = 0
    analysed: bool = True
    #: per host translation, how its host's space was decided (:mod:`dsv4sel.check.host_spaces`;
    #: empty unless the default rules were checked)
    hosts: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.findings

    @property
    def errors(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == ERROR)

    @property
    def warnings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.severity == WARNING)

    def of_kind(self, kind: Kind) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.kind == kind)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "ok": self.ok,
            "analysed": self.analysed,
            "sources": list(self.sources),
            "rule_count": self.rule_count,
            "table_count": self.table_count,
            "findings": [f.to_dict() for f in self.findings],
            "coverage": self.coverage.to_dict() if self.coverage else None,
            "hosts": [h.to_dict() for h in self.hosts],
        }
