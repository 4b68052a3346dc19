"""Exceptions raised by dsv4sel, and the escaping of the untrusted text they carry.

Both public exceptions subclass :class:`ValueError`, as :mod:`packaging` does
for invalid input, so callers that already guard configuration parsing with
``except ValueError`` keep working.
"""

from __future__ import annotations

from .record import Frozen

# C0 controls, DEL, C1 controls, and the bidirectional overrides that can
# make text read differently from what it is ("Trojan source").
_BIDI = "\u202a-\u202e\u2066-\u2069"
_CONTROL = "[\x00-\x1f\x7f-\x9f" + _BIDI + "]"
_CONTROL_IN_TEXT = "[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "]"
_compiled: dict[str, object] = {}


def _pattern(source: str):
    # compiled on first use: `re` is not imported on select()'s cold path
    pattern = _compiled.get(source)
    if pattern is None:
        import re

        pattern = _compiled[source] = re.compile(source)
    return pattern


def control_character(text: str, *, in_text: bool = False) -> str | None:
    """The first character of ``text`` that no name (``in_text``: no text,
    which may hold newlines and tabs) may hold, or None."""
    if text.isprintable():  # no control or format character at all: the common case
        return None
    match = _pattern(_CONTROL_IN_TEXT if in_text else _CONTROL).search(text)
    return match.group() if match else None


def _escaped(match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character written as an escape.

    ``keep_newlines`` keeps newlines and tabs (multi-line messages)."""
    if text.isprintable():
        return text
    return _pattern(_CONTROL_IN_TEXT if keep_newlines else _CONTROL).sub(_escaped, text)


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


TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs cold start; annotations are postponed
    from typing import Protocol

    class RuleLike(Protocol):
        """What an error says of a rule: :class:`dsv4sel.engine.values.RuleRef` (named
        here structurally: this module sits below the engine and imports none of it)."""

        @property
        def id(self) -> str: ...

        @property
        def location(self) -> str: ...
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
        rule: RuleLike | None = None,
        query: object | None = None,
        path: tuple[RuleLike, ...] = (),
        origin: str | None = None,
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
        #: ``file:line`` of what decided the refusal when that is not a rule of ``path`` (a host
        #: translation's row), else the deciding rule's location; None when nothing decided it
        self.origin = origin if origin is not None or rule is None else rule.location
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
