"""vLLM 0.34's own stand-in, beyond the harness's (tests/hosts/vllm/harness/stubs.py runs ``setup``).

On an x86 CPU without triton-cpu, 0.34's ``CpuPlatform.check_and_update_config`` raises
RuntimeError ("requires Triton (triton-cpu)"; 0.33 only warned), so no ``VllmConfig`` validates on
the CPU platform. The check reads ``vllm.triton_utils.HAS_TRITON`` when it runs: the wrapper says
True there for the duration of that one call only. Setting it for the whole process would change
what vLLM imports (V4.1's modules test it at import time), so it is never left set.
"""
from __future__ import annotations


def setup(platform: str) -> None:
    if platform != "cpu":
        return
    from vllm.platforms.cpu import CpuPlatform

    real = CpuPlatform.__dict__["check_and_update_config"].__func__

    def check_and_update_config(cls, vllm_config) -> None:
        import vllm.triton_utils as triton_utils

        had = triton_utils.HAS_TRITON
        triton_utils.HAS_TRITON = True
        try:
            real(cls, vllm_config)
        finally:
            triton_utils.HAS_TRITON = had

    CpuPlatform.check_and_update_config = classmethod(check_and_update_config)
