"""dsv4sel's pack layer in the real vLLM 0.33.0: harness/pack_layer_tests.py for this release."""
from harness.pack_layer_tests import *  # noqa: F403 - the release-independent tests, for v0_33's RELEASE
