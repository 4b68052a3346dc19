"""What tools/vllm_env.py and tools/sglang_env.py share: a host's CPU test environment, built once.

Both build a virtual environment that holds one host's wheel (installed ``--no-deps``) beside torch
2.13.0 CPU. The shared steps live here:

- the command line (``--venv``, ``--wheel``, the wheel also from an environment variable, ``--log``);
- the stamp (a finished build does nothing the next time);
- the venv itself;
- the constraint file that pins torch on *every* pip call (:func:`Env.pip`), so no requirement
  ever resolves another torch (the hosts pin newer ones, and a CUDA build is several GB);
- the host's wheel, given or ``pip download --no-deps``-ed into the venv's ``dl/``;
- torch itself, then, after the host's own steps, the check and the stamp (:meth:`Env.finish`);
- progress: every step prints one line when it starts and one when it ends (with its wall time),
  so a build of several minutes says what it is doing. With ``--log FILE`` the commands and pip's
  own output go to FILE and the terminal sees only the step lines; a failing step prints the last
  lines of FILE and its path.

Each tool keeps only what differs: which packages its host's import chain needs.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TORCH = "torch==2.13.0"
ROOT = Path(__file__).resolve().parent.parent
#: Lines of the log a failing step shows on the terminal.
_TAIL = 25


class StepFailed(RuntimeError):
    """A build step's command exited non-zero; the step line and the log's tail are printed."""


@dataclass
class _Progress:
    """Where step lines and command output go: the label in front of every step line, the log."""

    label: str = "env"
    log: Path | None = None
    number: int = 0


_progress = _Progress()


def _say(text: str) -> None:
    line = f"[{_progress.label}] {text}"
    print(line, flush=True)
    if _progress.log is not None:
        with _progress.log.open("a") as f:
            f.write(line + "\n")


def step(title: str, *cmd: str) -> None:
    """Run one build step: a line when it starts, the command (its output to the log when there is
    one), a line when it ends. Raises :class:`StepFailed` when the command fails."""
    _progress.number += 1
    _say(f"step {_progress.number}: {title} ...")
    started = time.monotonic()
    if _progress.log is None:
        print("+", " ".join(cmd), flush=True)
        code = subprocess.run(cmd).returncode
    else:
        with _progress.log.open("a") as f:
            f.write("+ " + " ".join(cmd) + "\n")
            f.flush()
            code = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT).returncode
    took = time.monotonic() - started
    if code != 0:
        _say(f"step {_progress.number}: {title}: FAILED (exit {code}) after {took:.0f} s")
        if _progress.log is not None:
            tail = _progress.log.read_text(errors="replace").splitlines()[-_TAIL:]
            print("\n".join(tail), file=sys.stderr)
            print(f"(the whole output: {_progress.log})", file=sys.stderr)
        raise StepFailed(title)
    _say(f"step {_progress.number}: {title}: done in {took:.0f} s")



@dataclass(frozen=True)
class Env:
    """A host environment being built: its python, the pinned pip command and the host's wheel."""

    venv: Path
    stamp: Path
    dist: str
    version: str
    wheel: Path = Path(".")

    @property
    def python(self) -> str:
        return str(self.venv / "bin" / "python")

    @property
    def pip(self) -> list[str]:
        """``pip install`` with torch pinned by the constraint file."""
        return [self.python, "-m", "pip", "install", "-q", "--progress-bar", "off",
                "-c", str(self.venv / "constraints.txt")]

    def finish(self, check: str) -> int:
        """Run ``check`` (Python code printing torch's version, then the host's) in the venv; write
        the stamp when they are 2.13.0 and this host's version."""
        _say("checking the environment (import torch and the host) ...")
        out = subprocess.run([self.python, "-c", check], capture_output=True, text=True)
        words = out.stdout.split()
        if out.returncode != 0 or words[1:] != [self.version] or not words[0].startswith("2.13.0"):
            print(out.stdout + out.stderr, file=sys.stderr)
            print(f"error: {self.venv} does not hold torch 2.13.0 and {self.dist} {self.version}", file=sys.stderr)
            return 1
        self.stamp.write_text(f"torch {words[0]} {self.dist} {words[1]}\n")
        _say(f"{self.venv}: built ({self.stamp.read_text().strip()})")
        return 0


def parse_args(doc: str, default_venv: str, wheel_env: str,
               versions: tuple[str, ...] = ()) -> argparse.Namespace:
    """The shared command line; ``--version`` and ``--all`` only for a tool that builds more than
    one release."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    if versions:
        ap.add_argument("--version", default=versions[0], choices=versions,
                        help=f"the release to build (default {versions[0]})")
        ap.add_argument("--all", action="store_true",
                        help="every release not built yet, each logged to FOLDER.log; a failure is one warning")
    ap.add_argument("--venv", default=default_venv,
                    help="the environment's folder (default: the release's own, see --help's text)")
    ap.add_argument("--wheel", default=os.environ.get(wheel_env))
    ap.add_argument("--log", default=None,
                    help="write the commands' output here; the terminal gets one line per step")
    return ap.parse_args()


def prologue(args: argparse.Namespace, dist: str, version: str, stamp_name: str) -> Env | None:
    """Unless the stamp says the venv is built (None), create it, write the torch constraint,
    upgrade pip, find or download ``dist==version``'s wheel and install torch."""
    venv = (ROOT / args.venv).resolve()
    stamp = venv / stamp_name
    _progress.label = f"{dist} {version}"
    if args.log:
        _progress.log = (ROOT / args.log).resolve()
        _progress.log.write_text("")
    if stamp.exists():
        _say(f"{venv}: already built ({stamp.read_text().strip()})")
        return None
    _say(f"building {venv} (CPU torch, {dist} {version} --no-deps); pip's output: "
         f"{_progress.log or 'below'}")
    py = venv / "bin" / "python"
    if not py.exists():
        step("create the virtual environment", sys.executable, "-m", "venv", str(venv))
    constraints = venv / "constraints.txt"
    constraints.write_text(f"{TORCH}\n")
    step("upgrade pip", *Env(venv, stamp, dist, version).pip, "--upgrade", "pip")
    wheel = Path(args.wheel).resolve() if args.wheel else _download(venv, dist, version, constraints)
    env = Env(venv, stamp, dist, version, wheel)
    step(f"install {TORCH} (CPU)", *env.pip, TORCH)
    return env


def _download(venv: Path, dist: str, version: str, constraints: Path) -> Path:
    dl = venv / "dl"
    dl.mkdir(exist_ok=True)
    found = sorted(dl.glob(f"{dist}-{version}-*.whl"))
    if not found:
        step(f"download the {dist} {version} wheel (--no-deps)",
             str(venv / "bin" / "python"), "-m", "pip", "download", "-q", "--progress-bar", "off", "--no-deps",
             "-c", str(constraints), f"{dist}=={version}", "-d", str(dl))
        found = sorted(dl.glob(f"{dist}-{version}-*.whl"))
    return found[0]


def main_guard(build: object) -> int:
    """Run ``build()`` and turn a failed step into exit 1 (its lines are already printed)."""
    try:
        return int(build())  # type: ignore[operator]
    except StepFailed:
        return 1
