"""``dsv4sel upgrade HOST FROM TO``: what changes for DeepSeek-V4 when a user upgrades a host.

The releases are the host registry's (:data:`dsv4sel.dsv4.host_registry.HOSTS`); each
names its compat rule set (what that release itself decides), found under the shipped rules'
directory, or under ``--rules-dir``. The comparison is
:func:`dsv4sel.tools.upgrade.upgrade`'s; the text and the JSON are
:mod:`dsv4sel.cli.render.upgrade`'s. Exit 0 when nothing changes, 1 when something does, 2 for
an unknown host or release, a compat set that is not there, or one that does not load.
"""

from __future__ import annotations

import argparse
import sys

from .._version import DOCS_URL
from .exits import EXIT_FINDINGS, EXIT_OK

PROG = "dsv4sel upgrade"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "upgrade", help="what changes for DeepSeek-V4 when a host is upgraded from one release to another",
        description="Compare what two releases of a serving engine decide for DeepSeek-V4 (their compat rule "
                    "sets, named by dsv4sel's host registry) at every input, and sort each change into what a "
                    "user reads: inputs that decide now, --attention-backend names newly accepted or refused, "
                    "default backends, classes, cache formats, block sizes, decisions that became refusals and "
                    "the reverse. Exit 0: no change, 1: changes, 2: unusable input.")
    p.add_argument("host", metavar="HOST", help="the serving engine, as the registry names it (vllm, sglang)")
    p.add_argument("old", metavar="FROM", help="the release upgraded from (0.33 or 0.33.0)")
    p.add_argument("new", metavar="TO", help="the release upgraded to (0.34 or 0.34.0)")
    p.add_argument("--rules-dir", metavar="DIR", default=None,
                   help="find the compat rule sets under DIR (DIR/compat/vllm-0.33 ...) instead of the shipped "
                        "rules' directory")
    p.add_argument("--json", action="store_true", help=f"print one JSON object with every change (keys: {DOCS_URL}/cli.md)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from .. import load_rules
    from ..tools.releases import UnknownRelease, compat_dir, find_release
    from ..tools.upgrade import upgrade
    from .common import error
    from .render import upgrade as render

    try:
        host, old = find_release(args.host, args.old)
        _, new = find_release(args.host, args.new)
        paths = compat_dir(host, old, args.rules_dir), compat_dir(host, new, args.rules_dir)
    except UnknownRelease as exc:
        return error(PROG, str(exc), kind="input")
    shown = (_shown(paths[0], old.compat, args.rules_dir), _shown(paths[1], new.compat, args.rules_dir))
    result = upgrade(host, old, new, load_rules([paths[0]]), load_rules([paths[1]]), shown)
    if args.json:
        from .render.data import document

        sys.stdout.write(document(render.as_dict(result)))
    else:
        sys.stdout.write(render.text(result))
    return EXIT_FINDINGS if result.changed else EXIT_OK


def _shown(path: str, compat: str, rules_dir: str | None) -> str:
    """A compat set's directory as the report names it: ``rules/compat/vllm-0.33`` for the
    shipped rules (openable from here, as every command names a shipped file), else the path."""
    if rules_dir is not None:
        return path
    from ..engine.sources import shown

    return shown("rules/" + compat)
