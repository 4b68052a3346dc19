#!/usr/bin/env python3
"""Generate rules/compat/vllm-0.33/ from the shipped rules: vLLM 0.33.0's decisions, fixes reverted.

The compat set is the shipped rule set with each deliberate fix undone: every edit below
states, as rules, what vLLM 0.33 does where dsv4sel decides differently on purpose. Nothing
else changes (same vocabulary, same rule texts), so ``dsv4sel diff rules/compat/vllm-0.33 rules``
lists exactly the deliberate fixes, and the differential suite (tests/hosts/vllm/test_vllm33.py) checks
the compat set against vLLM's own selection code on every input where vLLM decides.

    python3 tools/gen_compat_vllm033.py          # rewrite rules/compat/vllm-0.33/
    python3 tools/gen_compat_vllm033.py --check  # exit 1 when the committed files are stale

Each edit names the fix it reverts (docs/vllm.md lists them): F1 an explicit backend that vLLM
ignores; F2 a layer on a capability, arch or platform where its kernels cannot run; F3 an fp8
string that vLLM stores as e4m3 data; F4 a kv dtype that the layer's kernels cannot read; F5 a
platform's default layer named explicitly, which vLLM's AttentionConfig refuses.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHIPPED = os.path.join(ROOT, "rules")
OUT = os.path.join(SHIPPED, "compat", "vllm-0.33")

FP8 = ["fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla", "fp8_per_token_head"]  # startswith("fp8")
# kv dtypes vLLM 0.33's CacheConfig refuses (it decides nothing for them): kept as shipped
REFUSED_KV = ["int8"]
# backend names vLLM 0.33's AttentionConfig refuses: kept as shipped
# backend names vLLM 0.33's AttentionConfig refuses (TREE_ATTN, XFORMERS) or turns into "no backend"
# (CUTLASS_MSA, TRITON_MSA select MiniMax's MSA decode kernel): the DeepSeek-V4 code never sees
# them, so vLLM decides nothing for them; kept as shipped
REFUSED_BACKENDS = ["TREE_ATTN", "XFORMERS"]
# MiniMax's MSA decode aliases: vLLM 0.33's AttentionConfig turns them into "no backend", so the
# DeepSeek-V4 code builds its default class: the compat set decides them as the default decision
MSA_ALIASES = ["CUTLASS_MSA", "TRITON_MSA"]
FP8_V4_PACKED = ["auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head"]
FP8_ROWS_V41 = ["fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head"]
PACKED_V41 = ["fp8_ds_mla", "nvfp4_ds_mla"]
OLD_CUDA = ["7.x", "8.x", "11.0"]
V4_PACKED_ALL = FP8_V4_PACKED + ["fp8_ds_mla"]       # what V4.0's packed resolver selects
V41_PACKED_ALL = ["auto", "fp8", "fp8_ds_mla", "nvfp4_ds_mla"]  # what V4.1's packed resolver selects  # CUDA capabilities no DeepSeek-V4 kernel runs on
# vLLM 0.33's V4.1 layers write V4.1's 528-byte record (fp8_ds_mla_v41) only on the SM100 family
# (deepseek_v41/attention.py: _use_v41_mxfp8_kv_record); on every other capability and platform
# they keep V4's 584-byte fp8_ds_mla record. Where the compat set builds a V4.1 packed class
# beyond SM100, that part of the rule selects this record (the kernel block size stays the
# backend's: FlashMLA-V4.1 64 on SM90 only, FlashInfer and mega-attention 128).
V4_RECORD = {"layout": "fp8_ds_mla", "bytes_per_token": 584}


def use(rid, when, target, description=None):
    r = {"id": rid}
    if description:
        r["description"] = description
    r["when"] = when
    r["use"] = target
    return r


def v4_ignored(prefix, fix="F1", skip=()):
    """vLLM 0.33's V4.0 selection when it ignores the backend: its default class, for the kv
    dtypes that class's packed layout takes (for the others vLLM raises ValueError, and the
    shipped rule's rejection stays)."""
    d = f"{fix}: vLLM 0.33's V4.0 selection ignores this backend and builds its default class."
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


