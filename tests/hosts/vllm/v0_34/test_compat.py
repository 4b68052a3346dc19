"""rules/compat/vllm-0.34 and docs/vllm-0.34-fixes.md are fresh and sound (no vLLM needed):
harness/compat_tests.py for this release."""
from harness.compat_tests import *  # noqa: F403 - the release-independent tests, for v0_34's RELEASE
