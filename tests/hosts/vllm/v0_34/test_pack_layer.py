"""dsv4sel's pack layer in the real vLLM 0.34.0: harness/pack_layer_tests.py for this release."""
from harness.pack_layer_tests import *  # noqa: F403 - the release-independent tests, for v0_34's RELEASE
