"""Untrusted text made safe to show on a terminal.

Rule files, file names and query values are written by other people; a
control character in them could clear the screen, move the cursor or paint
forged "selected" text when dsv4sel prints it. The loader refuses such
characters in rule files, and every human-readable output passes through
:func:`escape`, which writes them as ``\\xNN`` / ``\\uNNNN`` escapes.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, and the bidirectional overrides that can
# make text read differently from what it is ("Trojan source").
_BIDI = "\u202a-\u202e\u2066-\u2069"
#: Characters no name may hold.
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f" + _BIDI + "]")
#: Characters no text may hold: the same less newline and tab.
CONTROL_IN_TEXT = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f" + _BIDI + "]")


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def escape(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character written as an escape.

    ``keep_newlines`` keeps newlines and tabs (multi-line messages)."""
    return (CONTROL_IN_TEXT if keep_newlines else CONTROL).sub(_escaped, text)
