"""Time limits for the suite's vLLM processes that a slow or busy machine never trips.

A child process is bounded two ways, both guards against a hang, neither a measure of speed:

- **CPU time** (``RLIMIT_CPU``, set in the child before it starts): a child stuck in a loop burns
  CPU and is stopped by the kernel (SIGXCPU) once it has used :data:`CPU_SECONDS`. CPU time does
  not grow when other processes share the cores, so load never brings a child closer to it;
  the limit sits far above what the longest child uses on any machine;
- **wall time** (:data:`WALL_SECONDS`): a child blocked without using CPU (a deadlock, a read that
  never returns) is stopped after an hour. On a 2-core machine kept busy by a dozen processes the
  longest child needs a fraction of that.

Either way the test fails with a message that says it was a time limit guarding against a hang,
which limit, the wall time the child had taken, and the command that reruns the one
test file alone.
"""
from __future__ import annotations

import resource
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from harness.zygote import Zygote

#: CPU seconds one child may use: about ten times what the longest (a CUDA differential) uses.
CPU_SECONDS = 1200
#: Wall-clock seconds one child may take, however loaded the machine.
WALL_SECONDS = 3600


class TimeLimit(AssertionError):
    """A child process ran past a time limit that guards against a hang."""


@dataclass(frozen=True)
class Finished:
    """A child that ended by itself: its exit status and output."""

    returncode: int
    stdout: str
    stderr: str


def _limit_cpu(seconds: int):
    def apply() -> None:
        # soft limit: SIGXCPU at `seconds`; hard limit a little later: SIGKILL if it is ignored
        resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 30))
    return apply


def run(cmd: list[str], *, env: dict[str, str], cwd: Path, rerun: str, cpu_seconds: int = CPU_SECONDS,
        wall_seconds: int = WALL_SECONDS, zygote: Zygote | None = None) -> Finished:
    """Run ``cmd`` to its end and return what it did; raise :class:`TimeLimit` (naming ``rerun``,
    the command that reruns the test that needs it) when it passes a limit. With ``zygote`` (a
    zygote of ``cmd[0]``, the same Python), the process is forked from it: the same limits hold."""
    started = time.monotonic()
    if zygote is not None:
        proc = zygote.spawn([str(part) for part in cmd[1:]], env=env, cwd=cwd, cpu_seconds=cpu_seconds)
    else:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                                preexec_fn=_limit_cpu(cpu_seconds))
    try:
        out, err = proc.communicate(timeout=wall_seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise TimeLimit(_message(cmd, f"it ran past the wall-time limit of {wall_seconds} s", rerun,
                                 time.monotonic() - started, err)) from None
    if proc.returncode == -signal.SIGXCPU:
        raise TimeLimit(_message(cmd, f"it reached its CPU-time limit of {cpu_seconds} s (stopped by "
                                 f"{signal.Signals(-proc.returncode).name})", rerun,
                                 time.monotonic() - started, err))
    return Finished(proc.returncode, out, err)


def _message(cmd: list[str], what: str, rerun: str, wall: float, err: str) -> str:
    # the script the child runs, else its program and first argument (`python -c`)
    script = next((Path(part).name for part in cmd[1:] if part.endswith(".py")),
                  " ".join([Path(cmd[0]).name, *cmd[1:2]]))
    tail = "\n".join(err.strip().splitlines()[-15:])
    return (f"time limit: {script} was stopped because {what} (after {wall:.0f} s of wall time). These limits "
            "guard against a hang; they are far above what a slow or busy machine needs, so this is most "
            f"likely a hang or a runaway loop, not slowness. Rerun the one test file alone: {rerun}"
            + (f"\nthe child's last lines:\n{tail}" if tail else ""))
