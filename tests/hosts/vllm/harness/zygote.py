"""One process per release that imports the libraries every vLLM process of the suite starts by
importing (torch, transformers, ...) and then forks a child for each job: the suite's vLLM
processes without paying those imports again each (a few seconds of CPU per process, over dozens
of processes on a 2-core machine).

A child is a new process that becomes ``python SCRIPT ARGS`` (or ``python -c CODE ARGS``) with the
job's environment, working directory, ``sys.path`` (its script's directory, then the job's
``PYTHONPATH``), standard streams and CPU-time limit, runs the script as ``__main__`` and ends
as the interpreter ends a script: exit status, uncaught traceback, ``atexit``. Nothing of vLLM,
dsv4sel or the suite is imported before the fork: the libraries preloaded are those that neither
read the platform nor the job's variables (vLLM's, dsv4sel's) when imported, torch's compiler with
the variables vLLM sets before it imports it (the suite compares its configuration in a forked
child with a plain process's: harness/plugin_tests.py); vLLM is imported by
each child, under its own stubbed platform. ``vllm serve`` is a child too: the engine core process
it spawns is a fresh interpreter that imports the job's script as ``__mp_main__``, as from a plain
start. A job that must not be forked runs as a plain process (:func:`harness.limits.run`
without a zygote).

    VENV/bin/python tests/hosts/vllm/harness/zygote.py [--preload torch,transformers]

Protocol, one JSON object per line: a job on stdin ``{"id", "argv", "env", "cwd", "out", "err",
"cpu"}``; on stdout ``{"id", "pid"}`` once it is forked and ``{"id", "status"}`` when it ended
(``status``: the exit code, minus the signal that ended it; ``cpu``: the CPU seconds it used). The zygote ends when its stdin
closes, after its last child. :class:`Zygote` is the pytest side (standard library only); with
``DSV4SEL_ZYGOTE_LOG=FILE`` set for pytest it appends each job's CPU seconds and command to FILE
(where the suite's CPU goes, job by job).
"""
from __future__ import annotations

import json
import os
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

#: What every vLLM process imports and none reads the platform or a job's variables for at import.
#: torch's compiler packages (dynamo, inductor) read variables at import that vLLM sets first
#: (:data:`VLLM_SETS_FIRST`): the zygote imports them with those set, as a vLLM process does.
#: vLLM would rather set its CUDA compatibility library path before torch loads: off by default, no CUDA here.
VLLM_PRELOAD = ("torch", "transformers", "transformers.configuration_utils", "transformers.models.auto", "sympy",
                "aiohttp", "pydantic", "cachetools", "msgspec", "torch.distributed.tensor", "torch._dynamo",
                "torch._inductor.lowering", "torch._inductor.decomposition", "transformers.image_processing_backends")
#: The variables vLLM's ``vllm/env_override.py`` sets when vLLM is imported, before it imports
#: torch's compiler (0.33 and 0.34 alike), and those it sets only where unset: the zygote's own
#: environment while it preloads (:func:`preload_env`). A job's child gets its own environment,
#: and vLLM sets them there.
VLLM_SETS_FIRST = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
VLLM_DEFAULTS_FIRST = {"TRITON_CACHE_AUTOTUNING": "1", "TILELANG_CLEANUP_TEMP_FILES": "1"}