def v41_ignored(prefix):
    """vLLM 0.33's V4.1 NVIDIA selection (CUDA, CPU, XPU) when it ignores the backend. With
    prefill context parallelism vLLM raises NotImplementedError instead (it decides nothing),
    so those inputs keep the shipped rules' decision."""
    d = "F1: vLLM 0.33's V4.1 selection ignores this backend and builds its default class."
    off = {"model": "deepseek_v4_1", "prefill_context_parallel": "off", "kv_cache_dtype": V41_PACKED_ALL}
    return [
        use(f"{prefix}-v41-cuda-sm12x", {**off, "platform": "cuda", "capability": "12.x"},
            "FLASHINFER_MLA_SPARSE_DSV41", d),
        use(f"{prefix}-v41-sm10x-mega", {**off, "platform": "cuda", "capability": "10.x", "mega_attn": "available"},
            "FLASHMLA_MEGA_ATTN_DSV41", d),
        use(f"{prefix}-v41", {**off, "platform": {"not": "rocm"}}, "FLASHMLA_SPARSE_DSV41", d),
    ]


class Table:
    def __init__(self, data):
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
        are ``when`` applied to its own, selecting V4's record (plus ``select``): vLLM 0.33 builds
        ``what`` there too, and off SM100 that class keeps V4's record."""
        r = copy.deepcopy(self.rule(rid))
        r["id"] = new_id or f"vllm033-{rid}-v4-record"
        r["description"] = (f"{fix}: vLLM 0.33 builds {what} here too; off SM100 it writes V4's 584-byte "
                            "record (fp8_ds_mla), not V4.1's.")
        w = dict(r.get("when") or {})
        for k, v in when.items():
            if v is None:
                w.pop(k, None)
            else:
                w[k] = v
        r["when"] = w
        r["select"] = {**r.get("select", {}), **V4_RECORD, **(select or {})}
        self.insert_after(rid, [r])
        return r

    def when(self, rid, fix, **changes):
        """Change a rule's conditions (None drops one) and note the fix in its description."""
        r = self.rule(rid)
        w = dict(r.get("when") or {})
        for k, v in changes.items():
            if v is None:
                w.pop(k, None)
            else:
                w[k] = v
        r["when"] = w
        note = f"{fix}: vLLM 0.33 widens this rule."
        r["description"] = (r.get("description", "").rstrip() + " " + note).strip()


def _spec_584(rule, kv, rows):
    """vLLM 0.33's V4.0 FlashInfer layer given a packed kv string on SM10x (a vLLM bug, reproduced):
    it keeps the plain rows (``rows``) but its KV-cache spec is sized by the string, 584 bytes per
    token, so the selection disagrees with its layout; the rule acknowledges DSV408 with the reason."""
    r = copy.deepcopy(rule)
    r["id"] = f"vllm033-{rule['id']}-{kv.replace('_', '-')}-spec-584"
    r["description"] = (f"F4: vLLM 0.33 accepts {kv} on FlashInfer's SM10x layer: it writes {rows} rows "
                        "but sizes its KV-cache spec by the string, 584 B/token.")
    r["when"] = {**r["when"], "kv_cache_dtype": kv}
    row_bytes = r["select"]["bytes_per_token"]
    r["select"] = {**r["select"], "bytes_per_token": 584}
    r["acknowledge"] = {"DSV408": f"vLLM 0.33 sizes this cache at 584 B/token while the layer writes {rows} rows "
                                  f"of {row_bytes:,} B: reproduced, not endorsed (the shipped rules reject it, F4)"}
    return r


