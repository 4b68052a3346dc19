"""A pack's own vLLM layer (test data): vLLM 0.33's FlashMLA layer under the pack's name. Imported
only in the vLLM environment, and only when the process allows ``ownlayer_pack``."""
from __future__ import annotations

from vllm.models.deepseek_v4.nvidia.flashmla import DeepseekV4FlashMLAAttention


class OwnFlashMLAAttention(DeepseekV4FlashMLAAttention):
    """The pack's layer: everything vLLM's FlashMLA layer does."""
