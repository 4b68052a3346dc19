"""What tools/vllm_env.py and tools/sglang_env.py share: a host's CPU test environment, built once.

Both build a virtual environment that holds one host's wheel (installed ``--no-deps``) beside torch
2.13.0 CPU. The shared steps live here:

- the command line (``--venv``, ``--wheel``, the wheel also from an environment variable);
- the stamp (a finished build does nothing the next time);
- the venv itself;
- the constraint file that pins torch on *every* pip call (:func:`Env.pip`), so no requirement
  ever resolves another torch (the hosts pin newer ones, and a CUDA build is several GB);
- the host's wheel, given or ``pip download --no-deps``-ed into the venv's ``dl/``;
- torch itself, then, after the host's own steps, the check and the stamp (:meth:`Env.finish`).

Each tool keeps only what differs: which packages its host's import chain needs.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

TORCH = "torch==2.13.0"
ROOT = Path(__file__).resolve().parent.parent


def run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


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
        out = subprocess.run([self.python, "-c", check], capture_output=True, text=True)
        words = out.stdout.split()
        if out.returncode != 0 or words[1:] != [self.version] or not words[0].startswith("2.13.0"):
            print(out.stdout + out.stderr, file=sys.stderr)
            print(f"error: {self.venv} does not hold torch 2.13.0 and {self.dist} {self.version}", file=sys.stderr)
            return 1
        self.stamp.write_text(f"torch {words[0]} {self.dist} {words[1]}\n")
        print(f"{self.venv}: built ({self.stamp.read_text().strip()})")
        return 0


def prologue(doc: str, dist: str, version: str, default_venv: str, wheel_env: str,
             stamp_name: str) -> Env | None:
    """Parse the command line, and unless the stamp says the venv is built (None), create it,
    write the torch constraint, upgrade pip, find or download ``dist==version``'s wheel and
    install torch."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--venv", default=default_venv)
    ap.add_argument("--wheel", default=os.environ.get(wheel_env))
    args = ap.parse_args()
    venv = (ROOT / args.venv).resolve()
    stamp = venv / stamp_name
    if stamp.exists():
        print(f"{venv}: already built ({stamp.read_text().strip()})")
        return None
    py = venv / "bin" / "python"
    if not py.exists():
        run(sys.executable, "-m", "venv", str(venv))
    constraints = venv / "constraints.txt"
    constraints.write_text(f"{TORCH}\n")
    run(*Env(venv, stamp, dist, version).pip, "--upgrade", "pip")
    wheel = Path(args.wheel).resolve() if args.wheel else _download(venv, dist, version, constraints)
    env = Env(venv, stamp, dist, version, wheel)
    run(*env.pip, TORCH)
    return env


def _download(venv: Path, dist: str, version: str, constraints: Path) -> Path:
    dl = venv / "dl"
    dl.mkdir(exist_ok=True)
    found = sorted(dl.glob(f"{dist}-{version}-*.whl"))
    if not found:
        run(str(venv / "bin" / "python"), "-m", "pip", "download", "-q", "--progress-bar", "off", "--no-deps",
            "-c", str(constraints), f"{dist}=={version}", "-d", str(dl))
        found = sorted(dl.glob(f"{dist}-{version}-*.whl"))
    return found[0]
