"""The one place that says why a host's differential environment (.venv-vllm, .venv-sglang) is
missing, for the skip reason of the suites that need it."""
from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def env_skip_reason(host: str, venv: Path, stamp: Path, make_target: str, tool: str) -> str | None:
    """None when ``venv`` is built (its ``stamp`` exists), else the reason to skip: the host, the
    command that builds it and, when a build failed, its log (``.<venv name>.log`` at the root)."""
    if stamp.exists():
        return None
    log = ROOT / f"{venv.name}.log"
    why = f"; its build log: {log}" if log.exists() else ""
    return f"the {host} test environment {venv} is not built (run `make {make_target}`: `python3 {tool}`){why}"
