"""Terminal output shared by explain, table and doctor: colour and alignment.

Colour is used only when the stream is a terminal, ``NO_COLOR`` is unset or
empty (https://no-color.org) and ``TERM`` is not ``dumb``; piped output is
therefore plain, byte-for-byte stable text. Columns are aligned on the plain
text and coloured afterwards, so escape codes never shift a column.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing costs ~5 ms of cold start; annotations are postponed
    from typing import Callable, Sequence, TextIO, Union

    #: A table cell: plain text, or (text, colour names...) painted after alignment.
    Cell = Union[str, tuple]

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


def align(rows: Sequence[Sequence[Cell]], style: Style, indent: int = 2, gap: int = 2) -> list[str]:
    """Lay ``rows`` out in left-aligned columns; the last column is not padded
    (no trailing blanks). Rows may be shorter than others."""
    plain = [[c if isinstance(c, str) else c[0] for c in row] for row in rows]
    ncols = max((len(r) for r in plain), default=0)
    widths = [max((len(r[i]) for r in plain if len(r) > i), default=0) for i in range(ncols)]
    lines = []
    for row, texts in zip(rows, plain):
        parts = []
        for i, (cell, text) in enumerate(zip(row, texts)):
            pad = "" if i == len(row) - 1 else " " * (widths[i] - len(text) + gap)
            painted = text if isinstance(cell, str) else style.paint(text, *cell[1:])
            parts.append(painted + pad)
        lines.append((" " * indent + "".join(parts)).rstrip())
    return lines


def error(prog: str, message: str) -> int:
    """Print a usage/input error the argparse way and return exit status 2."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2
