"""``dsv4sel schema``: where the JSON Schemas of rule and test files are (for editors and CI)."""

from __future__ import annotations

import argparse
import sys

from .exits import EXIT_OK

EXAMPLES = """\
examples:
  dsv4sel schema                  # the path of the rule-file schema
  dsv4sel schema tests --json     # the test-file schema itself
editors (yaml-language-server: VS Code's YAML extension, neovim, helix...), first line of a rule file:
  # yaml-language-server: $schema=<the path dsv4sel schema prints, or a relative path to it>
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "schema", help="print the path of the rule-file (or test-file) JSON Schema, or the schema",
        description="Print the path of the JSON Schema that rule files (or, with `tests`, test files) are "
                    "validated against, for an editor's yaml-language-server modeline or a CI validator. "
                    "--json prints the schema itself.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("which", nargs="?", choices=("rules", "tests"), default="rules",
                   help="rules (default): rule files; tests: `kind: tests` files")
    p.add_argument("--json", action="store_true", help="print the schema instead of its path")
    p.set_defaults(run=run)


def path_of(which: str) -> str:
    from ..dsv4.profile import PROFILE

    if which == "tests":
        from ..tools.testcases import SCHEMA_PATH
    else:
        return PROFILE.schema
    return SCHEMA_PATH


def run(args: argparse.Namespace) -> int:
    path = path_of(args.which)
    if not args.json:
        print(path)
        return EXIT_OK
    with open(path, encoding="utf-8") as fh:
        sys.stdout.write(fh.read())
    return EXIT_OK
