"""The vLLM suite's time limits (harness/limits.py) stop a hang, never a slow child, and say so."""
from __future__ import annotations

import sys
import time

import pytest

from harness import limits

RERUN = "python -m pytest -q -p no:xdist tests/hosts/vllm/v0_34/test_differential.py"


def test_a_child_that_waits_uses_no_cpu_time_and_is_not_stopped(tmp_path):
    """What a busy machine does to a child -- it waits for a core -- costs no CPU time."""
    done = limits.run([sys.executable, "-c", "import time; time.sleep(2); print('done')"], env={}, cwd=tmp_path,
                      rerun=RERUN, cpu_seconds=1)
    assert (done.returncode, done.stdout) == (0, "done\n")


def test_a_runaway_loop_is_stopped_by_its_cpu_limit_with_a_message_that_says_so(tmp_path):
    with pytest.raises(limits.TimeLimit) as caught:
        limits.run([sys.executable, "-c", "print('started', flush=True)\nwhile True: pass"], env={}, cwd=tmp_path,
                   rerun=RERUN, cpu_seconds=1)
    text = str(caught.value)
    assert text.startswith("time limit: ") and "CPU-time limit of 1 s" in text, text
    assert "guard against a hang" in text and text.splitlines()[0].endswith(RERUN), text


def test_a_hang_is_stopped_by_its_wall_limit_with_a_message_that_says_so(tmp_path):
    started = time.monotonic()
    with pytest.raises(limits.TimeLimit) as caught:
        limits.run([sys.executable, "-c", "import sys, time; print('waiting', file=sys.stderr, flush=True); "
                    "time.sleep(60)"], env={}, cwd=tmp_path, rerun=RERUN, wall_seconds=1)
    assert time.monotonic() - started < 30
    text = str(caught.value)
    assert "python -c was stopped because it ran past the wall-time limit of 1 s" in text, text
    assert text.splitlines()[0].endswith(RERUN) and text.splitlines()[-1] == "waiting", text
