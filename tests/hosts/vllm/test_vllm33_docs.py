"""The generated vLLM 0.33 artefacts are fresh: the compat rule set matches its generator, and
docs/vllm-0.33-fixes.md matches `dsv4sel diff rules/compat/vllm-0.33 rules` (no vLLM needed)."""
from __future__ import annotations

import subprocess
import sys

from pathlib import Path

import dsv4sel

REPO = Path(__file__).resolve().parents[3]

COMPAT = REPO / "rules" / "compat" / "vllm-0.33"


def test_compat_rules_match_their_generator():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gen_compat_vllm033.py"), "--check"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_fix_cubes_doc_is_fresh():
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "vllm_fix_cubes.py"), "--check",
                           str(REPO / "docs" / "vllm-0.33-fixes.md")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_every_compat_change_is_one_of_the_four_fixes():
    text = (REPO / "docs" / "vllm-0.33-fixes.md").read_text()
    sections = [line for line in text.splitlines() if line.startswith("## ")]
    assert sections and all(s[3:5] in ("F1", "F2", "F3", "F4") for s in sections), sections


def test_compat_rules_are_clean_and_cover_the_shipped_space():
    compat = dsv4sel.load_rules(paths=[COMPAT])
    shipped = dsv4sel.default_rules()
    assert set(compat.keys()) == set(shipped.keys())
    proc = subprocess.run([sys.executable, "-c", "import sys; from dsv4sel.cli import main; sys.exit(main())",
                           "check", "--only-rules", "--rules", str(COMPAT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr
    assert "clean:" in proc.stdout