def edit(name, t: Table):
    if name == "defaults.yaml":
        t.insert_before("default-cuda-unsupported", [use(
            "vllm033-default-cuda-any-capability",
            {"model": "deepseek_v4", "platform": "cuda", "capability": OLD_CUDA, "kv_cache_dtype": V4_PACKED_ALL},
            "FLASHMLA_SPARSE_DSV4", "F2: vLLM 0.33 builds FlashMLA on every CUDA capability that is not 12.x.")])
    elif name == "deepseek_v4_1.defaults.yaml":
        d = "F2: vLLM 0.33 builds V4.1's FlashMLA class on any CUDA capability, and on CPU and XPU."
        t.insert_before("default-v41-unsupported", [
            use("vllm033-default-v41-old-cuda", {"model": "deepseek_v4_1", "platform": "cuda",
                                                 "capability": OLD_CUDA, "kv_cache_dtype": V41_PACKED_ALL},
                "FLASHMLA_SPARSE_DSV41", d),
            use("vllm033-default-v41-cpu-xpu", {"model": "deepseek_v4_1", "platform": ["cpu", "xpu"],
                                                "kv_cache_dtype": V41_PACKED_ALL}, "FLASHMLA_SPARSE_DSV41", d)])
    elif name == "flashmla.yaml":
        t.when("flashmla-fp8-ds-mla", "F2", capability=None)
        t.when("flashmla-fp8", "F2/F3", capability=None, kv_cache_dtype=FP8_V4_PACKED)
        t.insert_before("flashmla-unsupported-platform", v4_ignored("vllm033-flashmla", skip=("cuda", "rocm")))
    elif name == "flashinfer.yaml":
        # the SM120 layer without FlashInfer's specialization: vLLM's __init__ raises RuntimeError
        # ("requires a FlashInfer DSV4 sparse MLA decode specialization"), a rejection: as shipped
        t.when("flashinfer-sm12x-fp8", "F3", kv_cache_dtype=FP8_V4_PACKED)
        t.when("flashinfer-unknown-capability-bf16", "F4", kv_cache_dtype={"not": FP8 + REFUSED_KV})
        t.when("flashinfer-unknown-capability-fp8", "F3/F4", kv_cache_dtype=FP8)
        t.when("flashinfer-sm10x-bf16", "F2/F4", capability={"not": "12.x"}, kv_cache_dtype={"not": FP8 + REFUSED_KV})
        t.when("flashinfer-sm10x-fp8", "F2/F3/F4", capability={"not": "12.x"}, kv_cache_dtype=FP8)
        # what is left for these three is int8, which vLLM's CacheConfig refuses: as shipped
        t.insert_before("flashinfer-sm10x-bf16", [
            _spec_584(t.rule("flashinfer-sm10x-fp8"), "fp8_ds_mla", "e4m3"),
            _spec_584(t.rule("flashinfer-sm10x-bf16"), "nvfp4_ds_mla", "bf16")])
        t.insert_before("flashinfer-unsupported-platform", v4_ignored("vllm033-flashinfer", skip=("cuda",)))
    elif name == "flashinfer_dsv41.yaml":
        t.insert_before("flashinfer-dsv41-other-model", v4_ignored("vllm033-flashinfer-dsv41"))
        rocm_reason = t.rule("flashinfer-dsv41-unsupported")["reject"]["reason"]
        t.insert_before("flashinfer-dsv41-sm12x-fp8-ds-mla", [{
            "id": "vllm033-flashinfer-dsv41-rocm", "when": {"platform": "rocm"},
            "reject": {"reason": rocm_reason}}])
        # nvfp4_ds_mla on SM120: vLLM's resolver keeps it, the layer's __init__ raises ValueError
        # (V4.1 records are SM100-only): rejected, as shipped
        t.when("flashinfer-dsv41-sm10x-bf16", "F2/F4", platform=None, capability=None,
               kv_cache_dtype={"not": FP8_ROWS_V41 + PACKED_V41 + REFUSED_KV})
        t.when("flashinfer-dsv41-sm10x-fp8", "F2/F3", platform=None, capability=None, kv_cache_dtype=FP8_ROWS_V41)
        # sm10x-unsupported-dtype and unsupported now see int8 only (refused by vLLM): as shipped
        t.rule("flashinfer-dsv41-unsupported")["when"] = {"platform": {"not": "rocm"}}
    elif name == "flashmla_dsv41.yaml":
        t.insert_before("flashmla-dsv41-other-model", v4_ignored("vllm033-flashmla-dsv41"))
        anywhere = {"not": "rocm"}
        what = "V4.1's FlashMLA class (any capability, CPU and XPU)"
        # the SM100 rules stay (CUDA unknown with them, as shipped); SM90 has its own rules
        t.v4_record_copy("flashmla-dsv41-fp8-ds-mla", "F2", what, platform=anywhere, capability={"not": "9.x"})
        t.v4_record_copy("flashmla-dsv41-fp8", "F2", what, platform=anywhere, capability={"not": "9.x"})
        r = t.rule("flashmla-dsv41-nvfp4")
        del r["reject"]
        r["select"] = {"cache_dtype": "nvfp4_ds_mla"}
        r["description"] = "F4: vLLM 0.33 keeps nvfp4_ds_mla on V4.1's FlashMLA class."
        r["when"]["capability"] = "10.x"  # unknown: the layer raises as off SM100 (not SM100)
        # off SM100 vLLM's resolver keeps nvfp4_ds_mla too, but the layer's __init__ then raises
        # ValueError ("nvfp4_ds_mla needs the V4.1 KV records, which FlashMLA decodes only on
        # SM100"): vLLM rejects there, as the shipped rules below this one do

    elif name == "flashmla_mega_dsv41.yaml":
        t.insert_before("mega-dsv41-other-model", v4_ignored("vllm033-mega"))
        # named explicitly, vLLM builds mega-attention on every non-ROCm platform and capability,
        # mega ops or not: its selects move before the rejections, widened
        # (on SM100 with V4.1's record; everywhere else with V4's, which vLLM's mega layer keeps there.
        # No mega kernel reads V4's record, and a rule must name an impl that reads its layout, so
        # those rows name FlashMLA-V4.1's impl: vLLM's mega layer is a subclass of its FlashMLA-V4.1
        # layer, and that impl is the one reading this record, on SM90)
        # off SM100 the mega layer's __init__ raises ValueError for nvfp4_ds_mla, which auto and fp8
        # are rewritten to: only fp8_ds_mla is built there (on V4's record)
        moved = []
        for rid in ("mega-dsv41-fp8-ds-mla", "mega-dsv41-default-nvfp4", "mega-dsv41-nvfp4"):
            r = copy.deepcopy(t.rule(rid))
            t.remove(rid)
            r["id"] = "vllm033-" + rid
            r["when"] = {**r["when"], "platform": {"not": "rocm"}}
            r["description"] = "F2: vLLM 0.33 builds mega-attention wherever it is named (not on ROCm)."
            sm100 = {**r, "when": {**r["when"], "capability": "10.x"}}
            v4 = {**copy.deepcopy(r), "id": r["id"] + "-v4-record",
                  "select": {**r["select"], **V4_RECORD, "impl": "dsv4sel.kernels.v41:DeepseekV41FlashMLASparseImpl"},
                  "description": r["description"][:-1] + "; off SM100 with V4's 584-byte record (fp8_ds_mla), "
                                 "which no mega kernel reads: the impl named is FlashMLA-V4.1's."}
            moved += [sm100, v4] if rid == "mega-dsv41-fp8-ds-mla" else [sm100]
        t.insert_before("mega-dsv41-not-sm10x", moved)
    elif name == "rocm.yaml":
        t.insert_before("rocm-other-model", v41_ignored("vllm033-rocm"))
        t.when("rocm-fp8-ds-mla", "F2", capability={"not": "unknown"})
        t.when("rocm-fp8", "F2/F3", capability={"not": "unknown"}, kv_cache_dtype=FP8_V4_PACKED)
        t.when("rocm-unknown-arch-fp8", "F3", kv_cache_dtype=FP8_V4_PACKED)
        t.insert_before("rocm-not-rocm", v4_ignored("vllm033-rocm", skip=("rocm",)))
    elif name == "rocm_dsv41.yaml":
        t.insert_before("rocm-dsv41-other-model", v4_ignored("vllm033-rocm-dsv41"))
        t.insert_before("rocm-dsv41-not-rocm", v41_ignored("vllm033-rocm-dsv41"))
        t.when("rocm-dsv41-fp8-ds-mla", "F2", capability={"not": "unknown"})
        t.when("rocm-dsv41-fp8", "F2", capability={"not": "unknown"})
        # nvfp4_ds_mla: vLLM's resolver keeps it, the ROCm V4.1 layer's __init__ raises ValueError
        # (V4.1 records are SM100-only): rejected, as shipped

    elif name in ("cpu.yaml", "xpu.yaml"):
        plat = name.split(".")[0]
        t.when(f"{plat}-fp8", "F3", kv_cache_dtype=FP8_V4_PACKED)
        # F5: vLLM 0.33's AttentionConfig refuses this name (no registered backend of that name),
        # while the platform's default decision builds exactly this class: named, it is rejected
        t.data["requested_by_name"] = {
            "id": f"vllm033-{plat}-named",
            "description": "F5: vLLM 0.33 builds this layer as the platform default only; its AttentionConfig "
                           "refuses the name.",
            "reject": {"reason": "{backend} is the %s platform's default DeepSeek-V4 layer, which vLLM 0.33 "
                                 "builds only when no backend is named: its AttentionConfig refuses "
                                 "--attention-backend {backend}. Pass no --attention-backend." % plat.upper()}}
    elif name == "not_dsv4.yaml":
        raise AssertionError("split by split_not_dsv4()")
    return t.data


