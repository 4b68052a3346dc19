#!/usr/bin/env python3
"""Generates rules/compat/vllm-0.33/*.yaml (all but the vocabulary and defaults files) from vLLM 0.33's
behaviours, written out per backend; run it after editing, then `dsv4sel check --only-rules --rules
rules/compat/vllm-0.33` and the vLLM differential (tests/test_vllm33.py)."""
import os
V = '">=0.33.0,<0.34"'
FP8_V4 = "[auto, fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_per_token_head]"
FP8_ROWS_V4 = "[fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_ds_mla, fp8_per_token_head]"
FP8_ROWS_V41 = "[fp8, fp8_e4m3, fp8_e5m2, fp8_inc, fp8_per_token_head]"
INFO = "    messages:\n      - info: Using DeepSeek's fp8_ds_mla KV cache format.\n"
M4 = "vllm.models.deepseek_v4"; M41 = "vllm.models.deepseek_v41"
CLS = {
    "flashmla": f"{M4}.nvidia.flashmla:DeepseekV4FlashMLAAttention",
    "sm120": f"{M4}.nvidia.flashinfer_sparse:DeepseekV4FlashInferSM120Attention",
    "firows": f"{M4}.nvidia.flashinfer_sparse:DeepseekV4FlashInferMLAAttention",
    "rocm": f"{M4}.amd.rocm:DeepseekV4ROCMAiterMLAAttention",
    "cpu": f"{M4}.cpu.cpu_sparse:DeepseekV4CPUAttention",
    "xpu": f"{M4}.xpu.xpu_sparse:DeepseekV4XPUAttention",
    "flashmla41": f"{M41}.nvidia.flashmla:DeepseekV4FlashMLAAttention",
    "mega41": f"{M41}.nvidia.flash_mla_mega_attn:DeepseekV4MegaAttnAttention",
    "sm120_41": f"{M41}.nvidia.flashinfer_sparse:DeepseekV4FlashInferSM120Attention",
    "firows41": f"{M41}.nvidia.flashinfer_sparse:DeepseekV4FlashInferMLAAttention",
    "rocm41": f"{M41}.amd.rocm:DeepseekV41ROCMAiterMLAAttention",
}
IMPL = {
    "flashmla": "dsv4sel.kernels.flashmla:DeepseekV4FlashMLASparseImpl",
    "sm120": "dsv4sel.kernels.flashinfer:DeepseekV4FlashInferMLASparseImpl",
    "firows": "dsv4sel.kernels.flashinfer:DeepseekV4FlashInferMLASparseImpl",
    "rocm": "dsv4sel.kernels.rocm:DeepseekV4ROCMAiterMLASparseImpl",
    "cpu": "dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl",
    "xpu": "dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl",
    "flashmla41": "dsv4sel.kernels.v41:DeepseekV41FlashMLASparseImpl",
    "mega41": "dsv4sel.kernels.v41:DeepseekV41MegaAttnImpl",
    "sm120_41": "dsv4sel.kernels.v41:DeepseekV41FlashInferMLASparseImpl",
    "firows41": "dsv4sel.kernels.v41:DeepseekV41FlashInferMLASparseImpl",
    "rocm41": "dsv4sel.kernels.v41:DeepseekV41FlashMLASparseImpl",
}
def sel(kind, layout, cache, torch, bpt, block, rewrite=None):
    out = (f'impl: "{IMPL[kind]}", layout: {layout}, cache_dtype: "{cache}", torch_dtype: {torch}, '
           f'bytes_per_token: {bpt}, block_size: {block}')
    if rewrite:
        out += f", rewrites: {{cache_dtype: {rewrite}}}"
    return "{" + out + f', hosts: {{vllm: {{class: "{CLS[kind]}", versions: {V}}}}}' + "}"
def W(when, **more):
    parts = [when] if when else []
    parts += [f"{k}: {v}" for k, v in more.items()]
    return "{" + ", ".join(parts) + "}"
def rule(rid, when, body, desc=None):
    s = f"  - id: {rid}\n"
    if desc:
        s += f"    description: {desc}\n"
    if when and when != "{}":
        s += f"    when: {when}\n"
    return s + body
def reject(rid, when, reason):
    return rule(rid, when, f'    reject:\n      reason: "{reason}"\n')
NOT_FP8_V4 = "DeepseekV4 fp8_ds_mla layout only supports fp8 kv-cache, got {kv_cache_dtype}."
NOT_PACKED = "DeepseekV4 packed KV layouts only support fp8 kv-cache, got {kv_cache_dtype}."

