"""vLLM 0.33.0's compat set (rules/compat/vllm-0.33/): the shipped rules, each deliberate fix reverted.

Each edit below names the fix it reverts (F1-F6, :mod:`vllm_tables`) and says, as rules, what
vLLM 0.33 does where dsv4sel decides differently on purpose. Later releases start from these
edits (:func:`edit`, :func:`split_not_dsv4` and :func:`build_files` take the release they speak
for); :func:`ignore_lora` is 0.33's alone: it does not read LoRA.
"""
from __future__ import annotations

import copy

from vllm_tables import (
    FP8,
    for_release,
    FP8_ROWS_V41,
    FP8_V4_PACKED,
    OLD_CUDA,
    PACKED_V41,
    V4_PACKED_ALL,
    V4_RECORD,
    V41_PACKED_ALL,
    Release,
    Table,
    msa_table,
    render,
    shipped_files,
    spec_584,
    use,
    v4_ignored,
    v41_ignored,
    with_modeline,
)

RELEASE = Release(version="0.33.0", name="vLLM 0.33", tag="vllm033", generator="tools/gen_compat.py --host vllm --version 0.33.0")
HAND_WRITTEN = frozenset({"README.md"})

# kv dtypes vLLM 0.33's CacheConfig refuses (it decides nothing for them): kept as shipped
REFUSED_KV = ["int8"]
# backend names vLLM's AttentionConfig refuses (TREE_ATTN, XFORMERS: older names): the DeepSeek-V4
# code never sees them, so vLLM decides nothing for them; kept as shipped
REFUSED_BACKENDS = ["TREE_ATTN", "XFORMERS"]
# members vLLM 0.34 added to its backend enum: vLLM 0.33's AttentionConfig refuses them too
ADDED_IN_034 = ["FLASHINFER_TS", "KIMI_K3_KV_BALANCED_MLA"]
# MiniMax's MSA decode aliases: vLLM's AttentionConfig turns them into "no backend", so the
# DeepSeek-V4 code builds its default class: the compat set decides them as the default decision
MSA_ALIASES = ["CUTLASS_MSA", "TRITON_MSA"]
# the two V3.2 FlashInfer names vLLM raises for (V4.0 on CUDA, V4.1 everywhere)
V32 = ["FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120"]


