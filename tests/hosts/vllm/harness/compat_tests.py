"""A vLLM release's generated artefacts are fresh and sound (no vLLM needed), written once; each
release folder's ``test_compat.py`` imports these tests and so runs them for its release: the
compat rule set matches its generator (tools/gen_compat.py), it is complete over the shipped
rules' space, and docs/vllm-X-fixes.md matches `dsv4sel diff rules/compat/vllm-X rules`."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import dsv4sel
from harness.releases import ROOT, VllmRelease, of_module

__all__ = ["release", "test_compat_rules_are_complete_and_cover_the_shipped_space",
           "test_compat_rules_match_their_generator", "test_every_compat_change_is_one_of_the_deliberate_fixes",
           "test_the_fix_cubes_doc_is_fresh"]


@pytest.fixture(scope="module")
def release(request) -> VllmRelease:
    return of_module(request.module.__name__)


def test_compat_rules_match_their_generator(release):
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "gen_compat.py"), "--host", "vllm", "--version",
                           release.version, "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_fix_cubes_doc_is_fresh(release):
    proc = subprocess.run([sys.executable, str(ROOT / "tools" / "vllm_fix_cubes.py"), "--version", release.version,
                           "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_compat_change_is_one_of_the_deliberate_fixes(release):
    text = release.fixes_doc.read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections and all(s[3:5] in ("F1", "F2", "F3", "F4", "F5", "F6") for s in sections), sections


def test_compat_rules_are_complete_and_cover_the_shipped_space(release):
    """No errors; the only findings are the DSV408 warnings the compat set acknowledges (vLLM's
    584-byte spec for V4.0 FlashInfer's SM10x rows, reproduced on purpose)."""
    compat = dsv4sel.load_rules(paths=[release.compat])
    shipped = dsv4sel.default_rules()
    assert set(compat.keys()) == set(shipped.keys())
    proc = subprocess.run([sys.executable, "-c", "import sys; from dsv4sel.cli import main; sys.exit(main())",
                           "check", "--only-rules", "--rules", str(release.compat), "--json"],
                          capture_output=True, text=True)
    report = json.loads(proc.stdout)
    sizes = f"(acknowledged: vLLM {release.minor} sizes this cache at 584 B/token"
    found = [(f["severity"], f["code"], sizes in f["message"]) for f in report["findings"]]
    assert found == [("warning", "DSV408", True)] * release.acknowledged, proc.stdout[-2000:] + proc.stderr
    assert report["coverage"]["totals"]["undecided"] == 0
