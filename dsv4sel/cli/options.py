"""Options shared by explain and doctor beyond ``--rules``: pack-declared inputs."""

from __future__ import annotations

import argparse


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
