"""Fixtures for the dsv4sel.kernels tests.

``device`` runs a test on the CPU and, where torch sees one, on a CUDA GPU
(marked ``gpu``). The kernel libraries are never needed: contract tests inject
fake modules into ``sys.modules``.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="dsv4sel.kernels tensor tests need torch")


def _devices() -> list:
    params = [pytest.param("cpu", id="cpu")]
    if torch.cuda.is_available():
        params.append(pytest.param("cuda", id="cuda", marks=pytest.mark.gpu))
    return params


@pytest.fixture(params=_devices())
def device(request: pytest.FixtureRequest) -> str:
    """Each device the tensor code should be checked on."""
    return request.param


@pytest.fixture
def gen() -> "torch.Generator":
    """A seeded CPU generator: tests draw data on the CPU, then move it."""
    return torch.Generator().manual_seed(1234)
