"""``dsv4sel doctor``: what this machine is, what the rules pick on it, what can run.

The findings come from :func:`dsv4sel.tools.doctor.build_report`; this module
parses arguments, renders the report (:mod:`dsv4sel.cli.render.doctor`, or
``--json``) and sets the exit status: 0 when the ``auto`` selection's impl
can run, 1 when it cannot (platform not detected, ``auto`` rejected, impl
unavailable), 2 for bad arguments or rule files. Unlike ``explain``, doctor imports torch.
"""

from __future__ import annotations

import argparse
import sys

from .._version import DOCS_URL
from .common import add_rules_option
from .exits import EXIT_FINDINGS, EXIT_OK
from .options import add_input_option

PROG = "dsv4sel doctor"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor", help="show this machine, the backend the rules choose on it and which kernels can run",
        description="Report this machine (platform, capability, torch), the selection the rules make on "
                    "it for each kv-cache dtype, and whether each impl's kernel library is importable. "
                    "--platform/--capability ask about another machine. Exit 0 when the auto selection "
                    "can run, 1 when it cannot, 2 for bad arguments or rule files.")
    p.add_argument("--platform", metavar="P", help="ask about this platform instead of detecting it")
    p.add_argument("--capability", metavar="C", help="the capability or GPU name (with --platform, or to "
                                                     "override the detected one; a GPU name such as MI300X "
                                                     "alone names its platform)")
    p.add_argument("--model", metavar="M", help="model family (default: the rules' default model)")
    add_input_option(p)
    add_rules_option(p)
    p.add_argument("--json", action="store_true", help=f"print one JSON object (keys: {DOCS_URL}/cli.md)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..tools.doctor import UnknownPlatform, build_report
    from .common import error, load
    from .options import parse_inputs

    try:
        inputs = parse_inputs(args.input)
    except ValueError as exc:
        return error(PROG, str(exc))
    rules = load(args)
    try:
        report = build_report(rules, args.platform, args.capability, args.model, inputs)
    except UnknownPlatform as exc:
        return error(PROG, str(exc))
    if args.json:
        from .render.data import document

        sys.stdout.write(document(report.as_dict()))
    else:
        from .render.doctor import report_text
        from .render.text import output_width, style_for

        # its tables stay one row per line in a pipe: wrapped on a terminal only
        sys.stdout.write(report_text(report, style_for(sys.stdout), output_width(sys.stdout)))
    return EXIT_OK if report.ok else EXIT_FINDINGS
