"""``dsv4sel doctor``: what this machine is, what the rules pick on it, what can run.

Reports (1) the machine: platform and capability (detected through torch or
``DSV4SEL_PLATFORM``, or given with ``--platform/--capability`` to ask about
another machine), the torch version or "torch not installed"; (2) the
selection the rules make there for ``auto`` and every other kv dtype; (3) for
every impl class the rules name, whether it loads (through the rule set's
allow-list, :meth:`Selection.load_impl`) and whether its kernel library can
run here (``is_available``), with the reason.

Exit 0 when the ``auto`` selection's impl can run, 1 when it cannot (platform
not detected, ``auto`` rejected, impl unavailable), 2 for bad arguments or
rule files. Unlike ``explain``, this command imports torch.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any

from .common import add_rules_option

PROG = "dsv4sel doctor"


def add_parser(sub) -> None:
    p = sub.add_parser(
        "doctor", help="show this machine, the backend the rules choose on it and which kernels can run",
        description="Report this machine (platform, capability, torch), the selection the rules make on "
                    "it for each kv-cache dtype, and whether each impl's kernel library is importable. "
                    "--platform/--capability ask about another machine. Exit 0 when the auto selection "
                    "can run here, 1 when it cannot, 2 for bad arguments or rule files.")
    p.add_argument("--platform", metavar="P", help="ask about this platform instead of detecting it")
    p.add_argument("--capability", metavar="C", help="with --platform: the capability (default: unknown)")
    add_rules_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


@dataclass(frozen=True, slots=True)
class Machine:
    """``platform`` is None when it could not be detected (``problem`` says why);
    ``source`` says where it came from: torch, DSV4SEL_PLATFORM or --platform."""

    platform: str | None
    capability: str | None
    source: str
    torch: str | None
    torch_problem: str | None
    problem: str | None


@dataclass(frozen=True, slots=True)
class ImplCheck:
    impl: str
    backends: tuple[str, ...]
    available: bool
    reason: str


def _torch() -> tuple[Any, str | None]:
    try:
        import torch
    except ImportError:
        return None, "torch not installed"
    except Exception as exc:  # a broken install must not stop the doctor
        return None, f"torch failed to import ({type(exc).__name__}: {exc})"
    return torch, None


def machine(args: argparse.Namespace) -> Machine:
    """This machine, or the one named by ``--platform/--capability``."""
    from ..errors import InvalidQuery
    from ..platform import PLATFORM_ENV, detect

    torch, torch_problem = _torch()
    version = getattr(torch, "__version__", None) if torch is not None else None
    if args.platform:
        return Machine(args.platform, args.capability, "--platform", version, torch_problem, None)
    try:
        platform, capability = detect()
    except InvalidQuery as exc:
        return Machine(None, None, "", version, torch_problem, exc.reason)
    env = os.environ.get(PLATFORM_ENV, "").strip().lower()
    # detect() consults the environment only when torch sees no device
    gpu = torch is not None and (getattr(torch.version, "hip", None) or torch.cuda.is_available()
                                 or (getattr(torch, "xpu", None) is not None and torch.xpu.is_available()))
    source = PLATFORM_ENV if env == platform and not gpu else "torch"
    if args.capability is not None:
        capability, source = args.capability, source + ", --capability"
    return Machine(platform, capability, source, version, torch_problem, None)


def _selections(rules, query) -> list[tuple[str, Any]]:
    """(kv dtype, Selection or Rejection) for every kv dtype, ``auto`` first."""
    from ..values import Query

    kvs = list(rules.values("kv_cache_dtype"))
    default = rules.default_of("kv_cache_dtype") or kvs[0]
    kvs.sort(key=lambda kv: kv != default)  # stable: the default first, then vocabulary order
    out = []
    for kv in kvs:
        q = Query(query.model, query.platform, query.capability, None, kv, query.extra)
        out.append((kv, rules.outcome(q)))
    return out


def _impl_checks(rules, platform: str | None, capability: str | None) -> list[ImplCheck]:
    """Load every impl the rules name through a Selection (so the rule set's
    allow-list applies) and ask it whether it can run."""
    from ..errors import ImplLoadError
    from ..values import Query, Selection

    extra_names = rules.extra_inputs
    first: dict[str, tuple] = {}
    backends: dict[str, list[str]] = {}
    for key, index in rules._table.items():
        row = rules._outcomes[index]
        if row[0] != "select":
            continue
        first.setdefault(row[2], key)
        names = backends.setdefault(row[2], [])
        if row[1] not in names:
            names.append(row[1])
    order = {b: i for i, b in enumerate(rules.selectable_backends)}
    checks = []
    for impl in sorted(first, key=lambda i: min(order.get(b, len(order)) for b in backends[i])):
        model, plat, cap, backend, kv, *extra = first[impl]
        sel = rules.outcome(Query(model, plat, cap, backend, kv, tuple(zip(extra_names, extra))))
        assert isinstance(sel, Selection)
        names = tuple(sorted(backends[impl], key=lambda b: order.get(b, len(order))))
        try:
            cls = sel.load_impl()
        except ImplLoadError as exc:
            checks.append(ImplCheck(impl, names, False, f"cannot load: {exc}"))
            continue
        probe = getattr(cls, "is_available", None)
        if not callable(probe):
            checks.append(ImplCheck(impl, names, False, f"{cls.__name__} has no is_available() classmethod"))
            continue
        try:
            ok, reason = probe(platform, None if platform is None else capability)
        except Exception as exc:  # a kernel adapter's bug is a finding, not a crash
            ok, reason = False, f"is_available() raised {type(exc).__name__}: {exc}"
        checks.append(ImplCheck(impl, names, bool(ok), str(reason)))
    return checks


def run(args: argparse.Namespace) -> int:
    from ..errors import InvalidQuery
    from .common import load
    from .output import error

    rules = load(args)
    with warnings.catch_warnings():
        # a CPU-only torch without numpy warns on import; irrelevant to the report
        warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
        here = machine(args)
        query = notes = None
        if here.platform is not None:
            try:
                query, notes = rules.normalize(platform=here.platform, capability=here.capability)
            except InvalidQuery as exc:
                if args.platform:
                    return error(PROG, exc.reason)
                here = Machine(None, None, here.source, here.torch, here.torch_problem,
                               f"detected {here.platform} {here.capability}, which the rules reject: {exc.reason}")
        selections = _selections(rules, query) if query is not None else []
        asked = query.platform if query is not None and args.platform else None
        checks = _impl_checks(rules, asked, query.capability if asked else None)

    auto = selections[0][1] if selections else None
    auto_impl = getattr(auto, "impl", None)
    ok = auto_impl is not None and any(c.impl == auto_impl and c.available for c in checks)
    if args.json:
        _print_json(rules, here, query, notes, selections, checks, ok)
    else:
        from .output import style_for

        out = _render(rules, here, query, notes, selections, checks, ok, style_for(sys.stdout))
        sys.stdout.write("\n".join(out) + "\n")
    return 0 if ok else 1


def _where(query) -> str:
    cap = "capability unknown" if query.capability == "unknown" else query.capability
    return f"{query.platform} {cap}"


def _render(rules, here: Machine, query, notes, selections, checks, ok: bool, style) -> list[str]:
    import platform as pyplatform

    from .. import __version__
    from ..ruleset import Rejection
    from .output import align

    lines = [style.bold("machine")]
    if here.platform is None:
        plat = (style.yellow("not detected") + f": {here.problem}; pass --platform P [--capability C] "
                "to ask about a machine")
        cap = "-"
    else:
        plat = f"{here.platform} (from {here.source})"
        cap = query.capability if query is not None else str(here.capability)
        if here.capability not in (None, cap):
            cap += f" (given {here.capability})"
    lines += align([
        ["platform", plat], ["capability", cap],
        ["torch", here.torch or style.yellow(here.torch_problem or "torch not installed")],
        ["python", pyplatform.python_version()],
        ["dsv4sel", f"{__version__}, rules {rules.digest[:12]} ({len(rules.sources)} files)"],
    ], style)
    for note in notes or ():
        lines.append("  " + style.yellow(f"warning: {note}"))

    if query is not None:
        lines += ["", style.bold(f"selection on {_where(query)}") + " (no --attention-backend)"]
        rows = [["kv dtype", "backend", "layout", "cache dtype", "rule", "at"]]
        for kv, outcome in selections:
            rule = outcome.rule
            where = [rule.id, (rule.location, "cyan")] if rule is not None else ["-", ""]
            if isinstance(outcome, Rejection):
                rows.append([kv, ("rejected", "red"), "-", "-", *where])
            else:
                rows.append([kv, (outcome.backend, "green"), outcome.layout, outcome.cache_dtype, *where])
        table = align(rows, style)
        lines += [style.dim(table[0]) if style.enabled else table[0]] + table[1:]
        lines.append(f"  why: dsv4sel explain --platform {query.platform} --capability {query.capability} "
                     "--kv-cache-dtype D")

    target = f"{query.platform} {query.capability}" if query is not None and here.source == "--platform" \
        else "this machine"
    lines += ["", style.bold(f"kernels (for {target})")]
    heads = align([[("ok", "green") if c.available else ("unavailable", "red"), c.impl, ", ".join(c.backends)]
                   for c in checks], style)
    for check, head in zip(checks, heads):
        lines += [head, "      " + check.reason]
    lines.append("")
    if ok:
        lines.append(style.green("ok") + ": the auto selection's impl can run")
    elif query is None:
        lines.append(style.red("not ok") + ": platform unknown")
    elif isinstance(selections[0][1], Rejection):
        lines.append(style.red("not ok") + f": kv dtype auto is rejected on {_where(query)}")
    else:
        lines.append(style.red("not ok") + f": {selections[0][1].impl} cannot run here")
    return lines


def _print_json(rules, here: Machine, query, notes, selections, checks, ok: bool) -> None:
    import json
    import platform as pyplatform

    from .. import __version__
    from ..ruleset import Rejection

    def rule(ref):
        return None if ref is None else {"id": ref.id, "location": ref.location}

    data = {
        "version": 1,
        "ok": ok,
        "machine": {
            "platform": here.platform, "capability": query.capability if query is not None else None,
            "source": here.source or None, "problem": here.problem, "torch": here.torch,
            "torch_problem": here.torch_problem, "python": pyplatform.python_version(),
            "dsv4sel": __version__, "rules_digest": rules.digest,
        },
        "messages": [{"level": m.level, "text": str(m)} for m in notes or ()],
        "selections": [
            {"kv_cache_dtype": kv, "status": "rejected", "backend": o.backend, "reason": o.reason,
             "rule": rule(o.rule)} if isinstance(o, Rejection) else
            {"kv_cache_dtype": kv, "status": "selected", "backend": o.backend, "layout": o.layout,
             "cache_dtype": o.cache_dtype, "impl": o.impl, "rule": rule(o.rule)}
            for kv, o in selections],
        "impls": [{"impl": c.impl, "backends": list(c.backends), "available": c.available, "reason": c.reason}
                  for c in checks],
    }
    print(json.dumps(data, indent=2))
