"""Exceptions raised by dsv4sel.

Both public exceptions subclass :class:`ValueError`, as :mod:`packaging` does
for invalid input, so callers that already guard configuration parsing with
``except ValueError`` keep working.
"""

from __future__ import annotations

from .engine.text import escape
from .record import Frozen


class Loc(Frozen):
    """A place in a rule file: ``file``, the 1-based ``line`` and ``column``
    (None: the whole line, as for a rule). The one location type: problems,
    findings and rule references each give theirs as ``.loc``, and
    ``str(loc)`` is the one spelling, ``file:line[:column]``."""

    __slots__ = ("file", "line", "column")
    _defaults = {"column": None}
    file: str
    line: int
    column: int | None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}" if self.column is None else f"{self.file}:{self.line}:{self.column}"


def location(where) -> str:
    """``where`` (a :class:`~dsv4sel.errors.Loc`, or anything with one as ``.loc``: a rule,
    a problem, a finding) as ``file:line[:column]``, its file written so that it opens from
    the working directory: the short name where it does (``rules/flashmla.yaml:27`` in a
    checkout; a pack given as a relative path), else :func:`dsv4sel.engine.sources.openable`
    (the shipped rules of a wheel install, an installed pack). The one way every command's
    text, and every message of ``check`` and ``test``, writes a location; ``--json`` gives
    both (``file`` and ``path``)."""
    from .engine.sources import shown

    loc = where if isinstance(where, Loc) else where.loc
    path = loc.file if not_a_file(loc.file) else shown(loc.file)
    return str(Loc(path, loc.line, loc.column))


def not_a_file(name: str) -> bool:
    """Whether a problem's ``file`` names no file (``<rules>``, ``$DSV4SEL_ALLOW_IMPL_MODULES``):
    it has no path to open, and is shown as it is."""
    return name.startswith(("<", "$"))


class Problem(Frozen):
    """One problem in one rule file, located at ``file:line:column`` (1-based),
    with the stable ``code`` of its kind (``DSV301``...; see :mod:`dsv4sel.engine.codes`),
    set where the problem is found: callers and tests match codes, never text."""

    __slots__ = ("file", "line", "column", "message", "code")
    file: str
    line: int
    column: int | None
    message: str
    code: str

    @property
    def loc(self) -> Loc:
        return Loc(self.file, self.line, self.column)

    def __str__(self) -> str:
        return f"{self.loc}: {self.message}"


class RuleError(ValueError):
    """The rule files are unusable.

    ``problems`` holds every problem found (all files, all stages that could
    run), each with file, line and column. ``file``, ``line`` and ``column``
    repeat the first problem's location for callers that want just one.
    """

    def __init__(self, problems: list[Problem] | tuple[Problem, ...]):
        # a problem may quote a file name, an environment variable or metadata: what Python
        # callers read (``problems``, ``str()``) never holds a control character
        self.problems: tuple[Problem, ...] = tuple(_neutral_problem(p) for p in problems)
        first = self.problems[0] if self.problems else Problem("<rules>", 0, 0, "unknown error", "DSV399")
        self.file, self.line, self.column = first.file, first.line, first.column
        count = len(self.problems)
        head = f"{count} problem{'s' if count != 1 else ''} in the rule files"
        super().__init__(head + ":\n" + "\n".join(f"  {p}" for p in self.problems))


def _neutral_problem(problem: Problem) -> Problem:
    """``problem`` with control characters in its file name and message escaped."""
    file, message = escape(problem.file), escape(problem.message, keep_newlines=True)
    if file is problem.file and message is problem.message:
        return problem
    return Problem(file, problem.line, problem.column, message, problem.code)


class SelectionError(ValueError):
    """No backend can serve the query.

    The message names the offending inputs and the reason. ``suggestions``
    lists concrete alternatives that would select, as engine flags such as
    ``--kv-cache-dtype fp8`` (empty when nothing nearby works). ``rule`` is
    the rule that rejected the query, or None when the query itself was
    invalid (an unknown backend name, a malformed capability, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        suggestions: tuple[str, ...] = (),
        rule: object | None = None,
        query: object | None = None,
        path: tuple = (),
    ):
        # the message may echo a query value (or anything a caller passed): control characters
        # (colour codes, cursor moves, bidi overrides) are written as escapes, here, once, so
        # that neither str(exc), a log line nor a terminal gets them raw
        message = escape(message, keep_newlines=True)
        self.reason = message
        self.suggestions: tuple[str, ...] = tuple(escape(s) for s in suggestions)
        self.rule = rule
        self.query = query
        self.path = tuple(path)
        text = message
        if self.suggestions:
            text += "\nWould work: " + ", ".join(self.suggestions)
        super().__init__(text)


class InvalidQuery(SelectionError):
    """The query names a value outside the rules' vocabulary (a typo, an unknown backend)."""


class ImplLoadError(ImportError):
    """An impl class named by a rule could not be imported."""

    def __init__(self, message: str):
        # the message quotes the exception the module raised at import: its text is the module's
        super().__init__(escape(message, keep_newlines=True))
