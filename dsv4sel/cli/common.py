"""Helpers shared by the subcommands: loading rules from --rules options."""

from __future__ import annotations

import argparse


def add_rules_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rules", action="append", metavar="PATH", default=None,
                        help="rule file or directory to use instead of the shipped rules (repeatable)")


def load(args: argparse.Namespace):
    """The RuleSet named by ``--rules`` (the shipped rules when absent)."""
    from .. import default_rules, load_rules

    return load_rules(args.rules) if args.rules else default_rules()
