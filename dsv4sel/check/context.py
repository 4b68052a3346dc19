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

from .cubes import CubeWriter
from .findings import Finding
from ..engine.flow import Flow
from .outcomes import FieldChecker, needs_regions
from ..engine.space import Space


class CheckContext:
    """The program under check and the machinery built once for it."""

    def __init__(self, program, layouts=None):
        self.program = program
        self.space = Space(program.inputs)
        self.writer = CubeWriter(self.space, program.inputs, program.backends, program.profile.key)
        self.flow = Flow(program, self.space, needs=needs_regions)
        self.checker = FieldChecker(tuple(program.allowed_impl_modules), layouts)
        #: every request: no backend (the platform default), then each backend
        self.starts: tuple[str | None, ...] = (None, *program.backends)
        #: (select field, input it restates) pairs of the profile whose input is declared:
        #: a rewrite of such a field must be a fixpoint (:mod:`dsv4sel.check.selections`)
        self.restates: tuple[tuple[str, str], ...] = tuple(
            (field, name) for field, name in program.profile.restates if name in program.inputs)

    def requests(self, table) -> tuple[str | None, ...]:
        """The backends whose requests consult ``table`` first."""
        return tuple(table.backends) if table.backends else (None,)

    def input(self, box, backend):
        """The first input of ``box`` requested with ``backend``: a counterexample."""
        return self.writer.input(self.space.first_point(box), backend)

    def finding(self, severity, kind, message, ref, **extra) -> Finding:
        """A finding located at rule (or table) reference ``ref``."""
        return Finding(severity, kind, message, ref.file, ref.line, None, **extra)


def table_label(table) -> str:
    return "the default-backend decision" if not table.backends else f"table {table.name}"
