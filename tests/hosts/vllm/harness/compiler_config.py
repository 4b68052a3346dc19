"""torch's compiler configuration in a vLLM process once vLLM is imported and its plugins loaded
(runs in a vLLM environment only).

    DSV4SEL_TEST_PLATFORM=cuda VENV/bin/python tests/hosts/vllm/harness/compiler_config.py

Prints one JSON line: every value of ``torch._dynamo.config`` and ``torch._inductor.config`` (as
``repr``, object addresses left out) and the variables vLLM sets before importing them. The suite
runs it forked from the release's zygote, which imported torch's compiler before the fork, and as
a plain process, and the two must print the same (:mod:`harness.zygote`).
"""
from __future__ import annotations

import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from plugin_scenarios import load  # noqa: E402
from zygote import VLLM_DEFAULTS_FIRST, VLLM_SETS_FIRST  # noqa: E402

_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def _text(value) -> str:
    """``repr(value)`` without what differs between two processes alike: object addresses, the
    order of a set's members (string hashing is salted per process), the working directory
    (each scenario has its own: ``<cwd>``)."""
    if isinstance(value, (set, frozenset)):
        return f"{type(value).__name__}({sorted(map(_text, value))})"
    return _ADDRESS.sub("", repr(value)).replace(os.getcwd(), "<cwd>")


def _values(config) -> dict[str, str]:
    return {name: _text(value) for name, value in sorted(config.get_config_copy().items())}


def main() -> int:
    load()
    import torch._dynamo.config as dynamo
    import torch._inductor.config as inductor

    print(json.dumps({"dynamo": _values(dynamo), "inductor": _values(inductor),
                      "env": {name: os.environ.get(name) for name in (*VLLM_SETS_FIRST, *VLLM_DEFAULTS_FIRST)}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
