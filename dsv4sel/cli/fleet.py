"""``dsv4sel fleet DEPLOYMENT.yaml``: decide every side of a deployment, and prove they exchange KV.

Reads a deployment file (:mod:`dsv4sel.tools.deployment`), decides each side with its engine
release's rules, ``--as dsv4sel`` (default: what dsv4sel makes the engines do, the shipped rules
and any ``--rules`` packs) or ``--as engine`` (what the engines do today: each release's compat
rule set), compares the sides' KV wire contracts and, when they differ, names each differing
field with each side's value and the deciding rule and proposes the nearest settings that make
them agree (:func:`dsv4sel.tools.fleet.decide_fleet`). Text for people
(:mod:`dsv4sel.cli.render.fleet`) or ``--json``. Exit 0 compatible, 1 not (a difference, or a side
its rules refuse), 2 unusable input: a deployment file that does not load or names a release,
input or variable its rules do not know (each problem at ``file:line:column`` with its code),
or rule files that do not load.
"""

from __future__ import annotations

import argparse
import sys

from .._version import DOCS_URL
from .common import add_rules_option
from .exits import EXIT_FINDINGS, EXIT_OK

PROG = "dsv4sel fleet"
#: shtab's file completion (its ``shtab.FILE``), spelled here so that parsing never imports shtab
FILE = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}
EXAMPLES = """\
examples:
  dsv4sel fleet deployment.yaml                 # what dsv4sel makes the engines do
  dsv4sel fleet deployment.yaml --as engine     # what vLLM and SGLang do by themselves
  dsv4sel fleet deployment.yaml --json

deployment.yaml:
  model: deepseek_v4_1
  sides:
    prefill: {engine: vllm, version: "0.33.0", platform: cuda, capability: "9.0", disaggregation: prefill}
    decode:  {engine: vllm, version: "0.33.0", platform: cuda, capability: "10.0", disaggregation: decode}
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "fleet", help="decide every side of a deployment (prefill/decode, ranks) and prove they exchange KV",
        description="Decide each side of a DeepSeek-V4 deployment with its engine release's rules and prove the "
                    "sides' KV wire contracts equal, or name every differing field (each side's value, the "
                    "deciding rule) and the nearest settings that make them agree. Exit 0 compatible, 1 not, "
                    "2 unusable input.",
        epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    file = p.add_argument("deployment", metavar="DEPLOYMENT.yaml", help=f"the deployment file ({DOCS_URL}/deployments.md)")
    file.complete = FILE  # type: ignore[attr-defined]  # shtab completes file names here
    p.add_argument("--as", dest="mode", choices=("dsv4sel", "engine"), default="dsv4sel",
                   help="dsv4sel: what dsv4sel makes the engines decide (default); engine: what the engines "
                        "decide by themselves (each release's compat rule set); a side's decided_by wins")
    add_rules_option(p)
    p.add_argument("--json", action="store_true", help=f"print one JSON object (keys: {DOCS_URL}/deployments.md)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..tools.deployment import DeploymentError, load_deployment
    from ..tools.fleet import decide_fleet
    from .common import error, load

    try:
        deployment = load_deployment(args.deployment)
        rules = load(args)  # a RuleError reaches cli.main: exit 2 with file:line:column
        report = decide_fleet(deployment, rules, args.mode)
    except DeploymentError as exc:
        return error(PROG, _problems_text(exc.problems), exc.problems, "input")
    if args.json:
        from .render.data import document

        sys.stdout.write(document(report.as_dict()))
    else:
        from .render.fleet import report_lines
        from .render.text import output_width, style_for, wrap_lines

        text = report_lines(report, style_for(sys.stdout))
        sys.stdout.write("\n".join(wrap_lines(text, output_width(sys.stdout))) + "\n")
    return EXIT_OK if report.compatible else EXIT_FINDINGS


def _problems_text(problems) -> str:
    """The problems of a deployment that cannot be decided, one per line, each with its code."""
    codes = ", ".join(dict.fromkeys(p.code for p in problems))
    head = f"{len(problems)} problem{'s' if len(problems) != 1 else ''} in the deployment ({codes}):"
    return "\n".join([head, *(f"  {p}" for p in problems)])
