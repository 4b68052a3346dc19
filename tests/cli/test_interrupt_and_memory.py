"""Ctrl-C and too little memory end a command cleanly, at any moment (issue 32, point 11).

Once, SIGINT in the first half second printed a traceback, and about a second into ``check``
it became a false finding (``DSV406 ... cannot import dsv4sel.kernels.v41: KeyboardInterrupt``,
blaming a rule file); under a 16-32 MiB memory cap an ordinary MemoryError was "a bug" (exit
3), and a failed import "pip install jsonschema". Once the package had its bytecode (as an
installed one has), the same caps gave CPython's own failures: a fatal error while it normalized
a MemoryError, a loader that could not map ``_struct``, a report printed twice or not at all.
Now: exit 130 and nothing printed; exit 2 and one line saying "out of memory" (a cap that leaves
too little for any command: at once, naming the cap). Both run the real console script in a
subprocess."""

from __future__ import annotations

import re
import resource
import signal
import subprocess
import time
from pathlib import Path

import pytest

from _cli import COMMAND, environ
from _repo import REPO

REPO_PATH = Path(REPO)

#: How many moments of a ``check`` run SIGINT is sent at, spread from its imports to its end.
MOMENTS = 12
#: What the interpreter prints when SIGINT lands in its own start-up (its site module, the
#: environment's .pth files), before any dsv4sel code runs: out of dsv4sel's reach.
INTERPRETER_START = "Fatal Python error: init_import_site"

pytestmark = pytest.mark.skipif(len(COMMAND) != 1, reason="needs the installed dsv4sel console script")


def _interrupted(delay: float) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([*COMMAND, "check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environ(), cwd=REPO)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_ctrl_c_at_any_moment_of_check_exits_130_with_nothing_printed():
    start = time.monotonic()
    whole = subprocess.run([*COMMAND, "check"], capture_output=True, text=True, env=environ(), cwd=REPO, timeout=120)
    took = time.monotonic() - start
    assert whole.returncode == 0, whole.stderr[-2000:]
    handled = 0
    for delay in (took * (i + 0.5) / MOMENTS for i in range(MOMENTS)):
        done = _interrupted(delay)
        if INTERPRETER_START in done.stderr:
            continue
        if done.returncode == 0:  # finished before the signal came: nothing to judge
            continue
        # 130 from dsv4sel's own handling; killed by SIGINT before Python had its handler
        assert done.returncode in (130, -signal.SIGINT), (delay, done.returncode, done.stdout[-2000:], done.stderr)
        # nothing on stderr; on stdout at most the true report cut short (a Ctrl-C while it is
        # written), never a finding the whole run does not give
        assert whole.stdout.startswith(done.stdout) and done.stderr == "", (delay, done.stdout[-2000:], done.stderr)
        handled += done.returncode == 130
    assert handled >= MOMENTS // 2, f"only {handled} interrupts reached dsv4sel's code"


def _capped(mib: int):
    def limit() -> None:  # in the child, before exec
        resource.setrlimit(resource.RLIMIT_AS, (mib << 20, mib << 20))
    return limit


@pytest.fixture(scope="module")
def with_bytecode():
    """The checkout's bytecode, as an installed dsv4sel has its own (pip compiles it). Without it,
    under ``PYTHONDONTWRITEBYTECODE`` as on the test machine, CPython compiles each module as it
    imports, and its compiler, out of memory at a cap near the edge, can abort the process with
    "Cannot recover from MemoryErrors while normalizing exceptions" before any Python code could
    catch anything: the interpreter's limit, not the command's (docs/untrusted-input.md)."""
    import compileall

    for package in ("dsv4sel", "kernels"):
        assert compileall.compile_dir(str(REPO_PATH / package), quiet=1)


@pytest.mark.parametrize("command", [("check",), ("explain", "--platform", "cuda", "--rules", "examples/mistakes/clean")])
def test_too_little_memory_is_said_plainly_in_one_line_with_exit_2(command, tmp_path, with_bytecode):
    out_of_memory = 0
    said = set()
    for mib in (16, 20, 24, 28, 32, 36, 40):
        # a fresh cache: the rules compile (yaml, jsonschema), the costly path
        done = subprocess.run([*COMMAND, *command], capture_output=True, text=True, timeout=120, cwd=REPO,
                              env=environ(DSV4SEL_CACHE_DIR=str(tmp_path / f"cache{mib}")), preexec_fn=_capped(mib))
        text = done.stdout + done.stderr
        for wrong in ("Traceback", "internal error", "a bug", "pip install", "Fatal Python error"):
            assert wrong not in text, (mib, done.returncode, text[-3000:])
        if done.returncode == 2:
            (line,) = done.stderr.splitlines()
            assert "out of memory" in line and "give it more memory" in line, (mib, line)
            if "before the command starts" in line:  # refused at once: the cap leaves too little for any command
                assert line.startswith(f"dsv4sel: out of memory: this process's address space is limited to {mib} MiB"), line
            out_of_memory += 1
            said.add(line)
        else:  # a cap this command fits in: its real answer (the shipped rules check clean), no false finding
            assert done.returncode == 0, (mib, done.returncode, text[-3000:])
    assert out_of_memory, "no cap was tight enough to test anything"
    if command == ("check",):  # the lines docs/untrusted-input.md quotes: the command's, and the one at start
        doc = (REPO_PATH / "docs" / "untrusted-input.md").read_text()
        assert any(f"\n{line}\n" in doc for line in said if line.startswith("dsv4sel check: ")), said
        # what the interpreter maps before the command starts differs between machines: not compared
        taken = re.compile(r"\d+ MiB of it taken")
        at_start = {taken.sub("N MiB of it taken", line) for line in said if "before the command starts" in line}
        assert at_start & {taken.sub("N MiB of it taken", line) for line in doc.splitlines()}, at_start