def edit(rel: Release, name, t: Table, v41_when=None):
    """The edits of shipped file ``name`` (its rules in ``t``) that revert F1-F5, as vLLM 0.33
    decides and later releases still do. ``v41_when``: conditions under which a release's V4.1
    default takes mega-attention, besides the kernels being there (0.34: LoRA off)."""
    tag, vname = rel.tag, rel.name
    if name == "defaults.yaml":
        t.insert_before("default-cuda-unsupported", [use(
            f"{tag}-default-cuda-any-capability",
            {"model": "deepseek_v4", "platform": "cuda", "capability": OLD_CUDA, "kv_cache_dtype": V4_PACKED_ALL},
            "FLASHMLA_SPARSE_DSV4", f"F2: {vname} builds FlashMLA on every CUDA capability that is not 12.x.")])
    elif name == "deepseek_v4_1.defaults.yaml":
        d = f"F2: {vname} builds V4.1's FlashMLA class on any CUDA capability, and on CPU and XPU."
        t.insert_before("default-v41-unsupported", [
            use(f"{tag}-default-v41-old-cuda", {"model": "deepseek_v4_1", "platform": "cuda",
                                                "capability": OLD_CUDA, "kv_cache_dtype": V41_PACKED_ALL},
                "FLASHMLA_SPARSE_DSV41", d),
            use(f"{tag}-default-v41-cpu-xpu", {"model": "deepseek_v4_1", "platform": ["cpu", "xpu"],
                                               "kv_cache_dtype": V41_PACKED_ALL}, "FLASHMLA_SPARSE_DSV41", d)])
    elif name == "flashmla.yaml":
        t.when("flashmla-fp8-ds-mla", "F2", capability=None)
        t.when("flashmla-fp8", "F2/F3", capability=None, kv_cache_dtype=FP8_V4_PACKED)
        t.insert_before("flashmla-unsupported-platform", v4_ignored(rel, f"{tag}-flashmla", skip=("cuda", "rocm")))
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
            spec_584(rel, t.rule("flashinfer-sm10x-fp8"), "fp8_ds_mla", "e4m3"),
            spec_584(rel, t.rule("flashinfer-sm10x-bf16"), "nvfp4_ds_mla", "bf16")])
        t.insert_before("flashinfer-unsupported-platform", v4_ignored(rel, f"{tag}-flashinfer", skip=("cuda",)))
    elif name == "flashinfer_dsv41.yaml":
        t.insert_before("flashinfer-dsv41-other-model", v4_ignored(rel, f"{tag}-flashinfer-dsv41"))
        rocm_reason = t.rule("flashinfer-dsv41-unsupported")["reject"]["reason"]
        t.insert_before("flashinfer-dsv41-sm12x-fp8-ds-mla", [{
            "id": f"{tag}-flashinfer-dsv41-rocm", "when": {"platform": "rocm"},
            "reject": {"reason": rocm_reason}}])
        # nvfp4_ds_mla on SM120: vLLM's resolver keeps it, the layer's __init__ raises ValueError
        # (V4.1 records are SM100-only): rejected, as shipped
        t.when("flashinfer-dsv41-sm10x-bf16", "F2/F4", platform=None, capability=None,
               kv_cache_dtype={"not": FP8_ROWS_V41 + PACKED_V41 + REFUSED_KV})
        t.when("flashinfer-dsv41-sm10x-fp8", "F2/F3", platform=None, capability=None, kv_cache_dtype=FP8_ROWS_V41)
        # sm10x-unsupported-dtype and unsupported now see int8 only (refused by vLLM): as shipped
        t.rule("flashinfer-dsv41-unsupported")["when"] = {"platform": {"not": "rocm"}}
    elif name == "flashmla_dsv41.yaml":
        t.insert_before("flashmla-dsv41-other-model", v4_ignored(rel, f"{tag}-flashmla-dsv41"))
        anywhere = {"not": "rocm"}
        what = "V4.1's FlashMLA class (any capability, CPU and XPU)"
        # the SM100 rules stay (CUDA unknown with them, as shipped); SM90 has its own rules
        t.v4_record_copy("flashmla-dsv41-fp8-ds-mla", "F2", what, platform=anywhere, capability={"not": "9.x"})
        t.v4_record_copy("flashmla-dsv41-fp8", "F2", what, platform=anywhere, capability={"not": "9.x"})
        r = t.rule("flashmla-dsv41-nvfp4")
        del r["reject"]
        r["select"] = {"cache_dtype": "nvfp4_ds_mla"}
        r["description"] = f"F4: {vname} keeps nvfp4_ds_mla on V4.1's FlashMLA class."
        r["when"]["capability"] = "10.x"  # unknown: the layer raises as off SM100 (not SM100)
        # off SM100 vLLM's resolver keeps nvfp4_ds_mla too, but the layer's __init__ then raises
        # ValueError ("nvfp4_ds_mla needs the V4.1 KV records, which FlashMLA decodes only on
        # SM100"): vLLM rejects there, as the shipped rules below this one do
    elif name == "flashmla_mega_dsv41.yaml":
        t.insert_before("mega-dsv41-other-model", v4_ignored(rel, f"{tag}-mega"))
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
            r["id"] = f"{tag}-" + rid
            r["when"] = {**r["when"], "platform": {"not": "rocm"}}
            r["description"] = f"F2: {vname} builds mega-attention wherever it is named (not on ROCm)."
            sm100 = {**r, "when": {**r["when"], "capability": "10.x"}}
            v4 = {**copy.deepcopy(r), "id": r["id"] + "-v4-record",
                  "select": {**r["select"], **V4_RECORD, "impl": "dsv4sel.kernels.v41:DeepseekV41FlashMLASparseImpl"},
                  "description": r["description"][:-1] + "; off SM100 with V4's 584-byte record (fp8_ds_mla), "
                                 "which no mega kernel reads: the impl named is FlashMLA-V4.1's."}
            moved += [sm100, v4] if rid == "mega-dsv41-fp8-ds-mla" else [sm100]
        t.insert_before("mega-dsv41-not-sm10x", moved)
    elif name == "rocm.yaml":
        t.insert_before("rocm-other-model", v41_ignored(rel, f"{tag}-rocm", v41_when))
        t.when("rocm-fp8-ds-mla", "F2", capability={"not": "unknown"})
        t.when("rocm-fp8", "F2/F3", capability={"not": "unknown"}, kv_cache_dtype=FP8_V4_PACKED)
        t.when("rocm-unknown-arch-fp8", "F3", kv_cache_dtype=FP8_V4_PACKED)
        t.insert_before("rocm-not-rocm", v4_ignored(rel, f"{tag}-rocm", skip=("rocm",)))
    elif name == "rocm_dsv41.yaml":
        t.insert_before("rocm-dsv41-other-model", v4_ignored(rel, f"{tag}-rocm-dsv41"))
        t.insert_before("rocm-dsv41-not-rocm", v41_ignored(rel, f"{tag}-rocm-dsv41", v41_when))
        t.when("rocm-dsv41-fp8-ds-mla", "F2", capability={"not": "unknown"})
        t.when("rocm-dsv41-fp8", "F2", capability={"not": "unknown"})
        # nvfp4_ds_mla: vLLM's resolver keeps it, the ROCm V4.1 layer's __init__ raises ValueError
        # (V4.1 records are SM100-only): rejected, as shipped
    elif name in ("cpu.yaml", "xpu.yaml"):
        plat = name.split(".")[0]
        t.when(f"{plat}-fp8", "F3", kv_cache_dtype=FP8_V4_PACKED)
        # F5: vLLM's AttentionConfig refuses this name (no registered backend of that name), while
        # the platform's default decision builds exactly this class: named, it is rejected
        t.data["requested_by_name"] = {
            "id": f"{tag}-{plat}-named",
            "description": f"F5: {vname} builds this layer as the platform default only; its AttentionConfig "
                           "refuses the name.",
            "reject": {"reason": "{backend} is the %s platform's default DeepSeek-V4 layer, which %s "
                                 "builds only when no backend is named: its AttentionConfig refuses "
                                 "--attention-backend {backend}. Pass no --attention-backend." % (plat.upper(), vname)}}
    elif name == "not_dsv4.yaml":
        raise AssertionError("split by split_not_dsv4()")
    return t.data


