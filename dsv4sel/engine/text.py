"""Untrusted text made safe to show on a terminal.

Rule files, file names and query values are written by other people; a
control character in them could clear the screen, move the cursor or paint
forged "selected" text when dsv4sel prints it. The loader refuses such
characters in rule files, and every human-readable output passes through
:func:`escape`, which writes them as ``\\xNN`` / ``\\uNNNN`` escapes.
"""

from __future__ import annotations

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


def read_bounded(path: str, limit: int, noun: str = "a file", kinds: str = "") -> bytes:
    """The bytes of the regular file at ``path``, of at most ``limit`` bytes.

    The one guarded reader of files a command is named: a FIFO is opened
    without waiting for a writer and, like a device (``/dev/zero``) or a
    directory, refused without reading; a file larger than ``limit`` is
    refused before it is read. Raises OSError, or ValueError with a message
    fit for a Problem: ``noun`` names the file ("a rule file"), ``kinds``
    says what it must be (default: "NOUN is a regular file")."""
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ValueError(f"{kind}; {kinds or noun + ' is a regular file'}")
        if info.st_size > limit:
            raise ValueError(f"{info.st_size} bytes; {noun} may have at most {limit}")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while being read
        raise ValueError(f"more than {limit} bytes; {noun} may have at most that")
    return data
