"""``dsv4sel explain``: why this backend and cache format for one query.

Renders a :class:`dsv4sel.tools.explain.Explanation` for people
(:mod:`dsv4sel.cli.render.explain`: aligned, coloured only on a terminal) or,
with ``--json``, as one JSON object (keys documented in docs/cli.md).
``--detect`` fills the query from :func:`dsv4sel.dsv4.platform.machine`, the
machine ``dsv4sel doctor`` reports. Exit 0 when the query selects, 1 when it is rejected, 2 for
bad arguments or rule files. With a warm compiled cache this command imports
neither yaml, jsonschema nor torch (``--detect`` imports torch).
"""

from __future__ import annotations

import argparse
import sys

from .._version import DOCS_URL
from .common import add_rules_option
from .exits import EXIT_FINDINGS, EXIT_OK
from .options import add_input_option

PROG = "dsv4sel explain"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "explain", help="show the selection for one query, the rules that decided it and why not the others",
        description="Explain the DeepSeek-V4 attention backend and KV-cache format the rules pick for one "
                    "query: the outcome, the rules on the way (file:line), the rewrites, why every other "
                    "backend of the platform does not serve it and, on rejection, the nearest working "
                    "alternatives. Exit 0 selected, 1 rejected, 2 bad arguments or rule files.")
    p.add_argument("--platform", metavar="P", help="cuda, rocm, xpu or cpu (the rules' vocabulary); "
                                                   "required unless --detect or a --capability that names "
                                                   "its platform (H100, MI300X, gfx942)")
    p.add_argument("--capability", metavar="C", help="CUDA compute capability such as 9.0, a ROCm gfx "
                                                     "arch such as gfx942, or a GPU name such as H100 or "
                                                     "MI300X (default: unknown)")
    p.add_argument("--backend", "--attention-backend", dest="backend", metavar="B",
                   help="the requested attention backend (default: none, the platform default)")
    p.add_argument("--kv-cache-dtype", default="auto", metavar="D", help="vLLM --kv-cache-dtype (default: auto)")
    p.add_argument("--model", metavar="M", help="model family (default: the rules' default, deepseek_v4)")
    add_input_option(p)
    p.add_argument("--tokens", type=_tokens, metavar="N",
                   help="also give the KV memory N tokens of one sequence need, per kind of layer and for the "
                        f"whole model ({DOCS_URL}/deployments.md states the formula)")
    p.add_argument("--layers", metavar="SPEC",
                   help="the model's layers for --tokens, e.g. swa=2,c4=21,c128=20,window=128 (default: "
                        "DeepSeek-V4-Flash's for deepseek_v4; required for other models)")
    add_rules_option(p)
    p.add_argument("--json", action="store_true", help=f"print one JSON object (keys: {DOCS_URL}/cli.md)")
    p.add_argument("--detect", action="store_true",
                   help="fill --platform, --capability and probed inputs (e.g. mega_attn) from this machine "
                        "through torch and the kernel probes; explicit options win")
    p.set_defaults(run=run)


def _tokens(text: str) -> int:
    """``--tokens``: a positive whole number (argparse reports the ValueError as a usage error)."""
    value = text.replace("_", "")
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive whole number of tokens")
    return int(value)


def _machine(args: argparse.Namespace, rules, inputs: dict) -> tuple | str:
    """``(platform, capability, where the platform came from, inputs)`` for the query: as given,
    detected (``--detect``), or named by a GPU name given as the capability; or the problem."""
    platform, capability, origin = args.platform, args.capability, ""
    if args.detect:
        from ..dsv4.platform import INFERRED, machine

        # the doctor's machine: --platform names one (nothing detected), else this one, probes included
        found = machine(rules, args.platform, args.capability)
        if found.platform is None:
            return f"--detect: {found.problem} (here: --platform P [--capability C])"
        platform = found.platform
        capability = found.capability_given or found.capability
        origin = "detected" if found.detected else f"from --capability {capability}" \
            if found.source == INFERRED else ""
        inputs = {**found.inputs, **inputs}
    elif not platform and capability is not None:
        # a GPU name (or a capability only one platform declares) names its platform
        platform = rules.capability_platform(capability)
        origin = f"from --capability {capability}" if platform else ""
    return platform, capability, origin, inputs


def run(args: argparse.Namespace) -> int:
    from ..errors import InvalidQuery
    from ..tools.explain import explain
    from .common import error, load
    from .options import parse_inputs

    try:
        inputs = parse_inputs(args.input)
    except ValueError as exc:
        return error(PROG, str(exc))
    rules = load(args)  # a RuleError reaches cli.main: exit 2 with file:line:column
    machine_or_problem = _machine(args, rules, inputs)
    if isinstance(machine_or_problem, str):
        return error(PROG, machine_or_problem)
    platform, capability, origin, inputs = machine_or_problem
    if args.layers is not None and args.tokens is None:
        return error(PROG, "--layers describes the model for --tokens N; pass --tokens too")
    if not platform:
        return error(PROG, "--platform is required (one of " + ", ".join(rules.values("platform"))
                     + "), or pass --detect to read it from this machine, or a --capability that names "
                     "its GPU (H100, MI300X)")
    try:
        result = explain(rules, platform=platform, capability=capability, backend=args.backend,
                         kv_cache_dtype=args.kv_cache_dtype, model=args.model, extra=inputs,
                         tokens=args.tokens, layers=args.layers)
    except InvalidQuery as exc:
        # the reason already names the nearest value and all valid ones; the
        # suggestions list would only repeat it
        return error(PROG, exc.reason)
    except ValueError as exc:  # --layers that do not parse, or a model whose layers are not known
        return error(PROG, str(exc))
    if args.json:
        from .render.data import document

        sys.stdout.write(document(result.as_dict()))
    else:
        from .render.explain import report_text
        from .render.text import report_width, style_for

        sys.stdout.write(report_text(result, style_for(sys.stdout), report_width(sys.stdout), origin))
    return EXIT_OK if result.ok else EXIT_FINDINGS
