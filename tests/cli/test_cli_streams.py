"""The CLI exits cleanly whatever its output is: closed, full, ASCII-only, or
fed control characters through a query."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from _cli import COMMAND, environ, run

#: a pack whose one rule's reason is not ASCII
ACCENT_PACK = Path(__file__).with_name("rules") / "streams" / "accent"


def test_a_closed_stdout_is_a_clean_exit():
    proc = subprocess.run(COMMAND + ["check"], stdout=None, stderr=subprocess.PIPE, text=True, env=environ(),
                          preexec_fn=lambda: os.close(1))
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""


def test_a_full_disk_is_one_message_and_exit_2():
    for args in (["check"], ["table"], ["explain", "--platform", "cuda", "--capability", "9.0"]):
        with open("/dev/full", "w") as full:
            proc = subprocess.run(COMMAND + args, stdout=full, stderr=subprocess.PIPE, text=True, env=environ())
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr == "dsv4sel: cannot write the output: No space left on device\n", proc.stderr


def test_an_ascii_only_terminal_gets_escapes_not_a_crash(tmp_path):
    r = run("explain", "--rules", str(ACCENT_PACK), "--platform", "cuda", "--capability", "9.0",
            "--attention-backend", "ACCENT_DSV4", env=environ(PYTHONIOENCODING="ascii"))
    assert r.rc == 1, r
    text = r.out + r.err
    assert "r\\xe9serv\\xe9 aux tests \\u2014 never selects" in text, r
    assert "internal error" not in text


def test_control_characters_in_a_query_reach_the_terminal_escaped():
    r = run("explain", "--platform", "cuda", "--attention-backend", "\x1b[2J\x07EVIL")
    assert r.rc == 2, r
    assert "\x1b" not in r.out + r.err and "\x07" not in r.out + r.err
    assert "\\x1b[2J\\x07EVIL" in r.err, r


def test_a_closed_pipe_ends_quietly():
    proc = subprocess.Popen(COMMAND + ["check"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=environ())
    proc.stdout.read(10)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err
