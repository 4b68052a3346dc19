"""The dsv4sel plugin in the real vLLM 0.34.0: the harness's plugin tests (harness/plugin_tests.py)
run for this release."""
from harness.plugin_tests import *  # noqa: F403 - the release-independent tests, for v0_34's RELEASE
