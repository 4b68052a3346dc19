#!/usr/bin/env python3
"""Write docs/vllm-X-fixes.md: `dsv4sel diff rules/compat/vllm-X rules` as cubes, per deliberate fix.

    python3 tools/vllm_fix_cubes.py --version 0.34.0 [--check]   # docs/vllm-0.34-fixes.md
    python3 tools/vllm_fix_cubes.py --all [--check]              # every vLLM release's

Every input whose outcome differs between a vLLM release's compat set (its own decisions) and the
shipped rules is assigned the fix that the compat rule deciding it names (F1-F6 in its
description, written by that release's module in tools/compat/), then each fix's inputs are
merged into cubes as `dsv4sel diff` prints them. `--check` changes nothing and exits 1 when the
doc is stale.
"""
from __future__ import annotations

import argparse
import functools
import os
import re
import sys
from dataclasses import dataclass

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import dsv4sel  # noqa: E402
from dsv4sel.cli.render.diff import outcome  # noqa: E402
from dsv4sel.engine.hosts import version_matches  # noqa: E402
from dsv4sel.tools.diff import Outcome, cubes, summarizer  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tools", "compat"))
from compat import RELEASES  # noqa: E402

#: The deliberate fixes, as the doc's sections title them (``{vllm}``: the release, "vLLM 0.34").
FIXES = {
    "F1": "an explicit `--attention-backend` is never silently ignored ({vllm} builds its default class)",
    "F2": "no layer on a capability, ROCm arch or platform where its kernels cannot run ({vllm} builds it)",
    "F3": "no silent e4m3 for fp8_e5m2, fp8_inc, fp8_per_token_head ({vllm} stores them as e4m3 data)",
    "F4": "no kv-cache dtype the layer's kernels cannot read ({vllm} accepts it as bf16/e4m3 rows or keeps "
          "nvfp4_ds_mla off mega-attention)",
    "F5": "a platform's default layer may also be named (`--attention-backend CPU_V4_MLA_SPARSE` / "
          "`XPU_V4_MLA_SPARSE`; {vllm}'s AttentionConfig refuses these names, though it builds the class)",
    "F6": "LoRA adapters never meet mega-attention's fused kernel ({vllm} builds mega-attention with LoRA "
          "on, where an adapter on wo_a would not apply)",
}


@dataclass(frozen=True)
class Target:
    """One vLLM release's doc: the release (0.34.0), its compat set and the doc's path."""

    version: str

    @property
    def minor(self) -> str:
        return ".".join(self.version.split(".")[:2])

    @property
    def compat(self) -> str:
        return os.path.join(ROOT, "rules", *RELEASES[("vllm", self.version)][1].split("/"))

    @property
    def doc(self) -> str:
        return os.path.join(ROOT, "docs", f"vllm-{self.minor}-fixes.md")

    @property
    def test(self) -> str:
        return f"tests/hosts/vllm/v{self.minor.replace('.', '_')}/test_compat.py"


VERSIONS = tuple(v for host, v in sorted(RELEASES) if host == "vllm")
TAG = re.compile(r"\bF([1-6])\b")


def rule_tags(compat_dir: str) -> dict[str, tuple[str, ...]]:
    tags = {}
    for name in os.listdir(compat_dir):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(compat_dir, name)) as fh:
            data = yaml.safe_load(fh)
        # a backend file's requested_by_name: is a rule too (it decides the queries naming it)
        for rule in [*data.get("rules", []), *filter(None, [data.get("requested_by_name")])]:
            found = TAG.findall(rule.get("description", "") or "")
            if found:
                tags[rule["id"]] = tuple(f"F{n}" for n in found)
    return tags


E4M3_ALIASES = {"fp8_e5m2", "fp8_inc", "fp8_per_token_head"}
PLAIN = {"auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_ds_mla"}


def _fix(named: set[str], kv: str, before, shipped_serves, lora_alone) -> str:
    """The fix one changed input belongs to: F5 or F1 when the compat path goes through a rule
    naming it (a default layer named, a backend vLLM ignores); F6 when only LoRA makes the
    difference (``lora_alone()``); else F2 when the shipped rules select nothing there for any kv
    dtype; else F3 for the e4m3 aliases; else F4."""
    for tag in ("F5", "F1"):
        if tag in named:
            return tag
    if lora_alone():
        return "F6"
    if not shipped_serves():
        return "F2"
    if kv in E4M3_ALIASES:
        return "F3"
    if kv not in PLAIN or (before.kind == "select" and before.layout.endswith("_row") and kv == "fp8_ds_mla"):
        return "F4"  # fp8_ds_mla on a plain-row layer: vLLM's own validator rejects it
    return "other"


def as_release(rules, version: str):
    """``summarizer(rules)`` as vLLM ``version`` meets the rules: a selection names only that
    release's vLLM class, with the block size its host entry sets (a compat set states one release
    already; the shipped rules name a class per release)."""
    at = summarizer(rules)
    memo: dict[int | None, tuple] = {}  # per outcome row, as summarizer's: a view depends on the row alone

    def view(key):
        i = rules.index(key)
        seen = memo.get(i)
        if seen is None:
            seen = memo[i] = _as_release(rules, version, key, *at(key))
        return seen

    return view


def _as_release(rules, version: str, key, found, group):
    if found.kind != "select":
        return found, group
    raw = rules.row(key)
    hosts = tuple(h for h in raw.hosts if h[0] != "vllm" or version_matches(version, h[2]))
    block = next((dict(pairs)["block_size"] for host, versions, pairs in raw.host_settings
                  if host == "vllm" and version_matches(version, versions) and "block_size" in dict(pairs)),
                 found.row.block_size)
    seen = Outcome(found.row._replace(hosts=hosts, block_size=block))
    return seen, (seen,)


