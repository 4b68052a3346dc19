"""Run jobs in forked children of a process that has imported SGLang once.

Importing SGLang 0.5.23 (with its stubs) costs about 10 s of CPU, and a process can hold one
platform only (SGLang reads the platform into module constants at import). So each platform's
process imports it once, then forks one child per job: the children share the parent's imported
modules copy-on-write and start in milliseconds, and what one child changes (the plugin it loads,
the hooks SGLang's HookRegistry applies, environment variables, a faked version) dies with it.
At most ``workers`` children run at once; each writes its JSON result to a file the parent reads.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import traceback
from typing import Any, Callable


def run_forked(jobs: list, run: Callable[[Any], Any], workers: int) -> list:
    """``[run(job) for job in jobs]``, each in a forked child, ``workers`` at a time, in order."""
    out: dict[int, Any] = {}
    running: dict[int, tuple[int, str]] = {}
    pending = list(enumerate(jobs))
    tmp = tempfile.mkdtemp(prefix="sglang523-jobs-")
    while pending or running:
        while pending and len(running) < workers:
            i, job = pending.pop(0)
            path = os.path.join(tmp, f"{i}.json")
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # the child: run, write, and leave without the parent's exit handlers
                code = 1
                try:
                    with open(path, "w") as f:
                        json.dump(run(job), f)
                    code = 0
                except BaseException:  # noqa: BLE001 - reported by the parent through the exit status
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            running[pid] = (i, path)
        pid, status = os.wait()
        i, path = running.pop(pid)
        if status != 0:
            raise RuntimeError(f"job {jobs[i]!r} failed (status {status}); its traceback is above")
        with open(path) as f:
            out[i] = json.load(f)
    return [out[i] for i in range(len(jobs))]


def chunks(items: list, n: int) -> list[list]:
    """``items`` in ``n`` contiguous parts of nearly equal length (contiguous: inputs of one device
    stay together, so a child changes the stubbed device rarely)."""
    size, extra = divmod(len(items), n)
    parts, start = [], 0
    for k in range(n):
        end = start + size + (1 if k < extra else 0)
        if end > start:
            parts.append(items[start:end])
        start = end
    return parts
