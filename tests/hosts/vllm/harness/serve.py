"""Run a vLLM release's own command line (``vllm ...``) on a stubbed platform (runs in its vLLM environment only).

    DSV4SEL_TEST_PLATFORM=cuda VENV/bin/python tests/hosts/vllm/harness/serve.py serve MODEL_DIR ...

The platform stand-in (:mod:`stubs`) is installed at import, so the engine processes vLLM
spawns (which import this file as ``__mp_main__``) get it too; with ``DSV4SEL_TEST_PLATFORM``
unset nothing is stubbed. Everything else -- argument parsing, vLLM's logging configuration
(``configure_logging_from_args``), plugin loading, ``VllmConfig`` validation -- is vLLM's own
``vllm.entrypoints.cli.main.main``. On this CPU machine the engine core then fails to start
(no GPU); what the tests read is the log up to there.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

_PLATFORM = os.environ.get("DSV4SEL_TEST_PLATFORM")
if _PLATFORM:
    import stubs  # noqa: E402

    stubs.setup(_PLATFORM)
    stubs.set_device(os.environ.get("DSV4SEL_TEST_CAPABILITY", "9.0"), _PLATFORM)

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
