"""Whole-space differential: vLLM 0.33's own decisions against dsv4sel rule sets, one platform.

    .venv-vllm/bin/python tests/vllm33/differential.py PLATFORM [--rules NAME=DIR ...] [--out FILE]

Enumerates every input of the shipped rules' decision space on PLATFORM (each model,
capability, backend choice, kv-cache dtype and pack input), asks vLLM (:mod:`oracle`) and each
rule set, and writes a JSON report: per rule set, how many inputs agree, disagree, are refused
by vLLM's config classes before any DeepSeek-V4 code runs, or are left undecided by vLLM (an
assert or NotImplementedError), plus every disagreement. A selection agrees when the layer
class, cache dtype, torch dtype and cache-config rewrite are vLLM's and, where vLLM decides
them (:func:`oracle.sizes_decided`), so are the KV record (the layout's, in vLLM's terms) and
the kernel block size; ``sizes_compared`` / ``sizes_not_compared`` count those selections. Run
in a fresh process per platform: vLLM fixes its platform on first import.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oracle  # noqa: E402
import stubs  # noqa: E402


#: dsv4sel's layouts in the terms of :func:`oracle.sizes`: which record vLLM's layer writes.
#: fp8_ds_mla is V4's 584-byte record, fp8_ds_mla_v41 V4.1's 528-byte one (kernels/layouts.py);
#: construct.py checks the byte counts on real layers.
RECORD_OF_LAYOUT = {"fp8_ds_mla": "v4", "fp8_ds_mla_v41": "v41", "bf16_row": "rows", "fp8_e4m3_row": "rows"}
SELECT_KEYS = ("class", "cache_dtype", "torch_dtype", "cache_config")


def _pcp(extra: dict) -> int:
    """vLLM's prefill_context_parallel_size for the rules' input."""
    return 2 if extra.get("prefill_context_parallel") == "on" else 1


def dsv4sel_outcome(rules, model, platform, capability, backend, kv, extra) -> dict:
    from dsv4sel import SelectionError

    try:
        sel = rules.select(platform=platform, capability=capability, backend=backend, kv_cache_dtype=kv,
                           model=model, extra=extra)
    except SelectionError as exc:
        return {"kind": "reject", "rule": exc.rule.location if getattr(exc, "rule", None) else None}
    host = sel.host_class("vllm")
    return {"kind": "select", "class": host[0] if host else None, "cache_dtype": sel.cache_dtype,
            "torch_dtype": sel.torch_dtype_name, "cache_config": sel.rewrites.get("cache_dtype", kv),
            "sizes": {"record": RECORD_OF_LAYOUT[sel.layout], "block_size": sel.block_size},
            "layout": sel.layout, "bytes_per_token": sel.bytes_per_token, "rule": sel.rule.location}


def _same_selection(v: dict, d: dict) -> bool:
    """vLLM's selection ``v`` (its own, or with the plugin) and dsv4sel's ``d`` name the same class,
    dtypes and rewrite, and the same record and block size wherever vLLM decides those."""
    if d["kind"] != "select" or any(v[k] != d[k] for k in SELECT_KEYS):
        return False
    return v["sizes"] is None or v["sizes"] == d["sizes"]


def agrees(v: dict, d: dict) -> bool:
    if v["kind"] == "reject":
        return d["kind"] == "reject"
    if v["kind"] == "select":
        return _same_selection(v, d)
    raise ValueError(v["kind"])


def plugin_outcome(model, platform, capability, backend, kv, extra) -> dict:
    """What vLLM does with the dsv4sel plugin installed: its own call sites' path through the
    patched module attributes (select where vLLM has a selection function, else the class the
    platform's model module hard-codes), then the patched resolver, as the layer's __init__."""
    import vllm.config.vllm as config_module
    from dsv4sel import SelectionError

    stubs.set_device(capability, platform)
    oracle._MEGA["available"] = extra.get("mega_attn") == "available"
    oracle.FLASHINFER_SM120["available"] = extra.get("flashinfer_sm120", "available") == "available"
    try:
        cfg = oracle.vllm_config(backend, kv, pcp=_pcp(extra))
    except Exception:
        return {"kind": "refused"}
    if backend is not None and getattr(cfg.attention_config.backend, "name", None) != backend:
        return {"kind": "refused"}  # rewritten by AttentionConfig before any DSv4 code
    before = cfg.cache_config.cache_dtype
    config_module._current_vllm_config = cfg
    try:
        cls = oracle._layer_class(model, platform, cfg)
        cache_dtype, torch_dtype = oracle.resolve(model, cls, kv, cfg.cache_config)
    except SelectionError as exc:
        return {"kind": "reject", "untouched": cfg.cache_config.cache_dtype == before,
                "message": str(exc).splitlines()[0][:160]}
    except Exception as exc:
        if _pcp(extra) > 1 and isinstance(exc, NotImplementedError):
            return {"kind": "undecided"}  # vLLM itself refuses before dsv4sel is asked
        return {"kind": "error", "error": type(exc).__name__, "message": str(exc)[:160]}
    finally:
        config_module._current_vllm_config = None
    # the class the plugin made vLLM build writes the record and takes the block size vLLM's own
    # code gives it there: the rules' sizes must be those (dsv4sel cannot change them)
    return {"kind": "select", "class": oracle._cls_path(cls), "cache_dtype": str(cache_dtype),
            "torch_dtype": str(torch_dtype).removeprefix("torch."),
            "cache_config": str(cfg.cache_config.cache_dtype),
            "sizes": oracle.sizes(model, cls) if oracle.sizes_decided(platform, capability) else None}


def plugin_agrees(p: dict, d: dict) -> bool:
    if p["kind"] == "refused":
        return True  # vLLM's config refused the value: dsv4sel is never asked
    if d["kind"] == "reject":
        return p["kind"] == "reject" and p["untouched"]
    return p["kind"] == "select" and _same_selection(p, d)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("platform")
    ap.add_argument("--rules", action="append", default=[], help="NAME=DIR (default: shipped only)")
    ap.add_argument("--out")
    args = ap.parse_args()
    t0 = time.perf_counter()
    oracle.prepare(args.platform)
    import dsv4sel

    sets = {"shipped": dsv4sel.default_rules()}
    for item in args.rules:
        name, _, path = item.partition("=")
        sets[name] = dsv4sel.load_rules(paths=[path])
    space = sets["shipped"]
    extra_names = tuple(space.extra_inputs)
    keys = sorted((k for k in space._table if k[1] == args.platform),
                  key=lambda k: tuple("" if x is None else x for x in k))
    report = {"platform": args.platform, "inputs": len(keys), "vllm": {}, "sets": {}}
    per_set = {name: {"agree": 0, "disagree": [], "refused": {"dsv4sel_rejects": 0, "dsv4sel_selects": []},
                      "undecided": {}, "sizes_compared": 0, "sizes_not_compared": 0} for name in sets}
    for key in keys:
        model, platform, cap, backend, kv, *extra_values = key
        extra = dict(zip(extra_names, extra_values))
        v = oracle.decide(model, platform, cap, backend, kv, extra.get("mega_attn", "unavailable"), _pcp(extra))
        report["vllm"][v["kind"]] = report["vllm"].get(v["kind"], 0) + 1
        for name, rules in sets.items():
            d = dsv4sel_outcome(rules, model, platform, cap, backend, kv, extra)
            slot = per_set[name]
            row = {"input": {"model": model, "capability": cap, "backend": backend, "kv": kv, **extra},
                   "vllm": v, "dsv4sel": d}
            if v["kind"] == "refused":
                if d["kind"] == "reject":
                    slot["refused"]["dsv4sel_rejects"] += 1
                else:
                    slot["refused"]["dsv4sel_selects"].append(row)
            elif v["kind"] == "undecided":
                slot["undecided"][v["error"]] = slot["undecided"].get(v["error"], 0) + 1
            else:
                if v["kind"] == "select" and d["kind"] == "select":
                    slot["sizes_not_compared" if v["sizes"] is None else "sizes_compared"] += 1
                if agrees(v, d):
                    slot["agree"] += 1
                else:
                    slot["disagree"].append(row)
    # the same inputs through vLLM with the plugin installed (shipped rules)
    import dsv4sel.vllm_plugin as plugin

    replaced = plugin.install(sets["shipped"])
    plugin_report = {"replaced": [f"{m}.{a}" for m, a in replaced], "agree": 0, "refused": 0,
                     "selects": 0, "rejects": 0, "sizes_compared": 0, "disagree": []}
    for key in keys:
        model, platform, cap, backend, kv, *extra_values = key
        extra = dict(zip(extra_names, extra_values))
        p = plugin_outcome(model, platform, cap, backend, kv, extra)
        d = dsv4sel_outcome(sets["shipped"], model, platform, cap, backend, kv, extra)
        if p["kind"] == "refused":
            plugin_report["refused"] += 1
        elif p["kind"] == "undecided":
            plugin_report.setdefault("vllm_raises_first", 0)
            plugin_report["vllm_raises_first"] += 1
        elif plugin_agrees(p, d):
            plugin_report["agree"] += 1
            plugin_report["selects" if p["kind"] == "select" else "rejects"] += 1
            plugin_report["sizes_compared"] += int(p["kind"] == "select" and p["sizes"] is not None)
        else:
            plugin_report["disagree"].append({"input": {"model": model, "capability": cap, "backend": backend,
                                                        "kv": kv, **extra}, "plugin": p, "dsv4sel": d})
    plugin.uninstall()
    report["plugin"] = plugin_report
    # dsv4sel diff compat shipped, input by input: every change must be a deliberate fix, i.e. an
    # input where vLLM decides, the compat set agrees with it and the shipped rules do not
    if "compat" in sets:
        from dsv4sel.tools.diff import summarizer

        compat_at, shipped_at = summarizer(sets["compat"]), summarizer(sets["shipped"])

        verdict = {}
        for name in ("shipped", "compat"):
            for row in per_set[name]["disagree"]:
                i = row["input"]
                verdict[(name, i["model"], i["capability"], i["backend"], i["kv"],
                         *(i.get(n) for n in extra_names))] = False
        fixes = {"fixes": 0, "changed_where_vllm_decides_nothing": [], "changed_not_a_fix": []}
        for key in keys:
            model, platform, cap, backend, kv, *extra_values = key
            if compat_at(key)[0] == shipped_at(key)[0]:
                continue
            short = (model, cap, backend, kv, *extra_values)
            v = oracle.decide(model, platform, cap, backend, kv,
                              dict(zip(extra_names, extra_values)).get("mega_attn", "unavailable"),
                              _pcp(dict(zip(extra_names, extra_values))))
            if v["kind"] in ("refused", "undecided"):
                fixes["changed_where_vllm_decides_nothing"].append(short)
            elif verdict.get(("shipped", *short)) is False and verdict.get(("compat", *short)) is not False:
                fixes["fixes"] += 1
            else:
                fixes["changed_not_a_fix"].append(short)
        report["diff"] = fixes
    report["sets"] = per_set
    report["seconds"] = round(time.perf_counter() - t0, 1)
    text = json.dumps(report, indent=1, sort_keys=True)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    summary = {name: {"agree": s["agree"], "disagree": len(s["disagree"]),
                      "refused": s["refused"]["dsv4sel_rejects"] + len(s["refused"]["dsv4sel_selects"]),
                      "undecided": sum(s["undecided"].values()), "sizes_compared": s["sizes_compared"],
                      "sizes_not_compared": s["sizes_not_compared"]} for name, s in per_set.items()}
    print(json.dumps({"platform": args.platform, "inputs": len(keys), "vllm": report["vllm"],
                      "summary": summary,
                      "diff": {k: (v if isinstance(v, int) else len(v)) for k, v in report.get("diff", {}).items()},
                      "plugin": {k: (len(v) if k == "disagree" else v)
                                                     for k, v in plugin_report.items()},
                      "seconds": report["seconds"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
