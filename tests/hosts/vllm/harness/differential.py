"""Whole-space differential: a vLLM release's own decisions, layers built for real, against dsv4sel rule sets.

    VENV/bin/python tests/hosts/vllm/harness/differential.py PLATFORM [--model M] [--rules NAME=DIR ...] [--out FILE]

Enumerates every input of the shipped rules' decision space on PLATFORM (each model, or only
``--model``; each capability, backend choice, kv-cache dtype and pack input), asks vLLM
(:mod:`oracle`: its config classes, its selection function, then the chosen layer built for real
by :mod:`layers`) and each rule set, and writes a JSON report: per rule set, how many inputs
agree or disagree where vLLM decides, how many vLLM leaves undecided (an assert or
NotImplementedError), and every disagreement. A selection agrees when the built layer's class,
cache dtype, torch dtype, cache-config rewrite, KV-cache spec bytes per token and the platform's
block size are the rule's; a rejection agrees with a rejection (a config class refusing the
value, or a ValueError from the selection function or the layer's ``__init__``).

Then the same inputs go through vLLM with the plugin installed: the plugin's decision when vLLM
validates its config (``decide_config``, what the patched ``check_and_update_config`` runs),
vLLM's own call path through the patched selection function, and the layer built for real with
the patched resolver. Run in a fresh process per platform: vLLM fixes its platform on first
import.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import layers
import oracle
import stubs

SELECT_KEYS = ("class", "cache_dtype", "torch_dtype", "cache_config", "bytes_per_token", "block_size")
#: The installed vLLM release: a rule set's host entry for it says the class and any setting.
VERSION = importlib.metadata.version("vllm")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))


def _pcp(extra: dict) -> int:
    """vLLM's prefill_context_parallel_size for the rules' input."""
    return 2 if extra.get("prefill_context_parallel") == "on" else 1


def _lora(extra: dict) -> str:
    """LoRA on or off for the rules' input (a rule set without the input: off, vLLM's default)."""
    return extra.get("lora", "off")


#: (rule set, compiled row, kv-cache dtype asked) -> the outcome dict (see dsv4sel_outcome)
_OUTCOMES: dict[tuple, dict] = {}


def dsv4sel_outcome(rules, model, platform, capability, backend, kv, extra, key: tuple | None = None) -> dict:
    """The rule set's outcome, from ``RuleSet.outcome`` (what ``select()`` returns or raises,
    without building the rejection's message: its nearest-alternative search costs milliseconds
    and is not compared here). The dict is a function of the compiled row and the kv-cache dtype
    asked alone, so with ``key`` (the input's key in the rules' own key order) a row already
    turned into one through ``normalize`` and ``outcome`` is looked up by the row's index."""
    at = rules.index(key) if key is not None else None
    if at is not None:
        memo = (id(rules), at, kv)
        if memo not in _OUTCOMES:
            _OUTCOMES[memo] = _outcome(rules, model, platform, capability, backend, kv, extra)
        return _OUTCOMES[memo]
    return _outcome(rules, model, platform, capability, backend, kv, extra)


def _outcome(rules, model, platform, capability, backend, kv, extra) -> dict:
    from dsv4sel.dsv4.selection import Selection

    query, notes = rules.normalize(platform=platform, capability=capability, backend=backend,
                                   kv_cache_dtype=kv, model=model, extra=extra)
    sel = rules.outcome(query, notes)
    if sel.__class__ is not Selection:
        return {"kind": "reject", "rule": sel.rule.location if sel.rule else None}
    host = sel.host_class("vllm", VERSION)
    block = sel.settings_for("vllm", VERSION).get("block_size", sel.block_size)
    return {"kind": "select", "class": host[0] if host else None, "cache_dtype": sel.cache_dtype,
            "torch_dtype": sel.torch_dtype_name, "cache_config": sel.rewrites.get("cache_dtype", kv),
            "bytes_per_token": sel.bytes_per_token, "block_size": block, "layout": sel.layout,
            "rule": sel.rule.location, "identity": (sel.cache_dtype, sel.torch_dtype_name,
                                                    tuple(sorted(sel.rewrites.items())), sel.rule.location)}


