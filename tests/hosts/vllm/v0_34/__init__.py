"""vLLM 0.34.0: what its suite needs to know that the harness does not (tests/hosts/vllm/harness/).

Its own stand-in (``stubs.py``): the CPU platform's Triton check, which 0.34 made an error. Its
figures: LoRA decides V4.1's class (``test_lora.py``).
"""
from harness.releases import VllmRelease

RELEASE = VllmRelease(version="0.34.0", venv=".venv-vllm-0.34", other_version="0.35.0", host_classes=11,
                      acknowledged=2)
