"""``dsv4sel check``: load, validate and compile the rules; report problems and coverage."""

from __future__ import annotations

import argparse
import sys

from .common import add_rules_option


def add_parser(sub) -> None:
    p = sub.add_parser("check", help="prove the rules decide every input exactly once",
                       description="Load, validate and compile the rule files and verify them over "
                                   "the whole decision space. Exit 0 clean, 1 findings, 2 unusable input.")
    add_rules_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..build import build_program
    from ..errors import RuleError
    from .. import DEFAULT_ALLOWED_IMPL_MODULES, sources

    srcs = ([s for path in args.rules for s in sources.expand(path)] if args.rules
            else sources.shipped_sources())
    try:
        program = build_program(srcs, DEFAULT_ALLOWED_IMPL_MODULES)
    except RuleError as exc:
        for problem in exc.problems:
            print(problem)
        print(f"{len(exc.problems)} problem(s)", file=sys.stderr)
        return 1
    table = program.to_table()
    counts = {"select": 0, "reject": 0, "gap": 0}
    for index in table["table"].values():
        counts[table["outcomes"][index][0]] += 1
    total = sum(counts.values())
    print(f"{len(srcs)} files, {len(program.rules)} rules, {total} inputs: "
          f"{counts['select']} select, {counts['reject']} reject, {counts['gap']} undecided")
    return 1 if counts["gap"] else 0
