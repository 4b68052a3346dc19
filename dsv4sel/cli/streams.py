"""The CLI's standard streams, made safe for untrusted text and hostile sinks.

:func:`safe_streams` wraps ``sys.stdout`` and ``sys.stderr`` for one command:

- control characters are written as ``\\xNN`` escapes (see
  :mod:`dsv4sel.engine.text`), except the colour sequences ``Style`` writes, and
  those only on a terminal that gets colour: text from a rule file, a file
  name or a query can never clear the screen or forge coloured output;
- characters the stream's encoding lacks become backslash escapes instead of
  a UnicodeEncodeError (an ASCII-only terminal, ``PYTHONIOENCODING=ascii``);
- a closed stream (``>&-``) becomes a sink that discards;
- a line whose first non-blank character is ``:`` has that colon written as
  ``\x3a``: in a CI log a line starting ``::`` is a GitHub workflow command
  (a forged ``::error``, or ``::stop-commands::`` silencing the rest of the
  step), and rule texts, file names and queries may hold newlines. Only
  :func:`write_workflow_commands` (``--format github``, whose data is
  %-escaped so that it cannot start a line) writes ``::`` lines.

Write failures (``/dev/full``, a closed pipe) surface as OSError from the
command; :func:`silence_stdout` then points file descriptor 1 at
``os.devnull`` so that the interpreter's final flush cannot fail again.
"""

from __future__ import annotations

import io
import os
import re
import sys
from contextlib import contextmanager

from ..engine.text import control_character, escape
from .render.text import colour_wanted

_SGR = re.compile(r"\x1b\[[0-9;]*m")


class SafeWriter:
    """A text stream that escapes control characters before writing them."""

    def __init__(self, stream, allow_colour: bool):
        self._stream = stream
        self._allow_colour = allow_colour
        self.encoding = getattr(stream, "encoding", "utf-8")
        self._line_start = True
        #: set only by :func:`write_workflow_commands`
        self.workflow_commands = False

    def _neutralised(self, text: str) -> str:
        """``text`` with the first colon of every line that starts (after
        blanks) with one escaped; a line may span several writes."""
        pieces = text.split("\n")
        for i, piece in enumerate(pieces):
            if self._line_start or i:
                stripped = piece.lstrip(" \t")
                if stripped.startswith(":"):
                    piece = pieces[i] = piece[:len(piece) - len(stripped)] + "\\x3a" + stripped[1:]
                self._line_start = not piece.strip(" \t")
            elif piece:
                self._line_start = False
        if len(pieces) > 1:
            self._line_start = not pieces[-1].strip(" \t")
        return "\n".join(pieces)

    def write(self, text: str) -> int:
        if not self.workflow_commands and (":" in text or "\n" in text):
            text = self._neutralised(text)
        if control_character(text, in_text=True):
            if self._allow_colour:
                parts = _SGR.split(text)
                codes = _SGR.findall(text)
                text = "".join(escape(p, keep_newlines=True) + (codes[i] if i < len(codes) else "")
                               for i, p in enumerate(parts))
            else:
                text = escape(text, keep_newlines=True)
        self._stream.write(text)
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()


def _reencoded(stream):
    """``stream`` with unencodable characters written as backslash escapes."""
    buffer = getattr(stream, "buffer", None)
    if buffer is None:
        return stream
    try:
        stream.flush()
    except (OSError, ValueError):
        pass
    return io.TextIOWrapper(buffer, encoding=stream.encoding or "utf-8", errors="backslashreplace",
                            line_buffering=getattr(stream, "line_buffering", False), write_through=False)


@contextmanager
def safe_streams():
    """Replace ``sys.stdout``/``sys.stderr`` with :class:`SafeWriter` for the block."""
    saved = sys.stdout, sys.stderr
    wrapped, created = [], []
    for stream in saved:
        if stream is None:  # the descriptor was closed before Python started
            sink = open(os.devnull, "w", encoding="utf-8")
            created.append((sink, False))
            wrapped.append(SafeWriter(sink, False))
            continue
        inner = _reencoded(stream)
        if inner is not stream:
            created.append((inner, True))
        wrapped.append(SafeWriter(inner, colour_wanted(stream)))
    sys.stdout, sys.stderr = wrapped
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for inner, borrowed in created:
            try:
                inner.flush()
            except (OSError, ValueError):
                pass
            if borrowed:
                try:  # the buffer belongs to the original stream: hand it back unclosed
                    inner.detach()
                except (OSError, ValueError):
                    pass
            else:
                inner.close()


def write_workflow_commands(text: str) -> None:
    """Write GitHub workflow commands (``::error file=...::...``) to stdout:
    the one writer allowed to start a line with ``::``. ``text`` must come from
    :func:`dsv4sel.cli.render.diagnostics.github`, which %-escapes every
    newline and carriage return of its data."""
    stream = sys.stdout
    if not isinstance(stream, SafeWriter):  # a caller's own stream
        stream.write(text)
        return
    allowed = stream.workflow_commands
    stream.workflow_commands = True
    try:
        stream.write(text)
    finally:
        stream.workflow_commands = allowed


def silence_stdout() -> None:
    """Point descriptor 1 at os.devnull after a failed write, so nothing tries
    to write there again (the interpreter flushes sys.stdout at exit)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
    except OSError:
        pass
    sys.stdout = open(os.devnull, "w", encoding="utf-8")
