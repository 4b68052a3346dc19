"""Whole-space differential: SGLang 0.5.23's own DeepSeek-V4 decisions against dsv4sel, one platform.

    .venv-sglang/bin/python tests/sglang523/differential.py PLATFORM [--compat DIR] [--out FILE]

Enumerates every input of the SGLang host space on PLATFORM (:func:`oracle.points`), asks SGLang
(:class:`oracle.Oracle`: its resolution pipeline, then its layout function and backend factory)
and, with ``--compat``, the compat rule set, and writes a JSON report: SGLang's outcome counts
(resolved / refused at config time / refused after the weights load) and, for the compat set,
agreements and every disagreement. A compat selection agrees with an input SGLang serves when its
``hosts.sglang`` class and settings (``dsv4_attn_backend``, ``kv_layout``, ``kv_cache_dtype``,
``page_size``, ``kv_pool`` and a split prefill/decode backend SGLang keeps) are what SGLang
resolved and built; a compat rejection agrees with an input SGLang
refuses when the rule's reason cites the SGLang ``file:line`` that raised (so a rejection for
the wrong reason disagrees). Run in a fresh process per platform: SGLang reads the platform into
module constants at import.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import forked  # noqa: E402
import oracle  # noqa: E402
import plugin_checks  # noqa: E402

#: SGLang's KVLayout names as the rules' kv_layout setting spells them.
LAYOUT_SETTING = {"V4": "v4", "V41": "v41", "V41_NEW": "v41_new"}
POOL_SETTING = {"DeepSeekV4SingleKVPool": "single", "DeepSeekV4UniformFP8KVPool": "uniform_fp8",
                "DeepSeekV4UnifiedKVPool": "unified"}
_CITE = re.compile(r"\((srt/[\w/]+\.py:\d+)\)")


def host_query(point: dict) -> dict:
    """The dsv4sel query of one host-space input (the compat set's vocabulary is SGLang's own)."""
    extra = {"kv_layout_env": point["kv_layout_env"], "deployment": point["deployment"]}
    if "hip_kernel" in point:
        extra["hip_kernel"] = point["hip_kernel"]
    backend = None if point["dsv4_attn_backend"] == "auto" else point["dsv4_attn_backend"]
    return dict(platform=point["platform"], capability=point["capability"], backend=backend,
                kv_cache_dtype=point["kv_cache_dtype"], model=point["model"], extra=extra)


def rules_outcome(rules, point: dict) -> dict:
    """The compat set's outcome, from ``RuleSet.outcome`` (what ``select()`` returns, or the
    message it raises without the nearest-alternative suggestions: they cost milliseconds a
    refusal and are not compared)."""
    from dsv4sel import SelectionError
    from dsv4sel.dsv4.selection import Selection

    try:
        query, notes = rules.normalize(**host_query(point))
        sel = rules.outcome(query, notes)
        if sel.__class__ is not Selection:
            raise SelectionError(sel.message(), rule=sel.rule)
    except SelectionError as exc:
        reason = str(exc)
        cite = _CITE.findall(reason)
        return {"kind": "reject", "cites": cite[-1] if cite else None,
                "late": "after the weights load" in reason,
                "rule": exc.rule.location if getattr(exc, "rule", None) else None}
    host = sel.host_class("sglang")
    return {"kind": "select", "class": host[0] if host else None, "settings": sel.settings_for("sglang"),
            "rule": sel.rule.location}


def sglang_view(o: oracle.Outcome) -> dict:
    """SGLang's outcome in the terms a rule states."""
    if o.stage == "ok":
        settings = {"dsv4_attn_backend": o.resolved["dsv4_attn_backend"],
                    "kv_layout": LAYOUT_SETTING[o.layout], "kv_cache_dtype": o.resolved["kv_cache_dtype"],
                    "page_size": o.resolved["page_size"], "kv_pool": POOL_SETTING[o.pool]}
        for split in ("prefill_attention_backend", "decode_attention_backend"):
            # a split backend SGLang keeps beside dsv4 (it then builds a hybrid backend)
            if o.resolved[split] not in (None, "dsv4"):
                settings[split] = o.resolved[split]
        return {"kind": "select", "class": o.cls, "settings": settings}
    return {"kind": "reject", "where": o.where, "late": o.stage == "late"}


