"""``dsv4sel test PATH...``: run the expected decisions of ``kind: tests`` files.

Every case's query goes through :func:`dsv4sel.select` on the rule set the
rule options name; each unmet expectation prints as
``file:line:col: case NAME: expected ..., got ...``. Then rule coverage: the
rules no case reached, with ``file:line`` (the rules of the ``--rules`` packs
when some are given, else every rule). Exit 0 all passed, 1 a case failed,
2 unusable input (a missing path, a test file that does not match the
schema, broken rule files). The report is :func:`dsv4sel.tools.testcases.run_tests`'s,
rendered by :mod:`dsv4sel.cli.render.test`.
"""

from __future__ import annotations

import argparse
import os
import sys

from .common import add_rules_option
from .exits import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from .options import add_format_option

PROG = "dsv4sel test"
EXAMPLES = """\
examples:
  dsv4sel test tests/decisions
  dsv4sel test examples/b12x-pack/tests --rules examples/b12x-pack/dsv4sel_b12x/rules --allow-impl-module dsv4sel_b12x
  dsv4sel test tests/decisions --format github       # annotations in a GitHub workflow
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "test", help="check expected decisions written as `kind: tests` files",
        description="Run each case of the test files (a select() query and the expected selection fields, "
                    "or reject: true) against the rule set, print every failure as file:line:col, and report "
                    "the rules no case reached. Exit 0 all pass, 1 a failure, 2 unusable input.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="test files, or directories searched for YAML files with `kind: tests`")
    add_rules_option(p)
    add_format_option(p)
    p.set_defaults(run=run)


def _scope(args) -> tuple[set[str] | None, str]:
    """The rule files whose coverage is reported: those of the --rules packs
    (each once, as load_rules loads them), else every rule."""
    if not args.rules:
        return None, "all rules"
    from ..engine.sources import default_packs, directory_pack, unique_packs

    named = {os.path.realpath(p) for p in args.rules}
    base = [] if args.only_rules else default_packs()
    packs = unique_packs([*base, *(directory_pack(p) for p in args.rules)])
    chosen = [p for p in packs if os.path.realpath(p.path) in named]
    files = {s.display for p in chosen for s in p.sources()}
    return files, "the rules of " + ", ".join(p.name for p in chosen)


def run(args: argparse.Namespace) -> int:
    from ..tools.testcases import TestFileError, load_cases, run_tests
    from .common import error, load

    if args.only_rules and not args.rules:
        return error(PROG, "--only-rules needs at least one --rules PATH")
    try:
        cases, files = load_cases(args.paths)
    except TestFileError as exc:
        if args.format in ("github", "sarif"):
            from .render.test import problems

            _emit(args.format, problems(exc.problems))
        for p in exc.problems:
            error(PROG, f"{p} [{p.code}]")
        return EXIT_USAGE
    rules = load(args)  # a RuleError reaches cli.main: exit 2 with every problem located
    scope, label = _scope(args)
    report = run_tests(rules, cases, files=files, scope=scope, scope_label=label)
    if args.format == "json":
        from .render.data import document

        sys.stdout.write(document(report.to_dict()))
    elif args.format in ("github", "sarif"):
        from .render.test import diagnostics

        _emit(args.format, diagnostics(report))
    else:
        from .render.test import text
        from .render.text import wrapped

        sys.stdout.write(wrapped(text(report)))
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _emit(fmt: str, diagnostics) -> None:
    from .render.diagnostics import github, sarif

    from .streams import write_workflow_commands

    if fmt == "github":
        write_workflow_commands(github(diagnostics))
    else:
        sys.stdout.write(sarif(diagnostics))
