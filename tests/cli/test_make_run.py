"""`make run` as a newcomer runs it: the main job (an explain) first, the check in one line,
and a setup that says what it is doing, one line per step."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _cli import REPO, environ

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _make(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    proc = subprocess.run(["make", "--no-print-directory", *args], capture_output=True, text=True, cwd=cwd,
                          env=environ(), timeout=300)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return proc


def test_make_run_shows_the_explain_first_and_the_check_in_one_line(tmp_path):
    # this test's environment stands for .venv: its stamp newer than pyproject.toml and setup.py
    # (no setup runs) and an artifact target newer than every rule file (nothing is rewritten)
    stamp, artifact = tmp_path / "installed", tmp_path / "shipped.dsv4c"
    newest = max((REPO / name).stat().st_mtime for name in ("pyproject.toml", "setup.py"))
    stamp.touch()
    os.utime(stamp, (newest + 1, newest + 1))
    artifact.touch()
    proc = _make("-s", "run", f"BIN={Path(sys.executable).parent}", f"STAMP={stamp}", f"ARTIFACT={artifact}")
    assert proc.returncode == 0, proc
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("query     cuda 9.0, --kv-cache-dtype auto"), lines[:3]
    assert re.match(r"selected\s+FLASHMLA_SPARSE_DSV4 ", lines[2]), lines[:3]
    assert re.fullmatch(r"dsv4sel check: clean, \d+ files, \d+ rules: all \d+ inputs decided exactly once", lines[-1])
    assert "coverage:" not in proc.stdout  # the check's tables are not shown
    assert all(len(line) <= 100 or " " not in line.strip() for line in lines)


def test_setup_says_each_step_before_it_runs(tmp_path):
    venv = tmp_path / "venv"
    steps = _make("-n", f"{venv}/.installed", f"VENV={venv}").stdout.splitlines()
    said = [re.fullmatch(r'echo "(.*)"', line)[1] for line in steps if line.startswith("echo ")]
    assert said == [f"setting up {venv} (first run only)", "  upgrading pip",
                    "  installing torch==2.13.0 (pinned: an unpinned torch would pull a multi-GB CUDA build)",
                    "  installing dsv4sel (editable) and its test tools"], steps
    assert f'echo "  creating {venv}"' in steps[1]  # only when there is none
    # every pip command follows the line that says what it installs
    for i, line in enumerate(steps):
        if " -m pip install" in line:
            assert steps[i - 1].startswith("echo "), steps
    compile_step = _make("-n", "-W", "rules/vocabulary.yaml", "dsv4sel/shipped.dsv4c", f"STAMP={tmp_path}/s",
                         f"VENV={venv}").stdout
    assert 'echo "compiling the shipped rules (dsv4sel/shipped.dsv4c)"' in compile_step, compile_step
