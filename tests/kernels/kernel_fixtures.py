"""Fixtures for the dsv4sel.kernels tests, imported by each test module.

Not a conftest.py: the core's tests import their own ``conftest`` module by
name, and a second conftest.py here would shadow it.

``device`` runs a test on the CPU and on a CUDA GPU (marked ``gpu``; skipped,
with the reason, where torch sees none). The kernel libraries are never needed: contract tests inject
fake modules into ``sys.modules``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dsv4sel.kernels tensor tests need torch")


def _devices() -> list:
    no_cuda = pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device visible to torch: the CUDA run of this test needs a GPU"
    )
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, no_cuda])]


@pytest.fixture(params=_devices())
def device(request: pytest.FixtureRequest) -> str:
    """Each device the tensor code should be checked on."""
    return request.param


@pytest.fixture
def gen() -> "torch.Generator":
    """A seeded CPU generator: tests draw data on the CPU, then move it."""
    return torch.Generator().manual_seed(1234)
