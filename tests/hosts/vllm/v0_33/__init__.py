"""vLLM 0.33.0: what its suite needs to know that the harness does not (tests/hosts/vllm/harness/).

0.33 needs no stubs beyond the harness's; its test files run the harness's tests, and
``test_plugin.py`` also checks the ``vllm serve`` log that docs/vllm.md shows (taken with 0.33).
"""
from harness.releases import VllmRelease

RELEASE = VllmRelease(version="0.33.0", other_version="0.35.0", host_classes=11,
                      acknowledged=2)
