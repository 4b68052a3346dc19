"""``dsv4sel explain``: why this backend and cache format for one query.

Renders a :class:`dsv4sel.tools.explain.Explanation` for people (aligned, coloured
only on a terminal) or, with ``--json``, as one JSON object (keys documented
in docs/cli.md). Exit 0 when the query selects, 1 when it is rejected, 2 for
bad arguments or rule files. With a warm compiled cache this command imports
neither yaml, jsonschema nor torch (``--detect`` imports torch).
"""

from __future__ import annotations

import argparse
import sys

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
                                                   "required unless --detect")
    p.add_argument("--capability", metavar="C", help="CUDA compute capability such as 9.0, or a ROCm gfx "
                                                     "arch such as gfx942 (default: unknown)")
    p.add_argument("--backend", "--attention-backend", dest="backend", metavar="B",
                   help="the requested attention backend (default: none, the platform default)")
    p.add_argument("--kv-cache-dtype", default="auto", metavar="D", help="vLLM --kv-cache-dtype (default: auto)")
    p.add_argument("--model", metavar="M", help="model family (default: the rules' default, deepseek_v4)")
    add_input_option(p)
    add_rules_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object (keys: docs/cli.md)")
    p.add_argument("--detect", action="store_true",
                   help="fill --platform, --capability and probed inputs (e.g. mega_attn) from this machine "
                        "through torch and the kernel probes; explicit options win")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..errors import InvalidQuery
    from ..tools.explain import explain
    from .common import load
    from .options import parse_inputs
    from .output import error

    try:
        inputs = parse_inputs(args.input)
    except ValueError as exc:
        return error(PROG, str(exc))
    rules = load(args)  # a RuleError reaches cli.main: exit 2 with file:line:column
    platform, capability, detected = args.platform, args.capability, False
    if args.detect:
        from ..tools.doctor import probe_inputs
        from ..dsv4.platform import detect

        # detect() imports torch through kernels.platform.import_torch, which keeps torch's NumPy warning quiet
        try:
            found_platform, found_capability = detect()
        except InvalidQuery as exc:
            if not platform:  # an explicit --platform still gets the probed inputs
                return error(PROG, f"--detect: {exc.reason} (here: --platform P [--capability C])")
            found_platform = found_capability = None
        detected = found_platform is not None and not args.platform
        platform = platform or found_platform
        capability = capability if capability is not None else found_capability
        probed = probe_inputs(rules, platform, None if capability in (None, "unknown") else capability)
        inputs = {**{p.name: p.value for p in probed}, **inputs}
    if not platform:
        return error(PROG, "--platform is required (one of " + ", ".join(rules.values("platform"))
                     + "), or pass --detect to read it from this machine")
    try:
        result = explain(rules, platform=platform, capability=capability, backend=args.backend,
                         kv_cache_dtype=args.kv_cache_dtype, model=args.model, extra=inputs)
    except InvalidQuery as exc:
        # the reason already names the nearest value and all valid ones; the
        # suggestions list would only repeat it
        return error(PROG, exc.reason)
    if args.json:
        print(result.to_json())
    else:
        from .output import style_for

        from .output import output_width, wrap_lines

        lines = render(result, style_for(sys.stdout), detected)
        sys.stdout.write("\n".join(wrap_lines(lines, output_width(sys.stdout))) + "\n")
    return EXIT_OK if result.ok else EXIT_FINDINGS


# ----------------------------------------------------------------- rendering

_ACTIONS = {"default": "default backend -> {target}", "use": "hands over to {target}",
            "select": "selects", "reject": "rejects"}


def _input_name(name: str) -> str:
    """How the report names an input: as its flag for the kv dtype, else as the rules do."""
    return "kv-cache-dtype" if name == "kv_cache_dtype" else name


def _pack(rule) -> str:
    """Names the rule pack when the deciding rule is not a shipped one."""
    return "" if rule.pack == "dsv4sel" else f"  (pack {rule.pack})"