def packed_v4(p, when, kind):
    return (rule(f"{p}-fp8-ds-mla", W(when, kv_cache_dtype="fp8_ds_mla"),
                 f"    select: {sel(kind, 'fp8_ds_mla', 'fp8_ds_mla', 'uint8', 584, 256)}\n")
            + rule(f"{p}-fp8", W(when, kv_cache_dtype=FP8_V4),
                   f"    select: {sel(kind, 'fp8_ds_mla', 'fp8_ds_mla', 'uint8', 584, 256, 'fp8_ds_mla')}\n" + INFO,
                   "auto and every fp8* string become fp8_ds_mla (e4m3 data).")
            + reject(f"{p}-not-fp8", W(when), NOT_FP8_V4 + f" ({CLS[kind].rpartition(':')[2]}, {CLS[kind].split('.')[2]})"))
def rows(p, when, kind, fp8_list, packed_reject):
    out = ""
    if packed_reject:
        out += reject(f"{p}-packed-name", W(when, kv_cache_dtype="[fp8_ds_mla, nvfp4_ds_mla]"),
                      "{kv_cache_dtype} is a packed FlashMLA DeepSeek V4.1 KV cache format; the selected backend stores plain KV rows.")
    out += rule(f"{p}-rows-fp8", W(when, kv_cache_dtype=fp8_list),
                f"    select: {sel(kind, 'fp8_e4m3_row', '{kv_cache_dtype}', 'float8_e4m3fn', 512, 128 if packed_reject else 256)}\n")
    out += rule(f"{p}-rows-bf16", W(when),
                f"    select: {sel(kind, 'bf16_row', '{kv_cache_dtype}', 'bfloat16', 1024, 128 if packed_reject else 256)}\n",
                "every other string is a plain bf16 row.")
    return out
def packed_v41(p, when, kind, default="fp8_ds_mla", block=128):
    return (rule(f"{p}-packed", W(when, kv_cache_dtype="[fp8_ds_mla, nvfp4_ds_mla]"),
                 f"    select: {sel(kind, 'fp8_ds_mla_v41', '{kv_cache_dtype}', 'uint8', 528, block)}\n")
            + rule(f"{p}-fp8", W(when, kv_cache_dtype="[auto, fp8]"),
                   f"    select: {sel(kind, 'fp8_ds_mla_v41', default, 'uint8', 528, block, default)}\n",
                   f"auto and fp8 become the layer's packed record ({default}).")
            + reject(f"{p}-not-packed", W(when), NOT_PACKED + f" ({CLS[kind].rpartition(':')[2]}, {CLS[kind].split('.')[2]})"))

V4 = "model: deepseek_v4"; V41 = "model: deepseek_v4_1"
def v4_hard(p, plat):
    return packed_v4(f"{p}-{plat}", f"{V}, platform: {plat}".replace("V,", V4 + ",") if False else f"{V4}, platform: {plat}", plat)
def v4_ignored(p):
    return (packed_v4(f"{p}-v4-sm12x", f"{V4}, platform: cuda, capability: 12.x", "sm120")
            + packed_v4(f"{p}-v4-cuda", f"{V4}, platform: cuda", "flashmla")
            + v4_hard(p + "-v4", "rocm") + v4_hard(p + "-v4", "cpu") + v4_hard(p + "-v4", "xpu"))
def v41_rocm_reject(p):
    return reject(f"{p}-v41-rocm", W(f"{V41}, platform: rocm"),
                  "{backend} is not supported for DeepSeek V4.1 on ROCm; use ROCM_FLASHMLA_SPARSE_DSV41.")
def v41_ignored(p):
    return (packed_v41(f"{p}-v41-sm12x", f"{V41}, platform: cuda, capability: 12.x", "sm120_41", block=64)
            + packed_v41(f"{p}-v41-mega", f"{V41}, platform: cuda, capability: 10.x, mega_attn: available",
                         "mega41", default="nvfp4_ds_mla")
            + packed_v41(f"{p}-v41", V41, "flashmla41"))
def table(comment, backends, body):
    return (f"# {comment}\nkind: backend\nbackends: [{', '.join(backends)}]\nhit_policy: first\nrules:\n" + body)

files = {}
files["flashmla.yaml"] = table(
    "FLASHMLA_SPARSE_DSV4, and the V3.2 name FLASHMLA_SPARSE that vLLM 0.33 treats the same.",
    ["FLASHMLA_SPARSE_DSV4", "FLASHMLA_SPARSE"],
    v41_rocm_reject("c-flashmla") + packed_v41("c-flashmla-v41", V41, "flashmla41")
    + packed_v4("c-flashmla-cuda", f"{V4}, platform: cuda", "flashmla")
    + v4_hard("c-flashmla", "rocm") + v4_hard("c-flashmla", "cpu") + v4_hard("c-flashmla", "xpu"))