def _same_selection(v: dict, d: dict) -> bool:
    return d["kind"] == "select" and v["kind"] == "select" and all(v[k] == d[k] for k in SELECT_KEYS)


def agrees(v: dict, d: dict) -> bool:
    if v["kind"] == "reject":
        return d["kind"] == "reject"
    if v["kind"] == "select":
        return _same_selection(v, d)
    raise ValueError(v["kind"])


def plugin_outcome(plugin, model, platform, capability, backend, kv, extra, d) -> dict:
    """What vLLM does with the dsv4sel plugin installed (``d``: the shipped rules' outcome, which
    keys the layer memo: the patched resolver returns that Selection's dtypes)."""
    import vllm.config.vllm as config_module

    from dsv4sel import SelectionError

    stubs.set_device(capability, platform)
    mega, fi = extra.get("mega_attn") == "available", extra.get("flashinfer_sm120", "available") == "available"
    oracle._MEGA["available"] = mega
    stubs.set_flashinfer_sm120(fi)
    try:
        cfg = oracle.vllm_config(backend, kv, pcp=_pcp(extra), model=model, lora=_lora(extra))
    except Exception:  # noqa: BLE001 - any refusal of vLLM's config classes
        return {"kind": "refused"}  # vLLM's config refused the value: dsv4sel is never asked
    config_module._current_vllm_config = cfg
    try:
        plugin.decide_config(cfg)  # the config-time decision: rejections come here, before any layer
        cls = oracle._layer_class(model, platform, cfg)
    except SelectionError as exc:
        return {"kind": "reject", "untouched": cfg.cache_config.cache_dtype == kv, "at": "config",
                "message": str(exc).splitlines()[0][:160]}
    except Exception as exc:  # noqa: BLE001 - any other failure is recorded as the outcome
        if _pcp(extra) > 1 and isinstance(exc, NotImplementedError):
            return {"kind": "undecided"}  # vLLM itself refuses before dsv4sel is asked
        return {"kind": "error", "error": type(exc).__name__, "message": str(exc)[:160]}
    finally:
        config_module._current_vllm_config = None
    # the patched resolver decides again while the layer is built, from the layer's own config: it
    # carries the input's LoRA, and the build is kept apart per LoRA value
    built = layers.build(cls, platform, capability, backend, kv, mega, fi, _pcp(extra), lora=_lora(extra),
                         key_extra=("plugin", d.get("identity"), _lora(extra)))
    if built["kind"] == "dsv4sel_reject":
        return {**built, "kind": "reject", "at": "layer"}
    return built


def plugin_agrees(p: dict, d: dict) -> bool:
    if p["kind"] == "refused":
        return True
    if d["kind"] == "reject":
        return p["kind"] == "reject" and p["untouched"] and p["at"] == "config"
    return _same_selection(p, d)


def _row(model, cap, backend, kv, extra):
    return {"model": model, "capability": cap, "backend": backend, "kv": kv, **extra}


def _inputs(space, platform: str, model: str | None):
    """Every input of ``space`` on ``platform`` (and ``model``): (key, model, cap, backend, kv, extra)."""
    extra_names = tuple(space.extra_inputs)
    keys = sorted((k for k in space._table if k[1] == platform and model in (None, k[0])),
                  key=lambda k: tuple("" if x is None else x for x in k))
    for key in keys:
        m, _platform, cap, backend, kv, *extra_values = key
        yield key, m, cap, backend, kv, dict(zip(extra_names, extra_values))


def _vllm_says(v: dict) -> tuple:
    """What vLLM decided, as compared across inputs: the class its selection chose, the outcome's
    kind and, for a built layer, its fields."""
    return (v.get("chose"), v["kind"], *(v.get(k) for k in SELECT_KEYS))