def split_not_dsv4(data):
    """vLLM 0.33 raises for the two V3.2 FlashInfer names but ignores the others: two tables."""
    reason = data["rules"][0]["reject"]["reason"]
    v32 = ["FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120"]
    others = [b for b in data["backends"] if b not in v32 + REFUSED_BACKENDS + MSA_ALIASES]
    ignored = {"kind": "backend", "backends": others, "hit_policy": "first", "rules": [
        *v41_ignored("vllm033-ignored"),
        *v4_ignored("vllm033-ignored"),
        {"id": "not-a-dsv4-backend", "description": "V4.1 on ROCm (vLLM raises ValueError), or with prefill "
         "context parallelism (vLLM raises NotImplementedError).", "reject": {"reason": reason}}]}
    refused = {"kind": "backend", "backends": REFUSED_BACKENDS, "hit_policy": "unique",
               "rules": [{"id": "not-a-dsv4-backend-refused", "description": "vLLM 0.33's AttentionConfig refuses "
                          "these names; as shipped.", "reject": {"reason": reason}}]}
    v32_table = {"kind": "backend", "backends": v32, "hit_policy": "first", "rules": [
        *v4_ignored("vllm033-v32", skip=("cuda",)),
        {"id": "not-a-dsv4-backend-v32", "description": "vLLM 0.33 raises ValueError (V4.0 CUDA, V4.1 everywhere).",
         "reject": {"reason": reason}}]}
    return ignored, v32_table, refused


