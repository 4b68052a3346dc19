"""The vLLM suite's time limits (harness/limits.py) stop a hang, never a slow child, and say so;
and a child forked from a zygote (harness/zygote.py) is the process a plain start would give."""
from __future__ import annotations

import json
import os
import sys
import time

import pytest

from harness import limits
from harness.zygote import Zygote

RERUN = "python -m pytest -q -p no:xdist tests/hosts/vllm/v0_34/test_differential.py"


@pytest.fixture(scope="module")
def zygote():
    started = Zygote(sys.executable, {"PATH": os.environ.get("PATH", "")})
    yield started
    started.close()


@pytest.fixture(params=["own process", "zygote"])
def start(request, zygote):
    """How the child starts: its own interpreter, or forked from a zygote of the same Python."""
    return {"zygote": zygote if request.param == "zygote" else None}


def test_a_child_that_waits_uses_no_cpu_time_and_is_not_stopped(tmp_path, start):
    """What a busy machine does to a child -- it waits for a core -- costs no CPU time."""
    done = limits.run([sys.executable, "-c", "import time; time.sleep(2); print('done')"], env={}, cwd=tmp_path,
                      rerun=RERUN, cpu_seconds=1, **start)
    assert (done.returncode, done.stdout) == (0, "done\n")


def test_a_runaway_loop_is_stopped_by_its_cpu_limit_with_a_message_that_says_so(tmp_path, start):
    with pytest.raises(limits.TimeLimit) as caught:
        limits.run([sys.executable, "-c", "print('started', flush=True)\nwhile True: pass"], env={}, cwd=tmp_path,
                   rerun=RERUN, cpu_seconds=1, **start)
    text = str(caught.value)
    assert text.startswith("time limit: ") and "CPU-time limit of 1 s" in text, text
    assert "guard against a hang" in text and text.splitlines()[0].endswith(RERUN), text


def test_a_hang_is_stopped_by_its_wall_limit_with_a_message_that_says_so(tmp_path, start):
    started = time.monotonic()
    with pytest.raises(limits.TimeLimit) as caught:
        limits.run([sys.executable, "-c", "import sys, time; print('waiting', file=sys.stderr, flush=True); "
                    "time.sleep(60)"], env={}, cwd=tmp_path, rerun=RERUN, wall_seconds=1, **start)
    assert time.monotonic() - started < 30
    text = str(caught.value)
    assert "python -c was stopped because it ran past the wall-time limit of 1 s" in text, text
    assert text.splitlines()[0].endswith(RERUN) and text.splitlines()[-1] == "waiting", text


SCRIPT = """\
import json, os, sys
import helper  # from the job's PYTHONPATH
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": sorted(os.environ), "name": __name__,
                  "path": sys.path[:2], "helper": helper.__file__, "stdin": sys.stdin.read()}))
if sys.argv[1] == "raise":
    raise LookupError("the script's own error")
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.parametrize("ending", ["0", "3", "raise"])
def test_a_forked_child_is_the_process_a_plain_start_gives(tmp_path, zygote, ending):
    """Arguments, working directory, environment, sys.path, __main__, standard streams, exit status and
    an uncaught exception's traceback: the same, started plainly or forked (what the suite's vLLM
    processes rely on to be the processes a user starts)."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "helper.py").write_text("")
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    # LC_CTYPE set: in the C locale a plain start adds it (PEP 538's coercion); the suite's jobs carry
    # the pytest process's environment, where its own start-up has set it already
    env = {"PYTHONPATH": str(tmp_path / "lib"), "JOB_ONLY": "1", "PATH": os.environ.get("PATH", ""),
           "LC_CTYPE": "C.UTF-8"}
    runs = [limits.run([sys.executable, script, ending], env=env, cwd=tmp_path, rerun=RERUN, zygote=how)
            for how in (None, zygote)]
    plain, forked = runs
    assert forked.returncode == plain.returncode == {"0": 0, "3": 3, "raise": 1}[ending]
    assert json.loads(forked.stdout) == json.loads(plain.stdout), (forked.stdout, plain.stdout)
    if ending == "raise":
        for run in runs:
            assert run.stderr.count("Traceback (most recent call last):") == 1, run.stderr
            assert run.stderr.splitlines()[-1] == "LookupError: the script's own error", run.stderr
    else:
        assert forked.stderr == plain.stderr == ""


def test_a_zygote_that_dies_ends_its_waiting_jobs_with_an_error_that_says_so(tmp_path):
    """Never a test that waits forever on a child nobody will report."""
    doomed = Zygote(sys.executable, {"PATH": os.environ.get("PATH", "")})
    forked = doomed.spawn(["-c", "import time; time.sleep(5)"], env={}, cwd=tmp_path, cpu_seconds=10)
    doomed._proc.kill()
    with pytest.raises(RuntimeError, match="the suite's zygote process ended before its child: exit status -9"):
        forked.communicate(timeout=600)  # a hang guard only: the error comes at once