files["flashinfer.yaml"] = table(
    "FLASHINFER_MLA_SPARSE_DSV4: the SM120 class on major 12, else the SM10x class (plain rows) on any capability.",
    ["FLASHINFER_MLA_SPARSE_DSV4"],
    v41_rocm_reject("c-flashinfer") + packed_v41("c-flashinfer-v41-sm12x", f"{V41}, platform: cuda, capability: 12.x", "sm120_41", block=64)
    + rows("c-flashinfer-v41", V41, "firows41", FP8_ROWS_V41, True)
    + packed_v4("c-flashinfer-sm12x", f"{V4}, platform: cuda, capability: 12.x", "sm120")
    + rows("c-flashinfer-cuda", f"{V4}, platform: cuda", "firows", FP8_ROWS_V4, False)
    + v4_hard("c-flashinfer", "rocm") + v4_hard("c-flashinfer", "cpu") + v4_hard("c-flashinfer", "xpu"))
for plat, name in (("rocm", "ROCM_FLASHMLA_SPARSE_DSV4"), ("cpu", "CPU_V4_MLA_SPARSE"), ("xpu", "XPU_V4_MLA_SPARSE")):
    p = f"c-{plat}"
    head = (packed_v41(f"{p}-v41-rocm", f"{V41}, platform: rocm", "rocm41", block=64) if plat == "rocm"
            else v41_rocm_reject(p))
    files[f"{plat}.yaml"] = table(
        f"{name}: vLLM 0.33 names it on {plat}, whose V4.0 model module hard-codes its class; elsewhere the name is ignored.",
        [name], head + v41_ignored(p) + v4_ignored(p))
files["flashmla_dsv41.yaml"] = table(
    "FLASHMLA_SPARSE_DSV41: vLLM 0.33's V4.1 FlashMLA class on every non-ROCm platform; V4.0 ignores the name.",
    ["FLASHMLA_SPARSE_DSV41"], v41_rocm_reject("c-flashmla-dsv41") + packed_v41("c-flashmla-dsv41", V41, "flashmla41")
    + v4_ignored("c-flashmla-dsv41"))
files["flashmla_mega_dsv41.yaml"] = table(
    "FLASHMLA_MEGA_ATTN_DSV41: named, vLLM 0.33 builds mega-attention without asking is_available_for.",
    ["FLASHMLA_MEGA_ATTN_DSV41"], v41_rocm_reject("c-mega") + packed_v41("c-mega", V41, "mega41", default="nvfp4_ds_mla")
    + v4_ignored("c-mega"))
files["flashinfer_dsv41.yaml"] = table(
    "FLASHINFER_MLA_SPARSE_DSV41: the V4.1 SM120 class on major 12, else the SM10x class (plain rows).",
    ["FLASHINFER_MLA_SPARSE_DSV41"], v41_rocm_reject("c-flashinfer-dsv41")
    + packed_v41("c-flashinfer-dsv41-sm12x", f"{V41}, platform: cuda, capability: 12.x", "sm120_41", block=64)
    + rows("c-flashinfer-dsv41", V41, "firows41", FP8_ROWS_V41, True) + v4_ignored("c-flashinfer-dsv41"))
files["v32_flashinfer.yaml"] = table(
    "The DeepSeek-V3.2 FlashInfer names: vLLM 0.33's NVIDIA selection raises ValueError; AMD/CPU/XPU V4.0 ignore the backend.",
    ["FLASHINFER_MLA_SPARSE", "FLASHINFER_MLA_SPARSE_SM120"],
    v4_hard("c-v32", "rocm") + v4_hard("c-v32", "cpu") + v4_hard("c-v32", "xpu")
    + reject("c-v32-flashinfer", "{}", "{backend} is not a DeepSeek V4 attention backend. Use FLASHINFER_MLA_SPARSE_DSV4 (V4.0) or FLASHINFER_MLA_SPARSE_DSV41 (V4.1)."))
ignored = ["FLASHMLA", "FLASHINFER_MLA", "CUTLASS_MLA", "TRITON_MLA", "ROCM_AITER_MLA", "ROCM_AITER_MLA_SPARSE",
           "ROCM_AITER_TRITON_MLA", "FLASH_ATTN", "FLASH_ATTN_MLA", "FLASHINFER", "TRITON_ATTN", "ROCM_ATTN",
           "ROCM_AITER_FA", "FLEX_ATTENTION", "TREE_ATTN", "CPU_ATTN", "XFORMERS"]
files["not_dsv4.yaml"] = table(
    "Attention backends that are not DeepSeek-V4 ones: vLLM 0.33 ignores them (V4.1 on ROCm raises ValueError). TREE_ATTN and XFORMERS are refused by vLLM's AttentionConfig.",
    ignored, v41_rocm_reject("c-ignored") + v41_ignored("c-ignored") + v4_ignored("c-ignored"))
d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "rules", "compat", "vllm-0.33")
for name in os.listdir(d):
    if name.endswith(".yaml") and name not in ("vocabulary.yaml", "deepseek_v4_1.vocabulary.yaml", "defaults.yaml"):
        os.remove(os.path.join(d, name))
for name, text in files.items():
    open(os.path.join(d, name), "w").write(text)
