"""The repository's root folder, for tests that run commands or read files there.

A module of its own rather than a name in ``tests/conftest.py``: tests/kernels has a
conftest.py too, and ``import conftest`` gets whichever of the two pytest loaded last."""

import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
