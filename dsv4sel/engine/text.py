"""Untrusted text made safe to show on a terminal.

Rule files, file names and query values are written by other people; a
control character in them could clear the screen, move the cursor or paint
forged "selected" text when dsv4sel prints it. The loader refuses such
characters in rule files, and every human-readable output passes through
:func:`escape`, which writes them as ``\\xNN`` / ``\\uNNNN`` escapes.
"""

from __future__ import annotations

# The one escaping of untrusted text lives with the exceptions that carry such text (the
# foundation layer, so that they can apply it themselves); re-exported here for the engine.
from ..errors import control_character, escape  # noqa: F401


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
