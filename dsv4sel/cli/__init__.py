"""The ``dsv4sel`` command: explain, check, test, table, doctor, diff, schema, completion.

Each subcommand lives in its own module with ``add_parser(subparsers)`` and
``run(args) -> int``. Exit codes: 0 success, 1 a finding or a rejection,
2 unusable input (bad arguments, bad rule files), 3 an internal error. No
traceback reaches the user: expected errors print one message; anything else
is reported as a bug in one line (``DSV4SEL_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import argparse
import sys

from .. import __version__
from ..errors import RuleError, SelectionError
from . import check, completion, diff, doctor, explain, schema, table, test

COMMANDS = (explain, check, test, table, doctor, diff, schema, completion)
EXIT_OK, EXIT_FINDINGS, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3
DEBUG_ENV = "DSV4SEL_DEBUG"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dsv4sel",
        description="Pick the DeepSeek-V4 sparse-MLA attention backend and KV-cache format from rule files.",
    )
    parser.add_argument("--version", action="version", version=f"dsv4sel {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module in COMMANDS:
        module.add_parser(sub)
    from .examples import attach

    attach(parser, sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except RuleError as exc:
        print(f"dsv4sel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except SelectionError as exc:  # an invalid query outside `explain`'s own handling
        print(f"dsv4sel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ImportError as exc:  # a missing dependency of the compiler, named with its fix
        print(f"dsv4sel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:  # `dsv4sel table | head`
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a bug: one line for the user, the traceback on request
        import os

        if os.environ.get(DEBUG_ENV):
            raise
        print(f"dsv4sel: internal error (a bug in dsv4sel, please report it): {type(exc).__name__}: {exc}; "
              f"set {DEBUG_ENV}=1 for the traceback", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
