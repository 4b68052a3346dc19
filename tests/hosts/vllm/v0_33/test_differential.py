"""vLLM 0.33.0's differential: the harness's tests (harness/differential_tests.py) run for this release."""
from harness.differential_tests import *  # noqa: F403 - the release-independent tests, for v0_33's RELEASE
