"""The primitives of the text reports: colour, columns, wrapping, a query's place.

Every command's human output is built from these, so all of them colour, align
and wrap the same way. Colour is used only when the stream is a terminal,
``NO_COLOR`` is unset or empty (https://no-color.org) and ``TERM`` is not
``dumb``; piped output is therefore plain, byte-for-byte stable text. Columns are aligned on the plain
text and coloured afterwards, so escape codes never shift a column.
"""

from __future__ import annotations

import os
import sys

from ...engine import locations as _locations

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of cold start; annotations are postponed
    from typing import Callable, Collection, Sequence, TextIO, Union

    #: A table cell: plain text, or (text, colour names...) painted after alignment.
    Cell = Union[str, tuple]

#: The width ``explain``'s report is wrapped to in a pipe or a file.
PIPE_WIDTH = 100
#: Joins the words of a path inside a report line until :func:`wrap_line` has placed it,
#: so that a path with a blank in it is never wrapped there (a private-use character).
_GLUE = "\ue000"
#: The installed dsv4sel package: a location inside it is shown from its name on.
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


class Style:
    """Colour functions (``style.red(text)``...) that are identity when disabled."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def paint(self, text: str, *names: str) -> str:
        if not self.enabled or not names or not text:
            return text
        return "\033[" + ";".join(_CODES[n] for n in names) + "m" + text + "\033[0m"

    def __getattr__(self, name: str) -> Callable[[str], str]:
        if name in _CODES:
            return lambda text: self.paint(text, name)
        raise AttributeError(name)


def colour_wanted(stream: TextIO) -> bool:
    """True when ``stream`` should get colour (see the module docstring)."""
    if os.environ.get("NO_COLOR", ""):
        return False
    if os.environ.get("TERM", "") == "dumb":
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


def style_for(stream: TextIO | None = None) -> Style:
    return Style(colour_wanted(stream if stream is not None else sys.stdout))


def align(rows: Sequence[Sequence[Cell]], style: Style, indent: int = 2, gap: int = 2,
          right: Collection[int] = ()) -> list[str]:
    """Lay ``rows`` out in columns, left-aligned except the column numbers in
    ``right`` (figures); the last column is not padded (no trailing blanks).
    Rows may be shorter than others. A cell is a string or ``(text, colour...)``.
    The one aligner of every command's text output."""
    plain = [[c if isinstance(c, str) else c[0] for c in row] for row in rows]
    ncols = max((len(r) for r in plain), default=0)
    widths = [max((len(r[i]) for r in plain if len(r) > i), default=0) for i in range(ncols)]
    lines = []
    for row, texts in zip(rows, plain):
        parts = []
        for i, (cell, text) in enumerate(zip(row, texts)):
            fill = " " * (widths[i] - len(text))
            lead, trail = (fill, "") if i in right else ("", fill)
            pad = "" if i == len(row) - 1 else trail + " " * gap
            painted = text if isinstance(cell, str) else style.paint(text, *cell[1:])
            parts.append(lead + painted + pad)
        lines.append((" " * indent + "".join(parts)).rstrip())
    return lines


def location(where) -> str:
    """``where`` (a Loc, or anything with one as ``.loc``) as ``file:line[:column]``, as
    :func:`dsv4sel.engine.locations.location` writes it (so that it opens from here), except
    a file inside the installed dsv4sel package, which is shown from the package on
    (``dsv4sel/rules/flashmla.yaml:34``, not a site-packages path as long as the line): the
    renderers' one way to write a location."""
    text = _locations.location(where)
    if text.startswith(_PACKAGE + os.sep):
        return os.path.basename(_PACKAGE) + text[len(_PACKAGE):]
    return text


def unbroken(text: str) -> str:
    """``text`` (a path, a location) as one word for :func:`wrap_line`, which never breaks a
    line inside it, blanks included. Only for lines that go through :func:`wrap_lines`."""
    return text.replace(" ", _GLUE)


def where(query) -> str:
    """A query's platform and capability as the reports name them: ``cuda 9.0``, ``cpu capability unknown``."""
    cap = "capability unknown" if query.capability == "unknown" else query.capability
    return f"{query.platform} {cap}"


_ANSI = None


def _visible(text: str) -> str:
    global _ANSI
    if _ANSI is None:
        import re

        _ANSI = re.compile(r"\x1b\[[0-9;]*m")
    return _ANSI.sub("", text)


