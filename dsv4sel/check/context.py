"""What every check of ``dsv4sel check`` shares, made explicit.

A :class:`CheckContext` holds the program under check and the machinery
built once for it: the fused space, the cube writer that turns boxes into
readable cubes, the chain walker with its memoized table scans, and the
selection field checker. Checks (:mod:`dsv4sel.check.tables`,
:mod:`dsv4sel.check.chains`, :mod:`dsv4sel.check.selections`) are functions
of a context that yield :class:`~dsv4sel.check.findings.Finding` values; the
driver (:func:`dsv4sel.check.verifier.verify_program`) collects them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .cubes import CubeWriter
from .findings import Finding, Input
from ..engine.flow import Flow
from .outcomes import FieldChecker, needs_regions
from ..engine.space import Box, Space

if TYPE_CHECKING:
    from ..engine.codes import Kind
    from ..engine.model import Table
    from ..engine.values import RuleRef


class CheckContext:
    """The program under check and the machinery built once for it."""

    #: every request: no backend (the platform default), then each backend
    starts: tuple[str | None, ...]
    #: (select field, input it restates) pairs of the profile whose input is declared:
    #: a rewrite of such a field must be a fixpoint (:mod:`dsv4sel.check.selections`)
    restates: tuple[tuple[str, str], ...]

    # Left unannotated on purpose: typed, ``self.flow`` would be a typed Flow whose events
    # (engine.flow.Event) type their table and rule as ``object``, which the checks cannot use
    # until the engine types its events per kind.
    def __init__(self, program, layouts=None):
        self.program = program
        self.space = Space(program.inputs)
        self.writer = CubeWriter(self.space, program.inputs, program.backends, program.profile.key)
        self.flow = Flow(program, self.space, needs=needs_regions)
        self.checker = FieldChecker(tuple(program.allowed_impl_modules), layouts)
        self.starts = (None, *program.backends)
        self.restates = tuple(
            (field, name) for field, name in program.profile.restates if name in program.inputs)

    def requests(self, table: Table) -> tuple[str | None, ...]:
        """The backends whose requests consult ``table`` first."""
        return tuple(table.backends) if table.backends else (None,)

    def input(self, box: Box, backend: str | None) -> Input:
        """The first input of ``box`` requested with ``backend``: a counterexample."""
        return self.writer.input(self.space.first_point(box), backend)

    def finding(self, severity: str, kind: Kind, message: str, ref: RuleRef, **extra: Any) -> Finding:
        """A finding located at rule (or table) reference ``ref``."""
        return Finding(severity, kind, message, ref.file, ref.line, None, **extra)


def table_label(table: Table) -> str:
    return "the default-backend decision" if not table.backends else f"table {table.name}"