class _Dumper(yaml.SafeDumper):
    def ignore_aliases(self, data):
        return True


#: The editor's schema modeline, as every shipped rule file's first line: the path from rules/compat/vllm-0.33/.
MODELINE = "# yaml-language-server: $schema=../../../dsv4sel/schema/rules.schema.json\n"


def render(name, data) -> str:
    head = (f"{MODELINE}# GENERATED by tools/gen_compat_vllm033.py from rules/{name}: vLLM 0.33.0's decisions,\n"
            "# the deliberate fixes (F1-F5, docs/vllm.md) reverted. Do not edit; edit the generator.\n")
    return head + yaml.dump(data, Dumper=_Dumper, sort_keys=False, width=100, allow_unicode=True)


def with_modeline(text: str) -> str:
    """A shipped file's text copied here, its modeline's path made to resolve from here."""
    first, newline, rest = text.partition("\n")
    return MODELINE + (rest if first.startswith("# yaml-language-server:") else text)


def msa_table(defaults: list[dict]) -> dict:
    """CUTLASS_MSA / TRITON_MSA: vLLM 0.33's AttentionConfig erases them to no backend, so the
    default decision (``defaults``: the compat default rules, in order) decides them."""
    rules = []
    for r in defaults:
        r = copy.deepcopy(r)
        r.pop("override", None)
        r["id"] = "vllm033-msa-" + r["id"]
        r["description"] = ("F1: vLLM 0.33's AttentionConfig turns this MiniMax alias into no backend, so the "
                            "DeepSeek-V4 code builds its default: " + r.get("description", "").strip())
        rules.append(r)
    return {"kind": "backend", "backends": MSA_ALIASES, "hit_policy": "first", "rules": rules}


def build() -> dict[str, str]:
    out = {}
    defaults: list[dict] = []
    for name in sorted(os.listdir(SHIPPED)):
        if not name.endswith(".yaml"):
            continue
        with open(os.path.join(SHIPPED, name)) as fh:
            text = fh.read()
        data = yaml.safe_load(text)
        if data.get("kind") == "vocabulary":
            out[name] = with_modeline(text)  # the same decision space
        elif name == "not_dsv4.yaml":
            ignored, v32, refused = split_not_dsv4(data)
            out["not_dsv4.yaml"] = render(name, ignored)
            out["v32_flashinfer.yaml"] = render(name, v32)
            out["not_dsv4_refused.yaml"] = render(name, refused)
        else:
            edited = edit(name, Table(data))
            if edited.get("kind") == "default":
                defaults += edited["rules"]
            out[name] = render(name, edited)
    out["msa_aliases.yaml"] = render("not_dsv4.yaml", msa_table(defaults))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    files = build()
    os.makedirs(OUT, exist_ok=True)
    present = {n for n in os.listdir(OUT) if n.endswith(".yaml")}
    if args.check:
        stale = sorted(n for n in files if not os.path.exists(os.path.join(OUT, n))
                       or open(os.path.join(OUT, n)).read() != files[n]) + sorted(present - set(files))
        if stale:
            print("stale: " + ", ".join(stale) + " (run python3 tools/gen_compat_vllm033.py)", file=sys.stderr)
            return 1
        return 0
    for n in present - set(files):
        os.remove(os.path.join(OUT, n))
    for n, text in files.items():
        with open(os.path.join(OUT, n), "w") as fh:
            fh.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