def output_width(stream: TextIO | None = None) -> int | None:
    """The width to wrap human output to when ``stream`` is a terminal: the
    terminal's (:func:`terminal_columns`, which honours ``COLUMNS``).
    None for a pipe or a file, whose output stays one line per item for
    scripts, whatever ``COLUMNS`` says (GNU readline exports it into the
    environment of every child process of a program that loaded it)."""
    stream = stream if stream is not None else sys.stdout
    isatty = getattr(stream, "isatty", None)
    if not (isatty and isatty()):
        return None
    return max(terminal_columns(100), 40)


def terminal_columns(fallback: int = 80) -> int:
    """The terminal's width as ``shutil.get_terminal_size((fallback, 24)).columns`` reads it:
    ``COLUMNS`` when a positive number, else the width of the terminal on stdout, else
    ``fallback``. Without importing shutil (bz2 and lzma with it: ~7M instructions, 2 ms of a
    cold start)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns <= 0:
        stdout = sys.__stdout__  # None in a process started without one: the fallback
        try:
            columns = os.get_terminal_size(stdout.fileno()).columns if stdout is not None else 0
        except (AttributeError, ValueError, OSError):
            columns = 0
    return columns or fallback


def _hang(plain: str, width: int) -> int:
    """Where continuation lines start: the last column (after a run of two or
    more blanks) that leaves room to read, else the indent plus four."""
    indent = len(plain) - len(plain.lstrip(" "))
    best = None
    i = plain.find("  ", indent)
    while i != -1 and i < width - 24:
        j = i
        while j < len(plain) and plain[j] == " ":
            j += 1
        best = j
        i = plain.find("  ", j)
    return best if best is not None and best <= width // 2 + 10 else min(indent + 4, width // 2)


def report_width(stream: TextIO | None = None) -> int:
    """The width ``explain``'s report is wrapped to: the terminal's (:func:`output_width`),
    or :data:`PIPE_WIDTH` for a pipe or a file. (The other commands' piped output is not
    wrapped: a finding, a table row, stays one line for ``grep``.)"""
    return output_width(stream) or PIPE_WIDTH


def wrap_line(line: str, width: int | None) -> list[str]:
    """``line`` wrapped to ``width`` visible columns (ANSI colour codes take
    none): continuation lines hang under the last column, so aligned
    ``label  value`` rows stay aligned. textwrap does the words; a word is
    never broken, so neither is a path or a ``file:line`` (nor one made
    :func:`unbroken`, blanks and all)."""
    return [piece.replace(_GLUE, " ") for piece in _wrap_line(line, width)]


def _wrap_line(line: str, width: int | None) -> list[str]:
    if width is None or len(_visible(line)) <= width:
        return [line]
    import textwrap

    plain = _visible(line)
    hang = _hang(plain, width)
    if hang > width // 2:  # the columns before the last leave it no room: hang under the first one
        hang = len(plain) - len(plain.lstrip(" ")) + 2
    if plain != line:  # coloured: map the hang column onto the raw string
        seen = raw = 0
        while seen < hang and raw < len(line):
            if line[raw] == "\x1b":
                raw = line.index("m", raw) + 1
                continue
            seen += 1
            raw += 1
        head, tail = line[:raw], line[raw:]
    else:
        head, tail = line[:hang], line[hang:]
    chunks = textwrap.wrap(tail, width - hang, break_on_hyphens=False, break_long_words=False) if plain == line else _words(tail, width - hang)
    if not chunks:
        return [line]
    return [head + chunks[0]] + [" " * hang + c for c in chunks[1:]]


def _words(text: str, width: int) -> list[str]:
    """Greedy word wrap measuring visible length (for coloured text)."""
    out, current = [], ""
    for word in text.split(" "):
        if current and len(_visible(current)) + 1 + len(_visible(word)) > width:
            out.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        out.append(current)
    return out


def wrap_lines(lines, width: int | None) -> list[str]:
    return [piece for line in lines for piece in wrap_line(line, width)]


def wrapped(text: str, stream: TextIO | None = None) -> str:
    """``text`` (lines ending in newline) wrapped to ``stream``'s terminal width."""
    width = output_width(stream)
    if width is None:
        return text
    lines = text.split("\n")
    return "\n".join(wrap_lines(lines, width))
