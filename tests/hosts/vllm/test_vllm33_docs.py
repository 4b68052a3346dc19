"""The generated vLLM 0.33 artefacts are fresh: the compat rule set matches its generator, and
docs/vllm-0.33-fixes.md matches `dsv4sel diff rules/compat/vllm-0.33 rules` (no vLLM needed)."""
from __future__ import annotations

import json
import subprocess
import sys

from pathlib import Path

import dsv4sel

REPO = Path(__file__).resolve().parents[3]

COMPAT = REPO / "rules" / "compat" / "vllm-0.33"


def test_compat_rules_match_their_generator():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gen_compat.py"), "--host", "vllm", "--version",
                           "0.33.0", "--check"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_fix_cubes_doc_is_fresh():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "vllm_fix_cubes.py"), "--check",
                           str(REPO / "docs" / "vllm-0.33-fixes.md")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_compat_change_is_one_of_the_five_fixes():
    text = (REPO / "docs" / "vllm-0.33-fixes.md").read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections and all(s[3:5] in ("F1", "F2", "F3", "F4", "F5") for s in sections), sections


def test_compat_rules_are_complete_and_cover_the_shipped_space():
    """No errors; the only findings are the two DSV408 warnings the compat set acknowledges (vLLM
    0.33's 584-byte spec for V4.0 FlashInfer's SM10x rows, reproduced on purpose)."""
    compat = dsv4sel.load_rules(paths=[COMPAT])
    shipped = dsv4sel.default_rules()
    assert set(compat.keys()) == set(shipped.keys())
    proc = subprocess.run([sys.executable, "-c", "import sys; from dsv4sel.cli import main; sys.exit(main())",
                           "check", "--only-rules", "--rules", str(COMPAT), "--json"], capture_output=True, text=True)
    report = json.loads(proc.stdout)
    found = [(f["severity"], f["code"], "(acknowledged: vLLM 0.33 sizes this cache at 584 B/token" in f["message"])
             for f in report["findings"]]
    assert found == [("warning", "DSV408", True)] * 2, proc.stdout[-2000:] + proc.stderr
    assert report["coverage"]["totals"]["undecided"] == 0
