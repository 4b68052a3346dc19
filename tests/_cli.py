"""Run the ``dsv4sel`` command as a user does: a fresh process, real argv, real
exit status. Shared by the tests of explain, table and doctor."""

from __future__ import annotations

import atexit
import os
import pty
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
_SCRIPT = Path(sys.executable).with_name("dsv4sel")
#: The installed console script when there is one, else the same entry point through -c.
COMMAND = [str(_SCRIPT)] if _SCRIPT.exists() else [
    sys.executable, "-c", "import sys; from dsv4sel.cli import main; sys.exit(main())"]
ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: One compiled-rules cache for all CLI runs of the session: entries are keyed
#: by content hash, so sharing is safe, and it spares each run a 1 s compile.
SHARED_CACHE = tempfile.mkdtemp(prefix="dsv4sel-cli-cache-")
atexit.register(lambda: __import__("shutil").rmtree(SHARED_CACHE, ignore_errors=True))


class Result:
    def __init__(self, rc: int, out: str, err: str):
        self.rc, self.out, self.err = rc, out, err

    def __repr__(self) -> str:
        return f"Result(rc={self.rc}, out={self.out[:2000]!r}, err={self.err[:2000]!r})"


def environ(**overrides: str | None) -> dict[str, str]:
    """os.environ with the session's rules cache and no colour/platform
    settings, plus ``overrides``; None removes a variable."""
    env = dict(os.environ)
    env["DSV4SEL_CACHE_DIR"] = SHARED_CACHE
    env.pop("NO_COLOR", None)
    env.pop("DSV4SEL_PLATFORM", None)
    env.pop("DSV4SEL_CAPABILITY", None)
    env.pop("COLUMNS", None)  # a terminal's width comes from the test (readline exports COLUMNS)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def run(*args: str, env: dict[str, str] | None = None, cwd: str | Path | None = None,
        timeout: float = 120) -> Result:
    """Run ``dsv4sel ARGS`` with stdout and stderr piped. Never a traceback:
    every test that runs the CLI checks that on the way."""
    proc = subprocess.run(COMMAND + list(args), capture_output=True, text=True, env=env or environ(),
                          cwd=cwd or REPO, timeout=timeout)
    result = Result(proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, result
    return result


def run_tty(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
            both: bool = False) -> Result:
    """Run ``dsv4sel ARGS`` with stdout on a pseudo-terminal (stderr piped;
    with ``both``, stderr on the same terminal: ``out`` holds both)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(COMMAND + list(args), stdout=slave, stderr=slave if both else subprocess.PIPE,
                            env=env or environ(), cwd=REPO)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    err = "" if both else proc.stderr.read().decode()
    if not both:
        proc.stderr.close()
    rc = proc.wait(timeout=timeout)
    out = b"".join(chunks).decode().replace("\r\n", "\n")
    result = Result(rc, out, err)
    assert "Traceback" not in err, result
    return result


def rule_line(file: str, rule_id: str) -> int:
    """The 1-based line of ``- id: RULE_ID`` in ``rules/FILE``: tests derive
    locations from the files instead of hard-coding them."""
    for number, text in enumerate((REPO / "rules" / file).read_text().splitlines(), 1):
        if re.match(rf"\s*-\s+id:\s*{re.escape(rule_id)}\s*$", text):
            return number
    raise AssertionError(f"no rule {rule_id} in rules/{file}")