def lora_effect(outcomes: dict, extra_names: tuple) -> dict:
    """Where vLLM's own decision changes with LoRA alone: every input with ``lora=on`` against the
    same input with ``lora=off`` (``outcomes``: key -> vLLM's outcome). ``pairs`` compared,
    ``differ`` and the first differences, LoRA off then on."""
    if "lora" not in extra_names:
        return {"pairs": 0, "differ": 0, "changes": []}
    at = 5 + extra_names.index("lora")
    pairs, changes = 0, []
    for key, on in outcomes.items():
        if key[at] != "on":
            continue
        off = outcomes.get((*key[:at], "off", *key[at + 1:]))
        if off is None:
            continue
        pairs += 1
        if _vllm_says(on) != _vllm_says(off):
            changes.append({"input": list(key), "lora_off": off, "lora_on": on})
    return {"pairs": pairs, "differ": len(changes), "changes": changes}


def _without_identity(d: dict) -> dict:
    return {k: v for k, v in d.items() if k != "identity"}


def vllm_pass(sets: dict, platform: str, inputs: list, report: dict, shipped_seen: dict) -> tuple[dict, dict]:
    """vLLM's own decision on every input against each rule set: ``(per_set, verdict)``, where
    ``verdict[(set, key)]`` is True / False (agrees or not) or None (vLLM decides nothing).
    Records in ``report["lora"]`` where LoRA alone changes vLLM's decision (:func:`lora_effect`),
    and in ``shipped_seen`` the shipped rules' outcome of each input it asked them about."""
    per_set = {name: {"agree": 0, "disagree": [], "undecided": {}} for name in sets}
    # an input's key indexes a rule set that orders its inputs as the shipped rules do
    same_key = {name: rules.key_inputs == sets["shipped"].key_inputs for name, rules in sets.items()}
    verdict: dict = {}
    outcomes: dict = {}
    for key, model, cap, backend, kv, extra in inputs:
        v = oracle.decide(model, platform, cap, backend, kv, extra.get("mega_attn", "unavailable"), _pcp(extra),
                          extra.get("flashinfer_sm120", "available"), _lora(extra))
        if "lora" in extra:
            outcomes[key] = v
        label = v["kind"] + ("" if v["kind"] != "reject" else f"_at_{v['at']}")
        report["vllm"][label] = report["vllm"].get(label, 0) + 1
        for name, rules in sets.items():
            slot = per_set[name]
            if v["kind"] == "undecided":
                slot["undecided"][v["error"]] = slot["undecided"].get(v["error"], 0) + 1
                verdict[(name, key)] = None
                continue
            d = dsv4sel_outcome(rules, model, platform, cap, backend, kv, extra, key if same_key[name] else None)
            if name == "shipped":
                shipped_seen[key] = d
            ok = verdict[(name, key)] = agrees(v, d)
            if ok:
                slot["agree"] += 1
            else:
                slot["disagree"].append({"input": _row(model, cap, backend, kv, extra), "vllm": v,
                                         "dsv4sel": _without_identity(d)})
    report["lora"] = lora_effect(outcomes, tuple(sets["shipped"].extra_inputs))
    return per_set, verdict


def plugin_pass(shipped, platform: str, inputs: list, shipped_seen: dict) -> dict:
    """The same inputs through vLLM with the plugin installed (shipped rules; ``shipped_seen``: their
    outcomes the vLLM pass already asked for). A plugin that refuses this vLLM (its PluginError) is
    the report's ``refused_install``: nothing else was asked."""
    # The plugin raises the rules' SelectionError; its "Would work:" suggestions come from dsv4sel's
    # nearest-alternative search (2-3 ms per rejection, tested on its own in tests/tools/test_explain.py).
    # Here only where and how the plugin rejects is compared, so the search is left out.
    import dsv4sel.vllm_plugin as plugin
    from dsv4sel.dsv4 import alternatives

    alternatives.nearest = lambda rules, query, limit=alternatives.LIMIT: ()
    try:
        replaced = plugin.install(shipped)
    except plugin.PluginError as exc:
        return {"refused_install": str(exc), "replaced": [], "disagree": []}
    oracle.clear_configs()  # AttentionConfig objects built from now on pass the patched __post_init__
    out = {"replaced": [f"{m}.{a}" for m, a in replaced], "agree": 0, "refused": 0, "selects": 0, "rejects": 0,
           "disagree": []}
    for key, model, cap, backend, kv, extra in inputs:
        d = shipped_seen.get(key) or dsv4sel_outcome(shipped, model, platform, cap, backend, kv, extra, key)
        p = plugin_outcome(plugin, model, platform, cap, backend, kv, extra, d)
        if p["kind"] == "refused":
            out["refused"] += 1
        elif p["kind"] == "undecided":
            out["vllm_raises_first"] = out.get("vllm_raises_first", 0) + 1
        elif plugin_agrees(p, d):
            out["agree"] += 1
            out["selects" if p["kind"] == "select" else "rejects"] += 1
        else:
            out["disagree"].append({"input": _row(model, cap, backend, kv, extra), "plugin": p,
                                    "dsv4sel": _without_identity(d)})
    plugin.uninstall()
    return out


