"""tools/doc_samples.py: the docs' console samples, Python samples and counts are what the tools
print, and a stale one fails `make test` (which runs ``doc_samples.py --check`` on README.md and
docs/)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "doc_samples.py"
_spec = importlib.util.spec_from_file_location("doc_samples", TOOL)
doc_samples = importlib.util.module_from_spec(_spec)
sys.modules["doc_samples"] = doc_samples  # dataclasses look their module up
_spec.loader.exec_module(doc_samples)

STALE = """# A doc

```console head=2
$ dsv4sel explain --platform cuda --capability 9.0 --kv-cache-dtype auto
selected  SOMETHING_ELSE
```

The suite has <!-- fact decisions.cases -->77<!-- /fact --> cases.

```pycon
>>> import dsv4sel
>>> dsv4sel.select(platform="cuda", capability="9.0").rule.line
26
```
"""


def tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], capture_output=True, text=True, timeout=300)


def test_a_stale_sample_fails_check_and_write_regenerates_it(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(STALE)
    stale = tool("--check", str(doc))
    assert stale.returncode == 1, stale
    assert "-selected  SOMETHING_ELSE" in stale.stdout and "make docs" in stale.stderr
    assert "-26" in stale.stdout and "-The suite has <!-- fact decisions.cases -->77<!-- /fact -->" in stale.stdout
    assert tool("--write", str(doc)).returncode == 0
    text = doc.read_text()
    # the real values: the deciding rule's line, the suite's size, the two-line head then `...`
    from dsv4sel import select

    line = select(platform="cuda", capability="9.0").rule.line
    assert f">>> dsv4sel.select(platform=\"cuda\", capability=\"9.0\").rule.line\n{line}\n" in text
    assert "cases.\n" in text and "-->77<" not in text
    assert "query     cuda 9.0, --kv-cache-dtype auto" in text and "\n...\n```" in text
    fresh = tool("--check", str(doc))
    assert fresh.returncode == 0, fresh


def test_line_selection_options():
    lines = ["head", "  a", "  b", "", "  keep me", "  c", "", "tail"]
    assert doc_samples.select_lines(lines, {"head": "1", "grep": "keep", "tail": "1"}) == [
        "head", "  ...", "  keep me", "  ...", "tail"]
    assert doc_samples.select_lines(lines, {"paragraphs": "1"}) == ["head", "  a", "  b", "..."]
    assert doc_samples.select_lines(lines, {}) == lines


@pytest.mark.parametrize("block, message", [
    ("```console\n$ ls -l\n```\n", "runs only `dsv4sel ...`"),
    ("```console lines=3\n$ dsv4sel --version\n```\n", "unknown console sample option 'lines=3'"),
    ("x <!-- fact no.such -->1<!-- /fact -->\n", "unknown fact 'no.such'"),
    ("```console\n$ dsv4sel explain --platform cuda --capability 9.0\n```\n", None),
])
def test_a_sample_that_cannot_run_is_an_error_not_written(tmp_path, block, message):
    doc = tmp_path / "doc.md"
    doc.write_text(block)
    result = tool("--write", str(doc))
    if message is None:
        assert result.returncode == 0 and "selected  FLASHMLA_SPARSE_DSV4" in doc.read_text()
        return
    assert result.returncode == 2 and message in result.stderr, result
    assert doc.read_text() == block


def test_unmarked_blocks_are_left_alone():
    text = "```\n$ dsv4sel explain --platform cuda\nanything\n```\n\n```yaml\nkind: tests\n```\n"
    assert doc_samples.regenerate(text, doc_samples.Facts()) == text


def test_make_test_and_make_docs_run_it():
    makefile = (REPO / "Makefile").read_text()
    test_recipe = makefile.split("\ntest:")[1].split("\n\n")[0]
    docs_recipe = makefile.split("\ndocs:")[1].split("\n\n")[0]
    assert "tools/doc_samples.py --check" in test_recipe
    assert "tools/doc_samples.py --write" in docs_recipe


def test_every_fact_names_a_value_the_tools_print():
    facts = doc_samples.Facts()
    for name in doc_samples.FACTS:
        assert isinstance(facts.value(name), int), name
