"""``dsv4sel diff OLD NEW``: every input whose outcome changes between two rule sets."""

from __future__ import annotations

import argparse
import json

from .common import add_allow_option
from .exits import EXIT_FINDINGS, EXIT_OK


def add_parser(sub) -> None:
    p = sub.add_parser(
        "diff", help="list every input whose selection changes between two rule sets",
        description="Compare two rule sets over the union of their decision spaces and list every "
                    "input whose outcome changes, grouped into cubes, with both outcomes. The review "
                    "tool for a pull request that edits rules. Exit 0: no change, 1: changes, "
                    "2: unusable input.")
    p.add_argument("old", metavar="OLD", help="the old rule directory (or file)")
    p.add_argument("new", metavar="NEW", help="the new rule directory (or file)")
    p.add_argument("--pack", action="store_true",
                   help="OLD and NEW are packs: compare default rules + OLD with default rules + NEW "
                        "(OLD may be '-': the default rules alone, to review a new pack)")
    add_allow_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .. import load_rules
    from ..tools.diff import describe_outcome, diff
    from ..engine.sources import default_packs
    from .common import allowed_modules

    allowed = allowed_modules(args)
    base = default_packs() if args.pack else []
    old_paths = [*base] if args.pack and args.old == "-" else [*base, args.old]
    old = load_rules(old_paths, allowed_impl_modules=allowed)
    new = load_rules([*base, args.new], allowed_impl_modules=allowed)
    result = diff(old, new)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
        return EXIT_FINDINGS if result.changes else EXIT_OK
    if not result.changes:
        print(f"no change: {result.compared} inputs decide the same way")
        return EXIT_OK
    print(f"{result.changed} of {result.compared} inputs change, in {len(result.changes)} groups")
    for change in result.changes:
        print()
        print(f"{change.count} input{'s' if change.count != 1 else ''}:")
        for cube in change.cubes:
            print(f"  {cube}")
        print(f"  old: {describe_outcome(change.old)}")
        print(f"  new: {describe_outcome(change.new)}")
    return EXIT_FINDINGS