def diff_pass(sets: dict, inputs: list, verdict: dict) -> dict:
    """``dsv4sel diff compat shipped``, input by input, the shipped rules as this release meets
    them (tools/vllm_fix_cubes.py's view, the one docs/vllm-X-fixes.md lists): every change must be
    a deliberate fix, i.e. an input where vLLM decides, the compat set agrees with it and the
    shipped rules do not."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from vllm_fix_cubes import as_release

    compat_at, shipped_at = as_release(sets["compat"], VERSION), as_release(sets["shipped"], VERSION)
    fixes: dict = {"fixes": 0, "changed_where_vllm_decides_nothing": [], "changed_not_a_fix": []}
    for key, *_ in inputs:
        if compat_at(key)[0] == shipped_at(key)[0]:
            continue
        short = (key[0], *key[2:])
        shipped_ok, compat_ok = verdict[("shipped", key)], verdict[("compat", key)]
        if shipped_ok is None:
            fixes["changed_where_vllm_decides_nothing"].append(short)
        elif shipped_ok is False and compat_ok is True:
            fixes["fixes"] += 1
        elif shipped_ok and compat_ok:
            # both reject, as vLLM does, by another rule (a MiniMax alias rejected as not a
            # DeepSeek-V4 backend, where vLLM's default then refuses the kv dtype)
            fixes["same_outcome_other_rule"] = fixes.get("same_outcome_other_rule", 0) + 1
        else:
            fixes["changed_not_a_fix"].append(short)
    return fixes


def _summary(report: dict) -> dict:
    return {"platform": report["platform"], "model": report["model"], "inputs": report["inputs"],
            "vllm": report["vllm"],
            "summary": {n: {"agree": s["agree"], "disagree": len(s["disagree"]),
                            "undecided": sum(s["undecided"].values())} for n, s in report["sets"].items()},
            "layers": [report["layers_built"], report["layers_built_with_plugin"]],
            "diff": {k: (v if isinstance(v, int) else len(v)) for k, v in report.get("diff", {}).items()},
            "plugin": {k: (len(v) if k == "disagree" else v) for k, v in report["plugin"].items() if k != "replaced"},
            "lora": {k: v for k, v in report["lora"].items() if k != "changes"},
            "seconds": report["seconds"]}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("platform")
    ap.add_argument("--model", help="only this model's inputs (default: every model)")
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
    inputs = list(_inputs(sets["shipped"], args.platform, args.model))
    report: dict = {"platform": args.platform, "model": args.model, "inputs": len(inputs), "vllm": {}}
    shipped_seen: dict = {}
    report["sets"], verdict = vllm_pass(sets, args.platform, inputs, report, shipped_seen)
    report["layers_built"] = layers.builds()
    report["plugin"] = plugin_pass(sets["shipped"], args.platform, inputs, shipped_seen)
    report["layers_built_with_plugin"] = layers.builds() - report["layers_built"]
    if "compat" in sets:
        report["diff"] = diff_pass(sets, inputs, verdict)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if args.out:
        with open(args.out, "w") as fh:
            # compact: a platform's report holds every disagreement of the shipped rules (tens of MB
            # on CUDA); `python -m json.tool FILE` shows it indented
            fh.write(json.dumps(report, separators=(",", ":")) + "\n")
    print(json.dumps(_summary(report)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