def categorize(compat, shipped, tags, version: str):
    """Group the changed inputs, ``shipped`` as release ``version`` meets it, by fix (:func:`_fix`)."""
    names = compat.key_inputs
    kv_at = names.index("kv_cache_dtype")
    domains = [dict() for _ in names]
    keys = list(compat.keys())
    for key in keys:
        for d, v in zip(domains, key):
            d.setdefault(v, len(d))
    kvs = list(domains[kv_at])
    serves: dict[tuple, bool] = {}

    def shipped_serves(key):
        head = key[:kv_at] + key[kv_at + 1:]
        if head not in serves:
            serves[head] = any(shipped.row(key[:kv_at] + (kv,) + key[kv_at + 1:]).kind == "select"
                               for kv in kvs)
        return serves[head]

    compat_at, shipped_at = as_release(compat, version), as_release(shipped, version)
    lora_at = names.index("lora") if "lora" in names else None

    def lora_alone(key):
        """With LoRA on, the shipped rules decide otherwise than with it off, vLLM does not, and
        with it off the two agree: LoRA alone makes this input differ."""
        if lora_at is None or key[lora_at] != "on":
            return False
        off = key[:lora_at] + ("off",) + key[lora_at + 1:]
        return (compat_at(off)[0] == shipped_at(off)[0]
                and compat_at(key)[0] == compat_at(off)[0] and shipped_at(key)[0] != shipped_at(off)[0])

    groups: dict[tuple, list] = {}
    examples: dict[tuple, tuple] = {}
    for key in keys:
        (before, group_before), (after, group_after) = compat_at(key), shipped_at(key)
        if before == after:
            continue
        named = {tag for i in compat.row(key).path for tag in tags.get(compat.rule(i).id, ())}
        fix = _fix(named, key[kv_at], before, functools.partial(shipped_serves, key),
                   functools.partial(lora_alone, key))
        box = tuple(1 << d[v] for d, v in zip(domains, key))
        group = (fix, group_before, group_after)
        groups.setdefault(group, []).append(box)
        examples.setdefault(group, (before, after))
    return names, [list(d) for d in domains], groups, examples


def render(target: Target) -> str:
    compat = dsv4sel.load_rules(paths=[target.compat])
    shipped = dsv4sel.default_rules()
    names, domains, groups, examples = categorize(compat, shipped, rule_tags(target.compat), target.version)
    total = sum(len(b) for b in groups.values())
    vllm = f"vLLM {target.minor}"
    out = [f"<!-- Generated by `python3 tools/vllm_fix_cubes.py --version {target.version}` (make docs); do not edit.",
           f"     Checked in make test ({target.test}). -->", "",
           f"# Where dsv4sel differs from {vllm}, as cubes", "",
           f"`dsv4sel diff rules/compat/vllm-{target.minor} rules`: every input whose outcome differs between the "
           f"compat rule set (vLLM {target.version}'s own decisions) and the shipped rules, grouped by the deliberate "
           f"fix the deciding compat rule names. `old` is {vllm} (the compat set), `new` is dsv4sel. "
           f"{total} of {compat.size} inputs differ. "
           "Why each fix, and the differential counts: [vllm.md](vllm.md).", ""]
    by_fix: dict[str, list] = {}
    for (fix, gb, ga), boxes in groups.items():
        before, after = examples[(fix, gb, ga)]
        by_fix.setdefault(fix, []).append((before, after, boxes))
    for fix in sorted(by_fix):
        items = by_fix[fix]
        n = sum(len(b) for _, _, b in items)
        title = FIXES.get(fix, "not a deliberate fix (a bug in the compat set or the shipped rules)").format(
            vllm=vllm)
        out += [f"## {fix}: {title}", "", f"{n} inputs, {len(items)} groups.", "", "```text"]
        for before, after, boxes in sorted(items, key=lambda x: -len(x[2])):
            out.append(f"{len(boxes)} inputs:")
            out += ["  " + cube for cube in cubes(names, domains, boxes)]
            out.append(f"  {vllm}: " + outcome(before).replace("\n", "\n" + " " * 13))
            out.append("  dsv4sel:   " + outcome(after).replace("\n", "\n" + " " * 13))
            if len(boxes) > 1 and (before.kind == "reject" or after.kind == "reject" or "{" in str(before)):
                out.append("  (e.g.; texts and dtypes follow each input)")
            out.append("")
        out[-1:] = ["```", ""]
    return "\n".join(out)


def write(target: Target, check: bool) -> int:
    text = render(target)
    if check:
        old = open(target.doc).read() if os.path.exists(target.doc) else None
        if old != text:
            print(f"{os.path.relpath(target.doc, ROOT)} is stale: run python3 tools/vllm_fix_cubes.py --version "
                  f"{target.version}", file=sys.stderr)
            return 1
        return 0
    with open(target.doc, "w") as fh:
        fh.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--version", choices=VERSIONS, help="the vLLM release whose doc to write")
    which.add_argument("--all", action="store_true", help="every vLLM release tools/compat/ knows")
    ap.add_argument("--check", action="store_true", help="change nothing; exit 1 when the doc is stale")
    args = ap.parse_args(argv)
    versions = VERSIONS if args.all else (args.version,)
    return max(write(Target(v), args.check) for v in versions)


if __name__ == "__main__":
    raise SystemExit(main())
