"""What every vLLM release's compat generator shares: the release it speaks for, the shipped rule
files as editable tables, the rule shapes the reverted fixes take, and the rendering.

A vLLM compat set is the shipped rule set with each deliberate fix undone: every edit states, as
rules, what that vLLM release does where dsv4sel decides differently on purpose. Nothing else
changes (same vocabulary, same rule texts), so ``dsv4sel diff rules/compat/vllm-X rules`` lists
exactly the deliberate fixes, and the release's differential suite
(tests/hosts/vllm/v0_XX/) checks the compat set against vLLM's own code on every input where vLLM
decides. The fixes (docs/vllm.md): F1 an explicit backend that vLLM ignores; F2 a layer on a
capability, arch or platform where its kernels cannot run; F3 an fp8 string that vLLM stores as
e4m3 data; F4 a kv dtype that the layer's kernels cannot read; F5 a platform's default layer named
explicitly, which vLLM's AttentionConfig refuses.
"""
from __future__ import annotations

import copy
import os
import sys
from dataclasses import dataclass

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHIPPED = os.path.join(ROOT, "rules")
sys.path.insert(0, ROOT)

from dsv4sel.engine.hosts import version_matches  # noqa: E402

FP8 = ["fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "fp8_per_token_head"]  # startswith("fp8")
FP8_V4_PACKED = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head"]
FP8_ROWS_V41 = ["fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head"]
PACKED_V41 = ["fp8_ds_mla", "nvfp4_ds_mla"]
#: CUDA capabilities no DeepSeek-V4 kernel runs on
OLD_CUDA = ["7.x", "8.x", "11.0"]
V4_PACKED_ALL = FP8_V4_PACKED + ["fp8_ds_mla"]       # what V4.0's packed resolver selects
V41_PACKED_ALL = ["auto", "fp8", "fp8_ds_mla", "nvfp4_ds_mla"]  # what V4.1's packed resolver selects
# vLLM's V4.1 layers write V4.1's 528-byte record (fp8_ds_mla_v41) only on the SM100 family
# (deepseek_v41/attention.py: _use_v41_mxfp8_kv_record); on every other capability and platform
# they keep V4's 584-byte fp8_ds_mla record. Where the compat set builds a V4.1 packed class
# beyond SM100, that part of the rule selects this record.
V4_RECORD = {"layout": "fp8_ds_mla", "bytes_per_token": 584}


@dataclass(frozen=True)
class Release:
    """The vLLM release a compat set speaks for: ``version`` (0.33.0), ``name`` as descriptions
    say it (vLLM 0.33), ``tag`` that prefixes the ids of the rules the edits add (vllm033) and
    ``generator``, the command the files' header names."""

    version: str
    name: str
    tag: str
    generator: str


def use(rid, when, target, description=None):
    r = {"id": rid}
    if description:
        r["description"] = description
    r["when"] = when
    r["use"] = target
    return r


def v4_ignored(rel: Release, prefix, fix="F1", skip=()):
    """vLLM's V4.0 selection when it ignores the backend: its default class, for the kv dtypes
    that class's packed layout takes (for the others vLLM raises ValueError, and the shipped
    rule's rejection stays)."""
    d = f"{fix}: {rel.name}'s V4.0 selection ignores this backend and builds its default class."
    v4 = {"model": "deepseek_v4", "kv_cache_dtype": V4_PACKED_ALL}
    rules = [
        use(f"{prefix}-v4-cuda-sm12x", {**v4, "platform": "cuda", "capability": "12.x"},
            "FLASHINFER_MLA_SPARSE_DSV4", d),
        use(f"{prefix}-v4-cuda", {**v4, "platform": "cuda"}, "FLASHMLA_SPARSE_DSV4", d),
        use(f"{prefix}-v4-rocm", {**v4, "platform": "rocm"}, "ROCM_FLASHMLA_SPARSE_DSV4", d),
        use(f"{prefix}-v4-cpu", {**v4, "platform": "cpu"}, "CPU_V4_MLA_SPARSE", d),
        use(f"{prefix}-v4-xpu", {**v4, "platform": "xpu"}, "XPU_V4_MLA_SPARSE", d),
    ]
    return [r for r in rules if r["when"]["platform"] not in skip]


def v41_ignored(rel: Release, prefix, when=None):
    """vLLM's V4.1 NVIDIA selection (CUDA, CPU, XPU) when it ignores the backend. With prefill
    context parallelism vLLM raises NotImplementedError instead (it decides nothing), so those
    inputs keep the shipped rules' decision. ``when``: conditions every rule adds (a release
    whose default depends on another input)."""
    d = f"F1: {rel.name}'s V4.1 selection ignores this backend and builds its default class."
    off = {"model": "deepseek_v4_1", "prefill_context_parallel": "off", "kv_cache_dtype": V41_PACKED_ALL}
    mega = {"mega_attn": "available", **(when or {})}
    return [
        use(f"{prefix}-v41-cuda-sm12x", {**off, "platform": "cuda", "capability": "12.x"},
            "FLASHINFER_MLA_SPARSE_DSV41", d),
        use(f"{prefix}-v41-sm10x-mega", {**off, "platform": "cuda", "capability": "10.x", **mega},
            "FLASHMLA_MEGA_ATTN_DSV41", d),
        use(f"{prefix}-v41", {**off, "platform": {"not": "rocm"}}, "FLASHMLA_SPARSE_DSV41", d),
    ]


class Table:
    """One shipped rule file's rules, edited in place by id."""

    def __init__(self, rel: Release, data):
        self.rel = rel
        self.data = data
        self.rules = data["rules"]

    def index(self, rid):
        for i, r in enumerate(self.rules):
            if r["id"] == rid:
                return i
        raise KeyError(rid)

    def rule(self, rid):
        return self.rules[self.index(rid)]

    def replace(self, rid, new):
        i = self.index(rid)
        self.rules[i:i + 1] = new

    def remove(self, *rids):
        for rid in rids:
            del self.rules[self.index(rid)]

    def insert_before(self, rid, new):
        i = self.index(rid)
        self.rules[i:i] = new

    def insert_after(self, rid, new):
        i = self.index(rid) + 1
        self.rules[i:i] = new

    def v4_record_copy(self, rid, fix, what, new_id=None, select=None, **when):
        """After rule ``rid`` (kept where vLLM writes V4.1's record), a copy of it whose conditions
        are ``when`` applied to its own, selecting V4's record (plus ``select``): vLLM builds
        ``what`` there too, and off SM100 that class keeps V4's record."""
        r = copy.deepcopy(self.rule(rid))
        r["id"] = new_id or f"{self.rel.tag}-{rid}-v4-record"
        r["description"] = (f"{fix}: {self.rel.name} builds {what} here too; off SM100 it writes V4's 584-byte "
                            "record (fp8_ds_mla), not V4.1's.")
        r["when"] = _changed(r.get("when"), when)
        r["select"] = {**r.get("select", {}), **V4_RECORD, **(select or {})}
        self.insert_after(rid, [r])
        return r

    def when(self, rid, fix, **changes):
        """Change a rule's conditions (None drops one) and note the fix in its description."""
        r = self.rule(rid)
        r["when"] = _changed(r.get("when"), changes)
        note = f"{fix}: {self.rel.name} widens this rule."
        r["description"] = (r.get("description", "").rstrip() + " " + note).strip()


def _changed(when, changes):
    w = dict(when or {})
    for k, v in changes.items():
        if v is None:
            w.pop(k, None)
        else:
            w[k] = v
    return w


def for_release(rel: Release, data) -> None:
    """Keep, in every selection of a rule file (its ``defaults`` and each rule's ``select``), only
    the vLLM host entry for ``rel``: a compat set states one release. A ``block_size`` that entry's
    settings give (a release whose kernel block size differs) becomes the selection's own, so
    ``dsv4sel diff`` between two releases' compat sets shows it as what it is."""
    for owner, select in [("defaults", data.get("defaults")),
                          *((r["id"], r.get("select")) for r in data.get("rules", []))]:
        hosts = (select or {}).get("hosts") or {}
        if "vllm" not in hosts:
            continue
        entries = hosts["vllm"] if isinstance(hosts["vllm"], list) else [hosts["vllm"]]
        mine = [dict(e) for e in entries if version_matches(rel.version, e["versions"])]
        if len(mine) != 1:
            raise AssertionError(f"{owner}: {len(mine)} vLLM host entries for {rel.version}, not one")
        entry = mine[0]
        settings = dict(entry.pop("settings", None) or {})
        if "block_size" in settings:
            select["block_size"] = settings.pop("block_size")
        if settings:
            entry["settings"] = settings
        hosts["vllm"] = entry


def spec_584(rel: Release, rule, kv, rows):
    """vLLM's V4.0 FlashInfer layer given a packed kv string on SM10x (a vLLM bug, reproduced): it
    keeps the plain rows (``rows``) but its KV-cache spec is sized by the string, 584 bytes per
    token, so the selection disagrees with its layout; the rule acknowledges DSV408 with the reason."""
    r = copy.deepcopy(rule)
    r["id"] = f"{rel.tag}-{rule['id']}-{kv.replace('_', '-')}-spec-584"
    r["description"] = (f"F4: {rel.name} accepts {kv} on FlashInfer's SM10x layer: it writes {rows} rows "
                        "but sizes its KV-cache spec by the string, 584 B/token.")
    r["when"] = {**r["when"], "kv_cache_dtype": kv}
    row_bytes = r["select"]["bytes_per_token"]
    r["select"] = {**r["select"], "bytes_per_token": 584}
    r["acknowledge"] = {"DSV408": f"{rel.name} sizes this cache at 584 B/token while the layer writes {rows} rows "
                                  f"of {row_bytes:,} B: reproduced, not endorsed (the shipped rules reject it, F4)"}
    return r


def msa_table(rel: Release, defaults: list[dict], aliases: list[str]) -> dict:
    """CUTLASS_MSA / TRITON_MSA: vLLM's AttentionConfig erases them to no backend, so the default
    decision (``defaults``: the compat default rules, in order) decides them."""
    rules = []
    for r in defaults:
        r = copy.deepcopy(r)
        r.pop("override", None)
        r["id"] = f"{rel.tag}-msa-" + r["id"]
        r["description"] = (f"F1: {rel.name}'s AttentionConfig turns this MiniMax alias into no backend, so the "
                            "DeepSeek-V4 code builds its default: " + r.get("description", "").strip())
        rules.append(r)
    return {"kind": "backend", "backends": aliases, "hit_policy": "first", "rules": rules}


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


#: The editor's schema modeline, as every shipped rule file's first line: the path from rules/compat/vllm-X/.
MODELINE = "# yaml-language-server: $schema=../../../dsv4sel/schema/rules.schema.json\n"


def render(rel: Release, name, data) -> str:
    head = (f"{MODELINE}# GENERATED by {rel.generator} from rules/{name}: vLLM {rel.version}'s decisions,\n"
            "# the deliberate fixes (F1-F6, docs/vllm.md) reverted. Do not edit; edit the generator.\n")
    return head + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def with_modeline(text: str) -> str:
    """A shipped file's text copied here, its modeline's path made to resolve from here."""
    first, _, rest = text.partition("\n")
    return MODELINE + (rest if first.startswith("# yaml-language-server:") else text)


def shipped_files():
    """``(name, text, data)`` for every shipped rule file, in name order."""
    for name in sorted(os.listdir(SHIPPED)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(SHIPPED, name)) as fh:
            text = fh.read()
        yield name, text, yaml.safe_load(text)