def ignore_lora(rel: Release, name, t: Table) -> None:
    """F6 reverted: vLLM 0.33 does not read LoRA, so mega-attention serves with LoRA on exactly as
    with it off (named, or as the SM100 default), though an adapter on ``wo_a`` would not apply.
    Named on ROCm, where vLLM refuses mega-attention anyway, the shipped refusal stays."""
    if name == "deepseek_v4_1.defaults.yaml":
        t.remove("default-v41-cuda-sm10x-lora")
    elif name == "flashmla_mega_dsv41.yaml":
        r = t.rule("mega-dsv41-lora")
        r["when"] = {**r["when"], "platform": "rocm"}
        r["description"] = (f"F6: {rel.name} does not read LoRA; named on ROCm, mega-attention is refused "
                            "either way (this rule's reason kept as shipped).")


def split_not_dsv4(rel: Release, data, refused=REFUSED_BACKENDS, v41_when=None):
    """vLLM raises for the two V3.2 FlashInfer names but ignores the others (except ``refused``,
    which its AttentionConfig refuses): three tables."""
    tag = rel.tag
    reason = data["rules"][0]["reject"]["reason"]
    others = [b for b in data["backends"] if b not in V32 + refused + MSA_ALIASES]
    ignored = {"kind": "backend", "backends": others, "hit_policy": "first", "rules": [
        *v41_ignored(rel, f"{tag}-ignored", v41_when),
        *v4_ignored(rel, f"{tag}-ignored"),
        {"id": "not-a-dsv4-backend", "description": "V4.1 on ROCm (vLLM raises ValueError), or with prefill "
         "context parallelism (vLLM raises NotImplementedError).", "reject": {"reason": reason}}]}
    refused_table = {"kind": "backend", "backends": refused, "hit_policy": "unique",
                     "rules": [{"id": "not-a-dsv4-backend-refused", "description": f"{rel.name}'s AttentionConfig "
                                "refuses these names; as shipped.", "reject": {"reason": reason}}]}
    v32_table = {"kind": "backend", "backends": V32, "hit_policy": "first", "rules": [
        *v4_ignored(rel, f"{tag}-v32", skip=("cuda",)),
        {"id": "not-a-dsv4-backend-v32", "description": f"{rel.name} raises ValueError (V4.0 CUDA, V4.1 everywhere).",
         "reject": {"reason": reason}}]}
    return ignored, v32_table, refused_table


def build_files(rel: Release, edit_file, split) -> dict[str, str]:
    """Every file of ``rel``'s compat set: the vocabulary files as shipped, each rule file through
    ``edit_file(name, Table)``, not_dsv4.yaml through ``split(data)`` (three tables) and the
    MiniMax aliases' table from the edited default rules; every selection naming ``rel``'s class."""
    out = {}
    defaults: list[dict] = []
    for name, text, data in shipped_files():
        if data.get("kind") == "vocabulary":
            out[name] = with_modeline(text)  # the same decision space
            continue
        for_release(rel, data)
        if name == "not_dsv4.yaml":
            ignored, v32, refused = split(data)
            out["not_dsv4.yaml"] = render(rel, name, ignored)
            out["v32_flashinfer.yaml"] = render(rel, name, v32)
            out["not_dsv4_refused.yaml"] = render(rel, name, refused)
        else:
            edited = edit_file(name, Table(rel, data))
            if edited.get("kind") == "default":
                defaults += edited["rules"]
            out[name] = render(rel, name, edited)
    out["msa_aliases.yaml"] = render(rel, "not_dsv4.yaml", msa_table(rel, defaults, MSA_ALIASES))
    return out


def _edit_file(name, t: Table):
    ignore_lora(RELEASE, name, t)
    return edit(RELEASE, name, t)


def build() -> dict[str, str]:
    return build_files(RELEASE, _edit_file, lambda data: split_not_dsv4(RELEASE, data, REFUSED_BACKENDS + ADDED_IN_034))