def render(ex, style, detected: bool = False) -> list[str]:
    """The human-readable report, one string per line (no colour when ``style`` is off)."""
    from ..dsv4.alternatives import flag
    from .output import align, where

    q = ex.query
    head = [f"{where(q)}{' (detected)' if detected else ''}", flag("kv_cache_dtype", q.kv_cache_dtype),
            flag("backend", q.backend),
            f"model {q.model}"] + [f"{k}={v}" for k, v in q.extra]
    lines = [style.bold("query") + "     " + ", ".join(head), ""]

    if ex.selection is not None:
        s = ex.selection
        how = ("platform default" if q.backend is None
               else f"asked for {q.backend}" if q.backend != s.backend else "as asked")
        lines.append(style.paint("selected", "bold", "green") + f"  {style.bold(s.backend)} ({how})")
        lines += align([
            ["impl", s.impl], ["layout", s.layout], ["cache dtype", s.cache_dtype],
            ["torch dtype", s.torch_dtype_name], ["bytes per token", str(s.bytes_per_token)],
            ["block size", str(s.block_size)],
            *[[f"{host} class", f"{cls} ({host} {versions})"] for host, cls, versions in s.hosts],
            ["decided by", f"{s.rule.id}  " + style.cyan(s.rule.location) + _pack(s.rule)],
        ] + ([["why", ex.description]] if ex.description else []), style)
    else:
        r = ex.rejection
        who = (r.backend + (" (platform default)" if q.backend is None else "")) if r.backend \
            else f"no DeepSeek-V4 backend for {where(q)}"
        lines.append(style.paint("rejected", "bold", "red") + f"  {style.bold(who)}")
        rows = [["reason", r.reason]]
        if r.blocked_by:
            rows.append(["blocked by", _input_name(r.blocked_by)])
        if r.rule is not None:
            rows.append(["decided by", f"{r.rule.id}  " + style.cyan(r.rule.location) + _pack(r.rule)])
            if ex.description:
                rows.append(["why", ex.description])
        lines += align(rows, style)

    if ex.rewrites:
        lines += ["", style.bold("rewrites")]
        lines += align([[w.attribute, f"{'?' if w.before is None else w.before} -> {w.after}"]
                        for w in ex.rewrites], style)
    if ex.messages:
        lines += ["", style.bold("messages")]
        lines += align([[(m.level, "yellow") if m.level == "warning" else m.level, str(m)]
                        for m in ex.messages], style)
    lines += ["", style.bold("path")]
    steps = align([[str(n), step.rule.id, (step.rule.location, "cyan"),
                    _ACTIONS[step.action].format(target=step.target)]
                   for n, step in enumerate(ex.path, 1)], style)
    for step, line in zip(ex.path, steps):
        lines.append(line)
        if step.description:  # why the rule exists, under its id
            lines.append(" " * (5 + len(str(len(ex.path))) - 1) + step.description)
    if ex.rejection is not None and ex.rejection.gap:
        lines.append("  " + style.yellow(ex.rejection.reason))

    if ex.why_not:
        lines += ["", style.bold("why not")]
        heads = align([[w.backend,
                        w.verdict.replace("_", " ") + (f" ({_input_name(w.blocked_by)})" if w.blocked_by else ""),
                        w.rule.id if w.rule else "-", (w.rule.location, "cyan") if w.rule else ""]
                       for w in ex.why_not], style)
        for w, head in zip(ex.why_not, heads):
            lines += [head, "      " + w.reason]
            if w.verdict == "rejects" and w.accepts:
                lines.append("      accepts here: --kv-cache-dtype " + ", ".join(w.accepts))

    if ex.rejection is not None:
        lines += ["", style.bold("nearest working alternatives")]
        if ex.alternatives:
            rows = []
            for a in ex.alternatives:
                change = a.flags + (f" (or {', '.join(a.also)})" if a.also else "")
                sel = a.selection
                rows.append([(change, "green"), sel.backend, sel.layout, f"{sel.bytes_per_token} B/token",
                             (sel.rule.location, "cyan")])
            lines += align(rows, style)
        else:
            lines.append(f"  none: no backend and kv-cache dtype select on {where(q)}; "
                         "`dsv4sel table` lists the supported platforms")
    return lines
