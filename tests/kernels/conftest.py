"""Fixtures for the dsv4sel.kernels tests: every test module in this folder can request them.

``device`` runs a test on the CPU and on a CUDA GPU (marked ``gpu``; skipped,
with the reason, where torch sees none). The kernel libraries are never needed: contract tests inject
fake modules into ``sys.modules`` (``fake_module``), or make every library unimportable (``no_libraries``).

torch is optional here, so that the tests of this folder that run without torch (the platform
probe's) still do: a fixture that needs it skips, with the reason, where it is missing.
The core's tests must not ``import conftest`` by name (they use ``tests/_repo.py``): which of the
two conftest modules that name finds depends on the order pytest loaded them.
"""

from __future__ import annotations

import sys
import types

import pytest

try:
    import torch
except ImportError:
    torch = None

_NO_TORCH = "dsv4sel.kernels tensor tests need torch (not installed)"


def _torch():
    """torch, or a skip of the test that asked where torch is not installed."""
    if torch is None:
        pytest.skip(_NO_TORCH)
    return torch


def _devices() -> list:
    no_cuda = pytest.mark.skipif(
        torch is None or not torch.cuda.is_available(),
        reason="no CUDA device visible to torch: the CUDA run of this test needs a GPU",
    )
    return [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=[pytest.mark.gpu, no_cuda])]


@pytest.fixture(params=_devices())
def device(request: pytest.FixtureRequest) -> str:
    """Each device the tensor code should be checked on."""
    return request.param


@pytest.fixture
def gen() -> "torch.Generator":
    """A seeded CPU generator: tests draw data on the CPU, then move it."""
    return _torch().Generator().manual_seed(1234)


@pytest.fixture
def fake_module(monkeypatch):
    """Install fake modules: fake_module('flashinfer.mla', fn_name=fn, ...)."""

    def install(name: str, **attrs):
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            sub = ".".join(parts[:i])
            if sub not in sys.modules or not getattr(sys.modules[sub], "_dsv4sel_fake", False):
                mod = types.ModuleType(sub)
                mod._dsv4sel_fake = True
                monkeypatch.setitem(sys.modules, sub, mod)
                if i > 1:
                    monkeypatch.setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], mod, raising=False)
        for key, value in attrs.items():
            setattr(sys.modules[name], key, value)
        return sys.modules[name]

    return install


class _OpsWithout:
    """A torch.ops namespace in which no op is registered (attribute lookups fail as torch's do)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, op: str):
        raise AttributeError(f"'_OpNamespace' '{self._name}' object has no attribute '{op}'")


@pytest.fixture
def no_libraries(monkeypatch):
    """A machine with no kernel library, whatever is installed and already loaded in this process.

    Every library module is unimportable (vLLM too: it bundles FlashMLA), the
    variable naming a copy of vLLM's FlashMLA is unset, and torch.ops._flashmla_C
    has no op even where an earlier test loaded a real FlashMLA build.
    """
    from dsv4sel.kernels.flashmla import VLLM_FLASHMLA_DIR_ENV

    for name in (
        "flash_mla", "flashinfer", "flashinfer.mla", "flashinfer.decode", "aiter", "aiter.mla", "vllm", "vllm._flashmla_C",
    ):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delenv(VLLM_FLASHMLA_DIR_ENV, raising=False)
    monkeypatch.setattr(_torch().ops, "_flashmla_C", _OpsWithout("_flashmla_C"), raising=False)
