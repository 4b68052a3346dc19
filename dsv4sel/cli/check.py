"""``dsv4sel check``: verify the rules over the whole decision space.

Prints every finding (``file:line[:column]: severity [kind] message``, then
the rules involved and one concrete input), the coverage figures (inputs
that select, reject or are undecided; per requested backend and per rule)
and a summary line (:mod:`dsv4sel.cli.render.check` renders the verifier's
report); ``--summary`` prints the findings and one line. ``--json`` prints :meth:`dsv4sel.check.findings.Report.to_dict`
instead. ``--rules`` adds packs on top of the default rule set and
``--only-rules`` checks them alone, as for the other subcommands. Exit
status: 0 clean, 1 findings, 2 unusable input (a path that does not exist,
a directory without rule files, bad arguments), 3 an internal error (a bug
in dsv4sel). Never a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys

from .common import add_rules_option, allowed_modules, rule_paths
from .exits import EXIT_FINDINGS, EXIT_OK, EXIT_USAGE
from .options import add_format_option

EXAMPLES = """\
examples:
  dsv4sel check                                      # the shipped rules and installed packs
  dsv4sel check --summary                            # one line when clean: no coverage tables
  dsv4sel check my-pack/rules --allow-impl-module my_pack
  dsv4sel check --only-rules --rules my-rules/       # a complete rule set of its own
  dsv4sel check --format github                      # ::error annotations in a GitHub workflow
  dsv4sel check --format sarif > dsv4sel.sarif       # for code scanning
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "check", help="prove the rules decide every input exactly once",
        description="Load, validate and compile the rule files, then verify them over the whole decision "
                    "space: gaps, overlaps, shadowed, dead and redundant rules, dangling references, impl "
                    "classes, layouts, rewrite fixpoints. Every finding has a stable code (DSV401...). "
                    "Exit 0 clean, 1 findings, 2 unusable input.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", metavar="PATH",
                   help="rule files or directories to check on top of the default rules (as --rules; a file "
                        "stands for its directory's pack, so pre-commit can pass changed file names; "
                        "`kind: tests` files are skipped)")
    # the same rule options as the other subcommands, so that `check` proves
    # exactly the rule set `explain --rules ...` uses
    add_rules_option(p)
    add_format_option(p)
    p.add_argument("--summary", action="store_true",
                   help="text format: the findings and one summary line, without the coverage tables "
                        "(one line when the rules are clean)")
    p.set_defaults(run=run)


def _positional_packs(paths: list[str]) -> list[str]:
    """The pack directories the positional PATHs stand for: a directory as
    given, a rule file as its directory (a pack is a directory; its other
    files belong to the decision), test files skipped. A missing path is kept
    so that verification reports it."""
    from ..tools.testcases import _looks_like_tests

    out = []
    for path in paths:
        if os.path.isfile(path):
            if _looks_like_tests(path):
                continue
            path = os.path.dirname(path) or "."
        out.append(path)
    return list(dict.fromkeys(out))


def run(args: argparse.Namespace) -> int:
    if args.only_rules and not (args.rules or args.paths):
        print("dsv4sel check: --only-rules needs at least one --rules PATH", file=sys.stderr)
        return EXIT_USAGE
    from ..check.findings import VerifyError
    from ..engine.sources import default_packs
    from ..api import verify

    paths = rule_paths(args)
    if args.paths:
        named = _positional_packs(args.paths)  # empty when only test files were named
        base = paths if paths is not None else ([] if args.only_rules else default_packs())
        paths = [*base, *named] if (named or paths is not None) else None
    try:
        report = verify(paths, allowed_impl_modules=allowed_modules(args))
    except VerifyError as exc:
        print(f"dsv4sel check: {exc}", file=sys.stderr)
        return EXIT_USAGE
    _write(args, report)
    # one rule for every command: rule files that do not load are unusable input (2), even
    # here, where they are listed as findings; 1 is for findings of the analysed space
    if not report.analysed:
        return EXIT_USAGE
    return EXIT_OK if report.ok else EXIT_FINDINGS


def _write(args: argparse.Namespace, report) -> None:
    """The report on stdout, in the format asked for."""
    if args.format == "json":
        from .render.data import document

        sys.stdout.write(document(report.to_dict()))
    elif args.format in ("github", "sarif"):
        from .render.check import diagnostics
        from .render.diagnostics import github, sarif

        found = diagnostics(report)
        from .streams import write_workflow_commands

        if args.format == "github":
            write_workflow_commands(github(found))
        else:
            sys.stdout.write(sarif(found))
    else:
        from .render.check import summary, text
        from .render.text import wrapped

        sys.stdout.write(wrapped(summary(report) if args.summary else text(report)))
