"""Options shared by several commands beyond ``--rules``: pack-declared inputs, output formats."""

from __future__ import annotations

import argparse

#: The values of ``--format`` for ``check`` and ``test`` (rendered by :mod:`dsv4sel.cli.render`).
FORMATS = ("text", "json", "github", "sarif")


def add_input_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--input", action="append", metavar="NAME=VALUE", default=None,
                        help="set an input that rule packs declare, e.g. mega_attn=available (repeatable)")


def parse_inputs(items: list[str] | None) -> dict[str, str]:
    """``["a=b", ...]`` -> ``{"a": "b"}``. Raises ValueError naming the bad item;
    names and values are checked against the rules' vocabulary later."""
    out: dict[str, str] = {}
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name.strip() or not value.strip():
            raise ValueError(f"--input expects NAME=VALUE, got {item!r}")
        out[name.strip()] = value.strip()
    return out


def add_format_option(parser, default: str = "text") -> None:
    parser.add_argument("--format", choices=FORMATS, default=default,
                        # the annotation is quoted: argparse may wrap the help before it, and the CLI's
                        # stdout writes a line that starts with a colon as \x3a (cli/streams.py), so that
                        # no text can forge a workflow command; a quote keeps the colons as typed
                        help="text (default), json, github (workflow annotations, '::error file=...' lines) "
                             "or sarif (SARIF 2.1.0 for code scanning)")
    parser.add_argument("--json", action="store_const", const="json", dest="format",
                        help="the same as --format json")
