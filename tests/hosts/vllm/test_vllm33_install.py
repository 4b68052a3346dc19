"""`pip install 'dsv4sel[vllm]'` next to the installed vLLM 0.33.0 moves nothing (issue 22, point 3).

pip's own resolver (``--dry-run --no-index --report``) run in .venv-vllm on this checkout with
the ``vllm`` extra, vLLM's own requirements that the CPU recipe leaves out standing in as
metadata (tests/vllm33/extra_resolve.py says why and how): it must install dsv4sel and nothing
else -- no torch, no CUDA wheel, no vLLM. Skipped, with the reason, when the environment is missing.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/, for _vllm33
import _vllm33  # noqa: E402

pytestmark = pytest.mark.skipif(_vllm33.skip_reason() is not None, reason=_vllm33.skip_reason() or "")


def test_the_vllm_extra_installs_nothing_but_dsv4sel_next_to_vllm(request, tmp_path_factory):
    _vllm33.start(request.session, tmp_path_factory)
    out = _vllm33.result("install")
    assert out["rc"] == 0, out["stderr"]
    assert [name for name, _version in out["install"]] == ["dsv4sel"], out
    # the stand-ins are vLLM's GPU stack (what the CPU recipe skips), never something dsv4sel asks for
    assert "torch" in out["standins"] and "dsv4sel" not in out["standins"], out["standins"]