def agrees(s: dict, d: dict) -> bool:
    if s["kind"] != d["kind"]:
        return False
    if s["kind"] == "select":
        return s["class"] == d["class"] and s["settings"] == d["settings"]
    return s["where"] == d["cites"] and s["late"] == d["late"]


def rules_decision(point: dict):
    """``(decision, key)``: what the shipped rules decide for ``point`` through the SGLang
    translation (a HostDecision, or None where they refuse; no SGLang needed), and which rule or
    translation row decides it: ("select", rule file:line) or ("refuse", the refusing row's or
    rule's file:line)."""
    from dsv4sel import SelectionError
    from dsv4sel.sglang_plugin.translation import translation

    try:
        decided = translation().decide(point, _outcomes())
    except SelectionError as exc:
        return None, ("refuse", str(getattr(exc, "origin", None)))
    return decided, ("select", decided.selection.rule.location)


@functools.lru_cache(maxsize=1)
def _outcomes():
    """The shipped rules' outcomes without the suggestions a refusal computes (only keys needed)."""
    import dsv4sel
    from dsv4sel.check.host_spaces import Outcomes

    return Outcomes(dsv4sel.default_rules())


def plugin_sample(platform: str, every: int, limit: int = 0) -> tuple[list[int], set]:
    """The inputs the plugin pass runs: every ``every``-th, plus the first input of each deciding
    rule or translation row that the stride misses, so every shipped rule and fix that decides
    some input of the space is exercised through SGLang (deterministic)."""
    chosen, seen = [], set()
    keys = {}
    for i, point in enumerate(oracle.points(platform)):
        if limit and i >= limit:
            break
        key = keys[i] = rules_decision(point)[1]
        if i % every == 0:
            chosen.append(i)
            seen.add(key)
    for i, key in keys.items():
        if key not in seen:
            chosen.append(i)
            seen.add(key)
    return sorted(chosen), seen


def _plugin_verdict(want, got: oracle.Outcome, point: dict, server_args) -> str:
    """How SGLang with the plugin handled one input whose rules' decision is ``want`` (None: refused)."""
    from dsv4sel.sglang_plugin import scheduler

    if want is None:
        declared = [src for src, _ in getattr(server_args, "_resolved_overrides", ()) if src == "dsv4sel"]
        untouched = (not declared and os.environ.get("SGLANG_DSV4_KV_LAYOUT", "unset") == point["kv_layout_env"]
                     and scheduler.published() is None)
        ok = got.stage == "config" and got.error == "SelectionError" and untouched
        return "refused before the weights load" if ok else "wrong"
    view = sglang_view(got)
    ok = view["kind"] == "select" and view["class"] == want.cls and view["settings"] == want.settings
    return "built the rules' class and settings" if ok else "wrong"


def plugin_pass(o: oracle.Oracle, platform: str, chosen: list[int]) -> dict:
    """SGLang again, with the dsv4sel plugin loaded the way SGLang loads it: ``SGLANG_PLUGINS=dsv4sel``
    and SGLang's own ``load_plugins()`` (entry point ``sglang.srt.plugins``, then its HookRegistry),
    on the inputs ``chosen`` (indices into :func:`oracle.points`). The plugin agrees when SGLang then
    resolves and builds exactly what the shipped rules decide (:func:`rules_decision`, the
    plugin's translation over the shipped rules: class and settings; the scheduler guards ran on
    the layout and the factory), or, where they refuse, SGLang's resolution stops with dsv4sel's
    SelectionError with the server args untouched: no declaration of dsv4sel's,
    ``SGLANG_DSV4_KV_LAYOUT`` as the user set it, no decision published."""
    from dsv4sel.sglang_plugin import STEP, scheduler
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS
    from sglang.srt.plugins import load_plugins
    from sglang.srt.plugins.hook_registry import HookRegistry

    os.environ["SGLANG_PLUGINS"] = "dsv4sel"
    load_plugins()
    hooks = [f"{fn.__module__}.{fn.__qualname__}" for fn in _HOOKS.get(STEP, ())]
    guarded = sorted(t for t in HookRegistry._patched if t in (
        scheduler.LAYOUT_TARGET, scheduler.FACTORY_TARGET, scheduler.HIP_TARGET))
    counts: collections.Counter = collections.Counter()
    covered: set = set()
    wrong = []
    sample = set(chosen)
    checked: dict = {"keys": set(), "inputs": 0, "differ": []}
    for i, point in enumerate(oracle.points(platform)):
        if i not in sample:
            continue
        want, key = rules_decision(point)
        covered.add(json.dumps(key))
        got = _decide_checked(o, point, i, checked)
        verdict = _plugin_verdict(want, got, point, o.last_args)
        counts[verdict] += 1
        if verdict == "wrong" and len(wrong) < 50:
            wrong.append({"input": point, "sglang": got.as_dict(),
                          "rules": None if want is None else {"class": want.cls, "settings": want.settings}})
    return {"counts": dict(counts), "inputs": len(sample), "resolution_hooks": hooks, "guarded": guarded,
            "covered": sorted(covered), "wrong": wrong, "model_config": _checked_report(checked)}


