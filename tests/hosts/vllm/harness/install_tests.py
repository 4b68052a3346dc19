"""`pip install 'dsv4sel[vllm]'` next to an installed vLLM release moves nothing (issue 22, point 3),
written once; each release folder's ``test_install.py`` imports it and so runs it for its release.

pip's own resolver (``--dry-run --no-index --report``) runs in the release's environment on this
checkout with the ``vllm`` extra, vLLM's own requirements that the CPU recipe leaves out standing in
as metadata (harness/extra_resolve.py says why and how): it must install dsv4sel and nothing else
-- no torch, no CUDA wheel, no vLLM. Skipped, with the reason, when the environment is missing.
"""
from __future__ import annotations

from harness import runner
from harness.differential_tests import release, skip_without_env

__all__ = ["release", "skip_without_env", "test_the_vllm_extra_installs_nothing_but_dsv4sel_next_to_vllm"]


def test_the_vllm_extra_installs_nothing_but_dsv4sel_next_to_vllm(request, tmp_path_factory, release):
    runner.start(request, tmp_path_factory)
    out = runner.result(release, "install")
    assert out["rc"] == 0, out["stderr"]
    assert [name for name, _version in out["install"]] == ["dsv4sel"], out
    # the stand-ins are vLLM's GPU stack (what the CPU recipe skips), never something dsv4sel asks for
    assert "torch" in out["standins"] and "dsv4sel" not in out["standins"], out["standins"]
