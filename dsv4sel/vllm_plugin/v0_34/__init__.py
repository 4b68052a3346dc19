"""vLLM 0.34's release folder: what differs from vLLM 0.33's (:mod:`dsv4sel.vllm_plugin.v0_33`), and
only that. Measured against vLLM 0.34.0's own code (``../shared`` facts, tests/hosts/vllm/v0_34):
the functions the plugin replaces keep their modules and signatures, the layer classes keep
their names and modules, AMD/CPU/XPU V4.0 still hard-code their class, the NIXL hash and the
engine core's spec merge keep theirs (``LATER``); the SM120 helpers lost
their leading underscore. What 0.34 decides differently (LoRA, FlashInfer-V4.1's SM12x block
size, two new backend names) is data: the rules' ``lora`` input, their ``hosts: vllm`` entries
for ``>=0.34``, and the translation ``vllm-0.34.yaml`` beside this file.
"""

from __future__ import annotations

from ..v0_33 import HARDCODED, HOST_MODULES, LATER, MODEL_PACKAGES, TARGETS

__all__ = ["HARDCODED", "HOST_MODULES", "LATER", "MODEL_PACKAGES", "SM120_TOPK", "TARGETS"]

#: public since 0.34 (``required_sm120_sparse_topk``; 0.33's ``_required_sm120_sparse_topk`` is gone)
SM120_TOPK = "required_sm120_sparse_topk"
