"""``dsv4sel table``: the support matrix generated from the rules, and its CI check.

``dsv4sel table --format md > docs/backends.md`` writes the committed table;
``dsv4sel table --format md --check docs/backends.md`` exits 1 (with a diff)
when that file differs from what the rules generate now, so the published
matrix can never drift from the rules. Exit 2 for unusable rule files or an
unreadable FILE.
"""

from __future__ import annotations

import argparse
import sys

from .common import add_rules_option
from .exits import EXIT_FINDINGS, EXIT_OK

PROG = "dsv4sel table"
_DIFF_LINES = 60  # enough to see what moved; CI logs stay readable
_MAX_CHECKED_BYTES = 16 << 20  # docs/backends.md is ~30 kB; a /dev/zero link must not fill memory


def add_parser(sub) -> None:
    p = sub.add_parser(
        "table", help="print the backend support matrix generated from the rules",
        description="Generate the DeepSeek-V4 backend support matrix from the rules: rows backend x "
                    "capability family, columns kv dtypes accepted, layout, cache and torch dtype, bytes "
                    "per token, block size and when the backend is the default. With --check FILE, exit 1 "
                    "when FILE differs from what would be generated (the CI staleness check).")
    p.add_argument("--format", choices=("md", "json"), default="md", help="output format (default: md)")
    p.add_argument("--check", metavar="FILE",
                   help="compare FILE with the generated table instead of printing it; exit 1 when stale")
    add_rules_option(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..tools.matrix import build_matrix
    from .common import error, load

    matrix = build_matrix(load(args))
    if args.format == "md":
        from .render.table import markdown

        text = markdown(matrix)
    else:
        from .render.data import document

        text = document(matrix.as_dict())
    if args.check is None:
        sys.stdout.write(text)
        return EXIT_OK
    from ..engine.text import escape, read_bounded

    named = escape(args.check)  # the file name, and below its lines, as text that cannot drive a terminal
    regenerate = f"dsv4sel table --format {args.format} > {named}"

    try:  # the guarded reader: a FIFO, a device or a huge file is refused, never waited on or read whole
        current = read_bounded(args.check, _MAX_CHECKED_BYTES, "a generated table").decode("utf-8")
    except FileNotFoundError:
        print(f"{named} does not exist; generate it with `{regenerate}`")
        return EXIT_FINDINGS
    except (OSError, ValueError) as exc:  # UnicodeDecodeError is a ValueError
        return error(PROG, f"cannot read {named}: {escape(str(exc))}")
    if current == text:
        print(f"{named} is up to date with the rules")
        return EXIT_OK
    import difflib

    diff = list(difflib.unified_diff(current.splitlines(), text.splitlines(), f"{named} (committed)",
                                     f"{named} (generated from the rules)", lineterm=""))
    print(f"{named} is stale: it differs from what the rules generate. Regenerate it with "
          f"`{regenerate}` and commit the result.")
    for line in diff[:_DIFF_LINES]:
        print(escape(line))
    if len(diff) > _DIFF_LINES:
        print(f"... {len(diff) - _DIFF_LINES} more diff lines")
    return EXIT_FINDINGS