def sglang_pass(o: oracle.Oracle, platform: str, chosen: list[int], compat) -> dict:
    """SGLang alone on the inputs ``chosen``: its outcome counts and, with ``compat``, the agreements."""
    stages: collections.Counter = collections.Counter()
    causes: collections.Counter = collections.Counter()
    agree, disagree, examples = 0, 0, []
    sample = set(chosen)
    checked: dict = {"keys": set(), "inputs": 0, "differ": []}
    for i, point in enumerate(oracle.points(platform)):
        if i not in sample:
            continue
        got = _decide_checked(o, point, i, checked)
        stages[got.stage] += 1
        s = sglang_view(got)
        causes[json.dumps({k: v for k, v in {**s, "settings": s.get("settings")}.items() if v is not None},
                          sort_keys=True)] += 1
        if compat is None:
            continue
        d = rules_outcome(compat, point)
        if agrees(s, d):
            agree += 1
            continue
        disagree += 1
        if len(examples) < 200:
            examples.append({"input": point, "sglang": {**s, "message": got.message}, "compat": d})
    out = {"inputs": len(sample), "stages": dict(stages), "outcomes": dict(causes),
           "model_config": _checked_report(checked)}
    if compat is not None:
        out["compat"] = {"agree": agree, "disagree": disagree, "examples": examples}
    return out


#: every CHECK_EVERY-th input (and each key's first) runs with a fresh ModelConfig too
CHECK_EVERY = 32


def _decide_checked(o: oracle.Oracle, point: dict, i: int, checked: dict) -> oracle.Outcome:
    """``o.decide(point)`` (SGLang handed the ModelConfig of ``point``'s key, oracle.Oracle._server_args);
    on the first input of each key and every CHECK_EVERY-th, SGLang also runs with a ModelConfig it
    builds anew first, and the two outcomes must be equal (recorded in ``checked``)."""
    key = o.model_config_key(point)
    if i % CHECK_EVERY and key in checked["keys"]:
        return o.decide(point)
    fresh = o.decide_fresh(point)
    got = o.decide(point)
    checked["keys"].add(key)
    checked["inputs"] += 1
    if got != fresh and len(checked["differ"]) < 20:
        checked["differ"].append({"input": point, "fresh": fresh.as_dict(), "reused": got.as_dict()})
    return got


def _checked_report(checked: dict) -> dict:
    return {"keys": sorted(json.dumps(k) for k in checked["keys"]), "inputs": checked["inputs"],
            "differ": checked["differ"]}


def _merge_checked(parts: list[dict]) -> dict:
    return {"keys": len({k for r in parts for k in r["model_config"]["keys"]}),
            "inputs": sum(r["model_config"]["inputs"] for r in parts),
            "differ": [d for r in parts for d in r["model_config"]["differ"]][:20]}


