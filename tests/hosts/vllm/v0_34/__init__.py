"""vLLM 0.34.0: what its suite needs to know that the harness does not (tests/hosts/vllm/harness/).

Its own stand-in (``stubs.py``): the CPU platform's Triton check, which 0.34 made an error. Its
figures: LoRA decides V4.1's class (``LORA_CLASSES``, checked by the harness's differential).
"""
from harness.releases import VllmRelease

#: LoRA on: named or as the SM100 default, mega-attention gives way to V4.1's FlashMLA layer (the
#: mega kernel reads the grouped ``wo_a`` weight directly, so an adapter on it would not apply).
LORA_CLASSES = (("vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn:DeepseekV4MegaAttnAttention",
                 "vllm.models.deepseek_v41.nvidia.flashmla:DeepseekV4FlashMLAAttention"),)

RELEASE = VllmRelease(version="0.34.0", other_version="0.35.0", host_classes=11,
                      acknowledged=2, lora_classes=LORA_CLASSES)
