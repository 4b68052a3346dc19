"""The one torch import question (``import_torch``) and its users, without torch."""

from __future__ import annotations

import sys

import pytest

from dsv4sel.kernels import layouts
from dsv4sel.kernels.platform import device_target, import_torch, probe_torch, require_torch


def test_without_torch_every_probe_gives_the_same_reason(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch now raises ImportError
    assert import_torch() == (None, "torch not installed")
    assert probe_torch() == (None, "torch not installed")
    assert device_target("cuda:0") == ("cpu", None)
    with pytest.raises(ImportError, match="torch not installed: this needs torch"):
        require_torch()
    with pytest.raises(ImportError, match="torch not installed"):
        layouts.LAYOUTS["fp8_ds_mla"].allocate(1, 64)


def test_with_torch_the_module_and_no_problem_come_back() -> None:
    torch = pytest.importorskip("torch")
    assert import_torch() == (torch, None)
    assert require_torch() is torch
