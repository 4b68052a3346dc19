"""Helpers shared by the subcommands: which rules a command works on, and usage errors.

``--rules PATH`` adds a rule pack (a directory or file) on top of the default
rule set (shipped rules, installed packs, ``DSV4SEL_RULES_PATH``);
``--only-rules`` makes the given paths the whole rule set. Impl classes of a
directory pack must be allowed explicitly with ``--allow-impl-module``.
:func:`error` reports unusable input the argparse way (exit 2).
"""

from __future__ import annotations

import argparse
import sys

from .exits import EXIT_USAGE


def add_rules_option(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("rules")
    group.add_argument("--rules", action="append", metavar="PATH", default=None,
                       help="add a rule pack (directory or file) on top of the default rules (repeatable)")
    group.add_argument("--only-rules", action="store_true",
                       help="use only the --rules paths, not the shipped rules and installed packs")
    add_allow_option(group)


def add_allow_option(parser) -> None:
    parser.add_argument("--allow-impl-module", action="append", metavar="MODULE", default=None, type=_module_name,
                        help="also allow impl classes from MODULE (for a directory pack's own code)")


def _module_name(text: str) -> str:
    """An ``--allow-impl-module`` value, held to the test every way in shares (a usage error otherwise)."""
    from ..engine.values import allowed_module_problem

    problem = allowed_module_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def rule_paths(args: argparse.Namespace) -> list | None:
    """The ``paths`` argument for :func:`dsv4sel.load_rules` (None: the default set)."""
    from ..engine.sources import default_packs

    if not getattr(args, "rules", None):
        return None
    if getattr(args, "only_rules", False):
        return list(args.rules)
    return [*default_packs(), *args.rules]


def allowed_modules(args: argparse.Namespace) -> tuple[str, ...] | None:
    from ..dsv4.profile import DEFAULT_ALLOWED_IMPL_MODULES

    extra = getattr(args, "allow_impl_module", None)
    return (*DEFAULT_ALLOWED_IMPL_MODULES, *extra) if extra else None


def load(args: argparse.Namespace):
    """The RuleSet the options name (the default rule set when none)."""
    from .. import default_rules, load_rules

    if getattr(args, "only_rules", False) and not getattr(args, "rules", None):
        # as `check` does: --only-rules alone names no rule set at all (exit 2, not the defaults)
        from ..errors import Problem, RuleError

        raise RuleError([Problem("<rules>", 1, 1, "--only-rules needs at least one --rules PATH", code="DSV306")])
    paths, allowed = rule_paths(args), allowed_modules(args)
    if paths is None and allowed is None:
        return default_rules()
    return load_rules(paths, allowed_impl_modules=allowed)


#: Set by :func:`dsv4sel.cli.main` when the command line asks for JSON (``--json``,
#: ``--format json``): an error then also prints a JSON document on stdout (:func:`error`).
JSON_ERRORS = False


def wants_json(argv: list[str]) -> bool:
    """Whether ``argv`` asks for JSON output, read before (or without) parsing it, so that
    even a usage error can answer in JSON."""
    for i, word in enumerate(argv):
        if word == "--json" or word == "--format=json" or (word == "--format" and argv[i + 1:i + 2] == ["json"]):
            return True
    return False


def error(prog: str, message: str, problems=(), kind: str = "usage") -> int:
    """Print a usage/input error the argparse way and return exit status 2
    (wrapped to the terminal's width when stderr is one). Under ``--json`` stdout
    gets the error as a JSON document too (:func:`error_document`)."""
    from ..engine.text import escape
    from .render.text import output_width, wrap_line

    # argparse quotes the command line (an unknown option, a bad value): never raw control characters
    message = escape(message, keep_newlines=True)
    text = f"{prog}: error: {message}"
    print("\n".join(wrap_line(text, output_width(sys.stderr))), file=sys.stderr)
    if JSON_ERRORS:
        from .render.data import document

        sys.stdout.write(document(error_document(prog, message, problems, kind)))
    return EXIT_USAGE


def _openable(display: str) -> str:
    from ..engine.locations import not_a_file
    from ..engine.sources import openable

    return display if not_a_file(display) else openable(display)


def error_document(prog: str, message: str, problems=(), kind: str = "usage") -> dict:
    """The JSON document of an exit-2 error: ``version``, ``ok`` (false), ``error`` with
    ``kind`` (``usage``: the command line; ``rules``: rule files that do not load;
    ``query``: a value the vocabulary does not declare; ``input``: another unusable input),
    ``command``, ``message`` and, for rule files, ``problems`` (``code``, ``file``, ``line``,
    ``column``, ``location``, ``message``)."""
    return {"version": 1, "ok": False, "error": {
        "kind": kind, "command": prog, "message": message,
        "problems": [{"code": p.code, "file": p.file, "path": _openable(p.file), "line": p.line, "column": p.column,
                      "location": f"{p.file}:{p.line}:{p.column}", "message": p.message} for p in problems]}}
