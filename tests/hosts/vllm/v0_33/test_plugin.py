"""The dsv4sel plugin in the real vLLM 0.33.0: the harness's plugin tests (harness/plugin_tests.py)
run for this release, and the log samples docs/vllm.md shows, which were taken with it."""
from __future__ import annotations

import re
import sys
from pathlib import Path

if __name__ == "__main__":  # `python tests/hosts/vllm/v0_33/test_plugin.py --write`: the harness is beside this folder
    sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[3])]

from harness import runner  # noqa: E402
from harness.plugin_tests import *  # noqa: E402,F403 - the release-independent tests, for v0_33's RELEASE
from harness.plugin_tests import serve_log  # noqa: E402
from harness.releases import ROOT  # noqa: E402
from v0_33 import RELEASE  # noqa: E402

DOC = ROOT / "docs" / "vllm.md"


def doc_block(marker: str) -> list[str]:
    """The lines of the fenced block that follows ``<!-- generated: MARKER ... -->`` in docs/vllm.md."""
    lines = DOC.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(f"<!-- generated: {marker} "))
    start = lines.index("```text", at) + 1
    return lines[start:lines.index("```", start)]


def rejection_sample(ran) -> list[str]:
    """How vLLM reports the rejected config (`--kv-cache-dtype bfloat16` on SM90): pydantic's
    ValidationError as vLLM raises it, its input echo cut to ``...``."""
    text = ran["configs"][2][1]["text"].splitlines()
    return [re.sub(r"\[type=value_error, .*\]$", "[type=value_error, ...]", line) for line in text[:3]]


def test_vllm_serve_shows_the_start_up_and_decision_lines_as_the_doc_does(ran):
    """`vllm serve`'s dsv4sel lines (the start-up line, the decision line and the rules' message in
    the API server, the start-up line again in the engine core process) are exactly the doc's block
    (run `python tests/hosts/vllm/v0_33/test_plugin.py --write` to refresh it)."""
    got = serve_log(ran)
    assert got == doc_block("vllm serve"), "docs/vllm.md's `vllm serve` block is stale:\n" + "\n".join(got)


def test_the_rejection_sample_in_the_doc_is_what_vllm_raises(ran):
    assert rejection_sample(ran) == doc_block("rejection"), "\n".join(rejection_sample(ran))


def _write_doc() -> None:
    """Rewrite the two generated blocks of docs/vllm.md from a fresh run of the scenarios."""
    import tempfile

    runner.launch({"v0_33.test_plugin"}, Path(tempfile.mkdtemp(prefix="dsv4sel-vllm-doc-")))
    ran = {name: runner.result(RELEASE, f"scenario:{name}") for name in ("serve", "configs")}
    text = DOC.read_text()
    for marker, block in (("vllm serve", serve_log(ran)), ("rejection", rejection_sample(ran))):
        old = doc_block(marker)
        text = text.replace("```text\n" + "\n".join(old) + "\n```", "```text\n" + "\n".join(block) + "\n```", 1)
    DOC.write_text(text)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    _write_doc()
