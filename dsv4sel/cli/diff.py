"""``dsv4sel diff OLD NEW``: every input whose outcome changes between two rule sets.

The changes are :func:`dsv4sel.tools.diff.diff`'s; this module loads both
rule sets, renders the :class:`~dsv4sel.tools.diff.Diff` (text or ``--json``,
:mod:`dsv4sel.cli.render.diff`) and exits 1 when something changes.
"""

from __future__ import annotations

import argparse
import sys

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
    from ..engine.sources import default_packs
    from ..tools.diff import diff
    from .common import allowed_modules
    from .render import diff as render

    allowed = allowed_modules(args)
    base = default_packs() if args.pack else []
    old_paths = [*base] if args.pack and args.old == "-" else [*base, args.old]
    old = load_rules(old_paths, allowed_impl_modules=allowed)
    new = load_rules([*base, args.new], allowed_impl_modules=allowed)
    result = diff(old, new)
    if args.json:
        from .render.data import document

        sys.stdout.write(document(render.as_dict(result)))
    else:
        sys.stdout.write(render.text(result))
    return EXIT_FINDINGS if result.changes else EXIT_OK
