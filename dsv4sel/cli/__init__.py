"""The ``dsv4sel`` command: explain, fleet, check, test, table, doctor, diff, upgrade, schema, completion.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and
``run(args) -> int``: it parses, calls one tool (:mod:`dsv4sel.tools`, the
verifier), renders the value it returns with :mod:`dsv4sel.cli.render` and
sets the exit status. A command line that starts with a subcommand imports and
builds that subcommand's parser alone (the cold start of ``dsv4sel explain``). Exit codes: 0 success, 1 a finding or a rejection,
2 unusable input (bad arguments, bad rule files, not enough memory), 3 an internal error, 130 an
interrupt (Ctrl-C, at any moment: :mod:`dsv4sel.process`). No traceback reaches the user:
expected errors print one message; anything else is reported as a bug in one line
(``DSV4SEL_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from .._version import __version__
from ..errors import RuleError, SelectionError
from ..process import interruptible
from .exits import EXIT_FINDINGS, EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE  # noqa: F401  (public here too)
from .streams import silence_stdout

#: The subcommands in ``--help`` order, each a module of this package.
COMMANDS = ("explain", "fleet", "check", "test", "table", "doctor", "diff", "upgrade", "schema", "completion")
#: The subcommands whose command line their own parser reads alone (``completion`` reads the whole parser).
_ALONE = frozenset(COMMANDS) - {"completion"}
DEBUG_ENV = "DSV4SEL_DEBUG"
# errno values of a sink that cannot take the output: ENOSPC, EIO, EPIPE, EBADF, EDQUOT
_WRITE_ERRORS = {28, 5, 32, 9, 122}
_ENOMEM = 12


class Formatter(argparse.HelpFormatter):
    """argparse's help formatter, told the terminal's width (:func:`~dsv4sel.cli.render.text.terminal_columns`,
    as argparse reads it) instead of importing shutil for it: argparse makes one per
    ``add_argument``, so every command would import shutil before parsing its command line."""

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None):
        if width is None:
            from .render.text import terminal_columns

            width = terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


class Parser(argparse.ArgumentParser):
    """argparse's parser, with two changes: an unrecognized option is reported by the
    subcommand's parser (its usage, not the top-level one), with the nearest option of that
    subcommand (``did you mean --platform?``); and every usage error goes through
    :func:`dsv4sel.cli.common.error`, so that ``--json`` gets a JSON document for it too.
    Subcommand parsers are of this class as well (argparse makes them with the parent's)."""

    commands: dict = {}

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def parse_args(self, args=None, namespace=None):
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            target = self.commands.get(getattr(parsed, "command", None), self)
            target.error(unrecognized(target, extras))
        return parsed

    def error(self, message):
        from .common import error

        self.print_usage(sys.stderr)
        error(self.prog, message)
        sys.exit(EXIT_USAGE)


def __getattr__(name: str):
    """A subcommand's module as an attribute (``dsv4sel.cli.diff``), imported on first use."""
    if name in COMMANDS:
        return import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def unrecognized(parser: argparse.ArgumentParser, extras: list[str]) -> str:
    """``unrecognized arguments: ...``, with the nearest option of ``parser`` for each
    unknown one (difflib, through the one suggestion module)."""
    from ..engine.suggest import close_matches
    from ..engine.text import escape

    options = [o for action in parser._actions for o in action.option_strings if o.startswith("--")]
    hints: list[str] = []
    for word in extras:
        if word.startswith("-"):
            near = close_matches(word.partition("=")[0], options)
            if near:
                hints.append(f"did you mean {near[0]}?" if len(extras) == 1 or not hints
                             else f"{escape(word)}: did you mean {near[0]}?")
    return "unrecognized arguments: " + " ".join(map(escape, extras)) + ("; " + "; ".join(hints) if hints else "")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or with ``command`` of that one alone: all that
    parsing a command line starting with it needs."""
    parser = Parser(
        prog="dsv4sel",
        description="Pick the DeepSeek-V4 sparse-MLA attention backend and KV-cache format from rule files.",
    )
    parser.add_argument("--version", action="version", version=f"dsv4sel {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        if command is None or name == command:
            import_module(f"{__name__}.{name}").add_parser(sub)
    from .examples import attach

    attach(parser, sub)
    parser.commands = dict(sub.choices)
    # commands that need the whole parser (completion) get it as data, not by importing this module
    parser.set_defaults(parser=parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the command line ``argv`` (None: this process's, ``sys.argv``, which ends with it)
    and return the exit status. A Ctrl-C at any moment of it is exit 130, nothing printed."""
    with interruptible(ending=argv is None):
        try:
            from .streams import safe_streams

            with safe_streams():
                code = _run(argv)
        except KeyboardInterrupt:
            code = EXIT_INTERRUPTED
    if argv is None:
        # the process ends with this command: the interpreter's final collection would walk
        # every object left (~13M instructions, 3 ms, for explain) to free nothing that needs
        # it (files are closed by their with-blocks, the output was flushed by _finish)
        import gc

        gc.freeze()
    return code


def _run(argv: list[str] | None) -> int:
    """The command's exit status; an interrupt is :func:`main`'s to report. Running short of
    memory, in the command or while reporting one of its errors, is one line (and no other)."""
    try:
        return _reported(argv)
    except MemoryError as exc:
        detail = str(exc)
    # reported here, once the frames holding what was allocated are gone
    return _out_of_memory(argv, detail)


def _reported(argv: list[str] | None) -> int:
    """The command's exit status, each expected error reported as such (a MemoryError is
    :func:`_run`'s to report)."""
    try:
        from . import common

        words = sys.argv[1:] if argv is None else list(argv)
        common.JSON_ERRORS = common.wants_json(words)
        args = build_parser(_alone(words)).parse_args(argv)
        return _finish(args.run(args))
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else EXIT_USAGE)
        return _finish(code)
    except RuleError as exc:  # every command: rule files that do not load exit 2, each problem with its code
        return _unusable(_command(argv), _rule_error_text(exc), exc.problems, "rules")
    except SelectionError as exc:  # an invalid query outside `explain`'s own handling
        return _unusable(_command(argv), str(exc), (), "query")
    except ImportError as exc:  # a missing dependency of the compiler, named with its fix
        return _import_failed(argv, exc)
    except BrokenPipeError:  # `dsv4sel table | head`: the reader has all it wanted
        silence_stdout()
        return EXIT_OK
    except OSError as exc:
        return _os_error(exc)
    except MemoryError:
        raise
    except Exception as exc:  # noqa: BLE001 - a bug: one line for the user, the traceback on request
        return _internal(exc)