def _merge_sglang(parts: list[dict]) -> dict:
    stages: collections.Counter = collections.Counter()
    causes: collections.Counter = collections.Counter()
    for r in parts:
        stages.update(r["stages"])
        causes.update(r["outcomes"])
    out = {"inputs": sum(r["inputs"] for r in parts), "stages": dict(stages), "outcomes": dict(causes.most_common()),
           "model_config": _merge_checked(parts)}
    if parts and "compat" in parts[0]:
        out["compat"] = {"agree": sum(r["compat"]["agree"] for r in parts),
                         "disagree": sum(r["compat"]["disagree"] for r in parts),
                         "examples": [e for r in parts for e in r["compat"]["examples"]][:200]}
    return out


def _merge_plugin(parts: list[dict], in_space: set | None) -> dict:
    counts: collections.Counter = collections.Counter()
    for r in parts:
        counts.update(r["counts"])
    covered = {k for r in parts for k in r["covered"]}
    # every child loaded the plugin through SGLang's loader on its own: all must have seen the same
    assert all(r["resolution_hooks"] == parts[0]["resolution_hooks"] and r["guarded"] == parts[0]["guarded"]
               for r in parts)
    return {"counts": dict(counts), "inputs": sum(r["inputs"] for r in parts),
            "resolution_hooks": parts[0]["resolution_hooks"], "guarded": parts[0]["guarded"],
            "covered": sorted(covered),
            "in_space": sorted(covered if in_space is None else {json.dumps(k) for k in in_space}),
            "wrong": [w for r in parts for w in r["wrong"]][:50], "model_config": _merge_checked(parts)}


def _plugin_inputs(platform: str, every: int, n: int) -> tuple[list[int], set | None]:
    """The plugin pass's inputs: all ``n`` with ``every`` 1, else :func:`plugin_sample`'s; and the
    keys of every deciding rule or row of the space (None with ``every`` 1: the pass itself
    decides every input, so the keys it covers are the space's)."""
    if every > 1:
        return plugin_sample(platform, every, n)
    return list(range(n)), None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("platform", choices=("cuda", "rocm"))
    ap.add_argument("--compat")
    ap.add_argument("--out")
    ap.add_argument("--plugin-every", type=int, default=0,
                    help="also run inputs again with the dsv4sel plugin: 1 every input, N every Nth plus the "
                         "first of each deciding rule or row, 0 none")
    ap.add_argument("--plugin-only", action="store_true",
                    help="only the plugin pass (no compat comparison), e.g. under python -O")
    ap.add_argument("--scenario", action="append", default=[],
                    help="also run this plugin_checks.py scenario in a child of this process")
    ap.add_argument("--other-sglang", help="the folder holding another SGLang's dist-info (gate-metadata)")
    ap.add_argument("--workers", type=int, default=2, help="children at once")
    ap.add_argument("--chunks", type=int, default=4, help="children per pass")
    ap.add_argument("--limit", type=int, default=0, help="only the first N inputs (debugging)")
    args = ap.parse_args()
    t0 = time.time()
    o = oracle.Oracle(args.platform)
    compat = None
    if args.compat:
        import dsv4sel

        compat = dsv4sel.load_rules([args.compat])
    n = args.limit or sum(1 for _ in oracle.points(args.platform))
    jobs: list = []
    if not args.plugin_only:
        jobs += [("sglang", c) for c in forked.chunks(list(range(n)), args.chunks)]
    in_space: set | None = set()
    if args.plugin_every:
        chosen, in_space = _plugin_inputs(args.platform, args.plugin_every, n)
        jobs += [("plugin", c) for c in forked.chunks(chosen, args.chunks)]
    jobs += [("scenario", name) for name in args.scenario]

    def run(job):
        kind, what = job
        if kind == "sglang":
            return sglang_pass(o, args.platform, what, compat)
        if kind == "plugin":
            return plugin_pass(o, args.platform, what)
        return plugin_checks.run(what, o, other_sglang=args.other_sglang)
    done = list(zip(jobs, forked.run_forked(jobs, run, args.workers)))
    report = {"platform": args.platform, "optimize": sys.flags.optimize,
              **_merge_sglang([r for (k, _), r in done if k == "sglang"])}
    if args.plugin_every:
        report["plugin"] = _merge_plugin([r for (k, _), r in done if k == "plugin"], in_space)
    report["scenarios"] = {name: r for (k, name), r in done if k == "scenario"}
    report["seconds"] = round(time.time() - t0, 1)
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
