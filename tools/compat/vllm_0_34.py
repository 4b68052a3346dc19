"""vLLM 0.34.0's compat set (rules/compat/vllm-0.34/): the shipped rules, each deliberate fix reverted.

0.34 decides as 0.33 does (:mod:`vllm_0_33`'s F1-F5 edits, spoken for 0.34) except where
tests/hosts/vllm/v0_34 measures a change:

- LoRA decides V4.1's class on every non-ROCm platform: the SM100 default takes mega-attention
  only with LoRA off (as the shipped rules do), and ``FLASHMLA_MEGA_ATTN_DSV41`` named with LoRA on
  silently builds V4.1's FlashMLA class (F1 reverted: the shipped rules refuse the name);
- FLASHINFER_TS and KIMI_K3_KV_BALANCED_MLA, new enum members, are accepted and ignored like every
  other backend that is not DeepSeek-V4's (0.33's AttentionConfig refused them);
- FlashInfer-V4.1 on SM12x builds 64-token blocks: the shipped rules' 0.34 host entry says so,
  and the compat set, which names 0.34's entries only, takes it as the selection's block size.
"""
from __future__ import annotations

from vllm_0_33 import REFUSED_BACKENDS, build_files, edit, split_not_dsv4
from vllm_tables import Release, Table, use

RELEASE = Release(version="0.34.0", name="vLLM 0.34", tag="vllm034",
                  generator="tools/gen_compat.py --host vllm --version 0.34.0")
HAND_WRITTEN = frozenset({"README.md"})
#: vLLM 0.34's V4.1 default takes mega-attention only without LoRA (deepseek_v41/nvidia/model.py).
LORA_OFF = {"lora": "off"}


def lora_replaces_mega(name, t: Table) -> None:
    """F1 reverted for LoRA: named with LoRA on, mega-attention is silently replaced by V4.1's
    FlashMLA class on every platform whose V4.1 code is NVIDIA's (not ROCm, where vLLM refuses
    mega-attention anyway and the shipped refusal stays)."""
    if name != "flashmla_mega_dsv41.yaml":
        return
    shipped = t.rule("mega-dsv41-lora")
    t.insert_before("mega-dsv41-lora", [use(
        f"{RELEASE.tag}-mega-dsv41-lora", {**shipped["when"], "platform": {"not": "rocm"}}, "FLASHMLA_SPARSE_DSV41",
        f"F1: named with LoRA on, {RELEASE.name} builds V4.1's FlashMLA class instead of mega-attention, "
        "without a word.")])


def _edit_file(name, t: Table):
    lora_replaces_mega(name, t)
    return edit(RELEASE, name, t, LORA_OFF)


def build() -> dict[str, str]:
    return build_files(RELEASE, _edit_file, lambda data: split_not_dsv4(RELEASE, data, REFUSED_BACKENDS, LORA_OFF))