def _import_failed(argv: list[str] | None, exc: ImportError) -> int:
    """A module the command needs does not import: unusable input, named with its fix; a
    library the loader could not map is running out of memory (raised for :func:`_run`)."""
    from ..engine.hints import import_ran_out_of_memory

    if import_ran_out_of_memory(exc):
        raise MemoryError(str(exc)) from None
    return _unusable(_command(argv), str(exc), (), "input")


def _os_error(exc: OSError) -> int:
    """The output cannot be written (/dev/full, a vanished disk): one line, exit 2. The system
    refusing memory (``ENOMEM``: a mapping, a buffer) is running out of it (raised for
    :func:`_run`); any other OSError is a bug."""
    if exc.errno == _ENOMEM:
        raise MemoryError(str(exc)) from None
    if exc.errno not in _WRITE_ERRORS:
        return _internal(exc)
    silence_stdout()
    _say(f"dsv4sel: cannot write the output: {exc.strerror or exc}")
    return EXIT_USAGE


def _out_of_memory(argv: list[str] | None, detail: str) -> int:
    """Not enough memory (a limit such as ``ulimit -v`` or a container's): unusable input
    for this process, exit 2, said plainly in one line (a bug is something else)."""
    from ..process import release_reserve

    release_reserve()
    try:  # the detail quotes an exception (a library's path): its control characters escaped
        from ..engine.text import escape

        detail = escape(detail)
    except MemoryError:
        detail = ""
    message = (f"out of memory{f' ({detail})' if detail else ''}: this process may not allocate what the "
               "command needs (a memory limit such as ulimit -v, or a container's?); give it more memory, "
               "or load fewer rule packs")
    try:  # one write of the whole line, unwrapped, never repeated: a failure halfway is not said twice
        sys.stderr.write(f"{_command(argv)}: {message}\n")
        sys.stderr.flush()
    except (OSError, ValueError, MemoryError):
        pass
    try:
        from . import common

        if common.JSON_ERRORS:
            from .render.data import document

            sys.stdout.write(document(common.error_document(_command(argv), message, (), "input")))
    except MemoryError:
        pass
    return EXIT_USAGE


def _alone(words: list[str]) -> str | None:
    """The subcommand whose parser alone reads ``words`` (their first word), or None."""
    return words[0] if words and words[0] in _ALONE else None


def _command(argv: list[str] | None) -> str:
    """``dsv4sel COMMAND`` for messages (the first word that is a command)."""
    words = sys.argv[1:] if argv is None else argv
    return "dsv4sel " + next((w for w in words if w in COMMANDS), "").strip() if words else "dsv4sel"


def _rule_error_text(exc: RuleError) -> str:
    """The problems of rule files that do not load: their codes in the first line, then one
    problem per line, ``file:line:column: message`` (``--json`` gives each one's code)."""
    problems = exc.problems
    if not problems:
        return str(exc)
    from .render.text import location

    codes = ", ".join(dict.fromkeys(p.code for p in problems))
    head = f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in the rule files ({codes}):"
    return "\n".join([head, *(f"  {location(p)}: {p.message}" for p in problems)])


def _unusable(prog: str, message: str, problems, kind: str) -> int:
    """Report unusable input (exit 2): the message on stderr, wrapped to a terminal, and
    under ``--json`` the error document on stdout."""
    from ..engine.text import escape
    from . import common

    message = escape(message, keep_newlines=True)
    sys.stderr.write(_wrapped(f"{prog.strip()}: {message}") + "\n")  # one write: never half a report
    if common.JSON_ERRORS:
        from .render.data import document

        sys.stdout.write(document(common.error_document(prog.strip(), message, problems, kind)))
    return EXIT_USAGE


def _wrapped(text: str) -> str:
    """``text`` wrapped to the terminal's width when stderr is one."""
    from .render.text import output_width, wrap_lines

    return "\n".join(wrap_lines(text.split("\n"), output_width(sys.stderr)))


def _finish(code: int) -> int:
    """Flush stdout inside the error handling, so that a sink that fails only
    on flush (``> /dev/full``) is reported like any failed write."""
    sys.stdout.flush()
    return code


def _internal(exc: BaseException) -> int:
    import os

    if os.environ.get(DEBUG_ENV):
        raise exc
    _say(f"dsv4sel: internal error (a bug in dsv4sel, please report it): {type(exc).__name__}: {exc}; "
         f"set {DEBUG_ENV}=1 for the traceback")
    return EXIT_INTERNAL


def _say(message: str) -> None:
    """One line on stderr, if stderr can take it."""
    try:
        print(message, file=sys.stderr)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