def preload_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` as a vLLM process has it when vLLM imports torch's compiler."""
    return {**VLLM_DEFAULTS_FIRST, **env, **VLLM_SETS_FIRST}


# ------------------------------------------------------------------ the zygote (in the release's environment)
def _serve(preload: list[str]) -> dict:
    """Import ``preload``, then fork a child per job read on stdin; return only in a child, with its job."""
    import importlib

    for name in preload:
        importlib.import_module(name)
    jobs: dict[int, str] = {}  # pid -> job id
    pending = b""
    open_ = True
    while open_ or jobs:
        ready, _, _ = select.select([0] if open_ else [], [], [], 0.05)
        if ready:
            chunk = os.read(0, 65536)
            open_ = bool(chunk)
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                job = json.loads(line)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    return job
                jobs[pid] = job["id"]
                _answer({"id": job["id"], "pid": pid})
        while jobs:
            pid, status, usage = os.wait4(-1, os.WNOHANG)
            if pid == 0:
                break
            _answer({"id": jobs.pop(pid), "status": os.waitstatus_to_exitcode(status),
                     "cpu": round(usage.ru_utime + usage.ru_stime, 2)})
    raise SystemExit(0)


def _answer(message: dict) -> None:
    os.write(1, (json.dumps(message) + "\n").encode())


def _become(job: dict) -> None:
    """Turn this forked child into the job's process, as the interpreter starts a script."""
    cpu = job["cpu"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 30))  # as harness.limits sets it for a plain process
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, job["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, job["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        opened = os.open(path, flags, 0o600)
        os.dup2(opened, fd)
        os.close(opened)
    os.chdir(job["cwd"])
    os.environ.clear()
    os.environ.update(job["env"])
    argv = job["argv"]
    first = "" if argv[0] == "-c" else os.path.dirname(os.path.abspath(argv[0]))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *sys.path[1:]]  # the zygote's own sys.path[0] is this folder
    sys.argv = ["-c", *argv[2:]] if argv[0] == "-c" else list(argv)
    _rederive_compiler_paths()


def _rederive_compiler_paths() -> None:
    """The values torch's compiler derives at import from the working directory (and a variable),
    derived again as torch does for the job's: the zygote imported it in its own directory.
    plugin_tests.py compares the whole configuration of a forked child with a plain process's,
    so a value missing here fails the suite."""
    dynamo = sys.modules.get("torch._dynamo.config")
    if dynamo is not None:
        dynamo.debug_dir_root = dynamo.default_debug_dir_root()
    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None:
        inductor.xpu.cutlass_dir = os.path.realpath(os.environ.get("TORCHINDUCTOR_CUTLASS_DIR", ""))


def _run(job: dict) -> None:
    import runpy

    argv = job["argv"]
    if argv[0] == "-c":
        import types

        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        runpy.run_path(argv[0], run_name="__main__")


def main() -> None:
    preload = []
    if sys.argv[1:2] == ["--preload"]:
        preload = [name for name in sys.argv[2].split(",") if name]
    job = _serve(preload)
    _become(job)
    _run(job)


# ------------------------------------------------------------------ the pytest side
class ZygoteEnded(RuntimeError):
    """The zygote process ended before a job's child did."""


class Zygote:
    """A zygote process of ``python``, and the jobs it forked (thread-safe)."""

    def __init__(self, python: str, env: dict[str, str], preload: tuple[str, ...] = ()):
        self._dir = Path(tempfile.mkdtemp(prefix="dsv4sel-zygote-"))
        self._stderr = self._dir / "zygote.err"
        with self._stderr.open("wb") as err:  # a file: a pipe nobody reads until the end could fill
            self._proc = subprocess.Popen([python, __file__, "--preload", ",".join(preload)], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=err, env=env, cwd="/")
        self._lock = threading.Lock()
        self._jobs: dict[str, Forked] = {}
        self._count = 0
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def spawn(self, argv: list[str], *, env: dict[str, str], cwd: Path, cpu_seconds: int) -> Forked:
        """Start ``python *argv`` as a child of the zygote; a :class:`Forked` to wait for it."""
        with self._lock:
            self._count += 1
            job_id = str(self._count)
            forked = self._jobs[job_id] = Forked(self._dir / f"{job_id}.out", self._dir / f"{job_id}.err", argv)
            job = {"id": job_id, "argv": argv, "env": env, "cwd": str(cwd), "out": str(forked.out_path),
                   "err": str(forked.err_path), "cpu": cpu_seconds}
            try:
                self._proc.stdin.write((json.dumps(job) + "\n").encode())
                self._proc.stdin.flush()
            except OSError:
                forked.end(None)
        return forked

    def _read(self) -> None:
        for line in self._proc.stdout:
            message = json.loads(line)
            forked = self._jobs[message["id"]]
            if "pid" in message:
                forked.started(message["pid"])
            else:
                forked.cpu_seconds = message["cpu"]
                forked.end(message["status"])
                if os.environ.get("DSV4SEL_ZYGOTE_LOG"):  # where the suite's CPU goes, job by job
                    with open(os.environ["DSV4SEL_ZYGOTE_LOG"], "a") as log:
                        log.write(f"{forked.cpu_seconds:8.2f} {' '.join(forked.argv)[:200]}\n")
        # the zygote is gone: every child it has not reported ends with it
        self._proc.wait()
        said = self._stderr.read_text(errors="replace")
        for forked in list(self._jobs.values()):
            forked.end(None, f"exit status {self._proc.returncode}; {said}")

    def close(self) -> None:
        """End the zygote once its children have ended."""
        if self._proc.stdin and not self._proc.stdin.closed:
            self._proc.stdin.close()
        self._proc.wait()


class Forked:
    """One forked child, with the part of :class:`subprocess.Popen` that :func:`harness.limits.run` uses."""

    def __init__(self, out_path: Path, err_path: Path, argv: list[str]):
        self.out_path, self.err_path, self.argv = out_path, err_path, argv
        self.returncode: int | None = None
        #: the CPU seconds the child used, once it ended
        self.cpu_seconds: float | None = None
        self._pid: int | None = None
        self._ended = threading.Event()
        self._zygote_error = ""

    def started(self, pid: int) -> None:
        self._pid = pid

    def end(self, status: int | None, zygote_error: str = "") -> None:
        if not self._ended.is_set():
            self.returncode, self._zygote_error = status, zygote_error
            self._ended.set()

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """``(stdout, stderr)`` once the child ended; :class:`subprocess.TimeoutExpired` after ``timeout``."""
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired("zygote child", timeout or 0)
        if self.returncode is None:
            raise ZygoteEnded("the suite's zygote process ended before its child: " + self._zygote_error[-3000:])
        read = [p.read_text(errors="replace") if p.exists() else "" for p in (self.out_path, self.err_path)]
        for path in (self.out_path, self.err_path):
            path.unlink(missing_ok=True)
        return read[0], read[1]

    def kill(self) -> None:
        if self._pid is not None and not self._ended.is_set():
            try:
                os.kill(self._pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


if __name__ == "__main__":
    main()
