"""Fixtures for the dsv4sel.kernels tests, imported by each test module.

Not a conftest.py: the core's tests import their own ``conftest`` module by
name, and a second conftest.py here would shadow it.

``device`` runs a test on the CPU and on a CUDA GPU (marked ``gpu``; skipped,
with the reason, where torch sees none). The kernel libraries are never needed: contract tests inject
fake modules into ``sys.modules`` (``fake_module``), or make every library unimportable (``no_libraries``).
"""

from __future__ import annotations

import sys
import types

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
    monkeypatch.setattr(torch.ops, "_flashmla_C", _OpsWithout("_flashmla_C"), raising=False)
