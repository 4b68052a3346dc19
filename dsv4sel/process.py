"""How the ``dsv4sel`` command's process ends on Ctrl-C or out of memory, at any moment.

dsv4sel turns whatever an imported module raises into a located error (an impl
module that raises ``KeyboardInterrupt`` at import is a DSV406 finding in
``check``, not the end of the process), so a real Ctrl-C must be told apart
from one a module raised. While :func:`interruptible` is active (the command's
``main()``) SIGINT raises :class:`Interrupted`, which every such guard lets
through; ``main()`` then returns 130 and prints nothing.

The interpreter runs the command's imports before ``main()``. So that they end
as cleanly, :func:`quiet_when_command`, called first by ``import dsv4sel``,
does two things, and only when the process is the ``dsv4sel`` console script
(library users, such as vLLM, get neither): it installs the same SIGINT
handler, and a ``sys.excepthook`` for an exception that ends the process
there: an interrupt prints nothing and exits 130, a MemoryError prints one
line and exits 2, as ``main()`` does for each. It also refuses, in that one line, a process
whose address-space limit leaves too little for any command (:data:`_HEADROOM`), and holds
back the reserve that reporting running out of memory gives up first (:func:`release_reserve`).
A Ctrl-C or an allocation failure
while the interpreter itself starts (its ``site`` module, the environment's
``.pth`` files) comes before any dsv4sel code and is the interpreter's.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

#: The exit statuses of dsv4sel.cli.exits (this module sits below the CLI): an interrupt, and
#: a command that cannot get the memory it needs (unusable input).
_EXIT_INTERRUPTED, _EXIT_OUT_OF_MEMORY = 130, 2


class Interrupted(KeyboardInterrupt):
    """A real SIGINT received by the ``dsv4sel`` command (not a KeyboardInterrupt a module raised)."""


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted()


def _set_handler(handler):
    """Install ``handler`` for SIGINT and return the previous one; None where signals cannot
    be set (a thread other than the main one)."""
    import signal  # the command's alone: a library's `import dsv4sel` never sets a handler

    try:
        return signal.signal(signal.SIGINT, handler)
    except ValueError:
        return None


@contextmanager
def interruptible(ending: bool):
    """SIGINT raises :class:`Interrupted` inside the block. Afterwards the previous handler
    is restored or, with ``ending`` (the process ends with this block), SIGINT is ignored:
    the work is done, and an interrupt must not turn the exit into a traceback."""
    import signal

    previous = _set_handler(_raise_interrupted)
    try:
        yield
    finally:
        if ending:
            _set_handler(signal.SIG_IGN)
        elif previous is not None:
            _set_handler(previous)


def _is_command() -> bool:
    """Whether this process is the ``dsv4sel`` console script (``bin/dsv4sel``,
    ``Scripts/dsv4sel-script.py``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or ""
    name = path.replace("\\", "/").rsplit("/", 1)[-1]
    return name in ("dsv4sel", "dsv4sel.exe", "dsv4sel-script.py")


class TooLittleAddressSpace(MemoryError):
    """The command's process is limited to too little address space to start a command at all."""


class _CommandHook:
    """``sys.excepthook`` of the command: an interrupt or a MemoryError that ends the process
    before ``main()`` handles it ends it as ``main()`` would; anything else is handed on."""

    def __init__(self, previous):
        self.previous = previous

    def __call__(self, kind, value, traceback) -> None:
        release_reserve()
        if issubclass(kind, KeyboardInterrupt):
            _exit(_EXIT_INTERRUPTED)
        if issubclass(kind, TooLittleAddressSpace):
            sys.stderr.write(f"dsv4sel: out of memory: {value}; give it more memory\n")
            _exit(_EXIT_OUT_OF_MEMORY)
        if issubclass(kind, MemoryError):
            sys.stderr.write(f"dsv4sel: out of memory while starting{f' ({value})' if str(value) else ''}: "
                             "this process may not allocate what the command needs (a memory limit such as "
                             "ulimit -v, or a container's?); give it more memory\n")
            _exit(_EXIT_OUT_OF_MEMORY)
        self.previous(kind, value, traceback)


def _exit(status: int) -> None:
    """End the process now with ``status``: the interpreter would end an uncaught exception with
    status 1 (an :class:`Interrupted` is not the exact KeyboardInterrupt it ends by SIGINT), and
    nothing of the command ran yet that needs finalizing."""
    import os

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(status)


#: The address space a command needs beyond what the interpreter has mapped when ``import
#: dsv4sel`` starts (the interpreter, ``site`` and the package face). With less, CPython itself
#: fails in ways no program can catch or tell from a bug: a fatal error while it normalizes a
#: MemoryError (the process aborts), the dynamic loader unable to map a library, an import that
#: returns NULL without an exception. So the command refuses at once, in one line, instead.
#: Chosen above the caps where those failures came (``check`` on a cold cache under address-space
#: caps, RLIMIT_AS: tests/cli/test_interrupt_and_memory.py sweeps them).
_HEADROOM = 12 << 20


def _too_little_address_space() -> str | None:
    """Why this process cannot run a command (its address-space limit leaves less than
    :data:`_HEADROOM` beyond what it has mapped), or None: no limit, or one it cannot read."""
    try:
        import resource
    except ImportError:  # not POSIX (no such module), or a loader that cannot map it: the command finds out
        return None
    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm", "rb") as statm:  # Linux: the first field is the mapped size, in pages
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None
    if soft - mapped >= _HEADROOM:
        return None
    return (f"this process's address space is limited to {soft >> 20} MiB (ulimit -v), "
            f"{mapped >> 20} MiB of it taken before the command starts, and a command needs "
            f"{_HEADROOM >> 20} MiB more")


#: Address space the command holds back from its start and gives up to report running out of
#: memory: by then the allocator may have no room left even for the one line that says so.
_RESERVE_BYTES = 1 << 20
_reserve: list[bytearray] = []


def release_reserve() -> None:
    """Give the command's reserve back to the system (see :data:`_RESERVE_BYTES`): called first
    by whatever reports running out of memory. Nothing where none is held (a library's process)."""
    _reserve.clear()


def quiet_when_command() -> None:
    """In the ``dsv4sel`` command only: SIGINT raises :class:`Interrupted` from now on, an
    interrupt or a MemoryError that ends the process prints no traceback (see the module
    docstring), and a process whose address-space limit leaves too little for any command
    ends at once with the out-of-memory line and exit 2."""
    if not _is_command() or isinstance(sys.excepthook, _CommandHook):
        return
    _set_handler(_raise_interrupted)
    sys.excepthook = _CommandHook(sys.excepthook)
    short = _too_little_address_space()
    if short is not None:
        raise TooLittleAddressSpace(short)  # the hook above ends the process with its one line
    _reserve.append(bytearray(_RESERVE_BYTES))  # above the allocator's mmap threshold: freed, it is unmapped
