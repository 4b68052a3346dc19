"""Cold start of ``dsv4sel explain``, and what a warm-cache explain imports.

Run: .venv/bin/python benchmarks/bench_cli.py [--runs N]

1. Imports: in this process, with a warm compiled-rules cache, run
   ``dsv4sel.cli.main(["explain", ...])`` and list any of torch, yaml,
   jsonschema in ``sys.modules`` afterwards (must be none).
2. Cold: wall time of N fresh ``dsv4sel explain`` processes (console script,
   warm rules cache), for two selections (issue 19's figure is the fp8 one) and
   for a rejection (which also computes the alternatives). Measured twice: with Python's bytecode cache (a normal
   install) and with PYTHONDONTWRITEBYTECODE=1 (every module compiled from
   source, as in this repository's sandbox). ``python -c pass`` is the floor.

Exit 1 when the median of any explain case exceeds the budget (80 ms, issue 19's figure) or a
forbidden module was imported.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

BUDGET_MS = 80.0
FORBIDDEN = ("torch", "yaml", "jsonschema")
SELECT = ["explain", "--platform", "cuda", "--capability", "9.0", "--kv-cache-dtype", "auto"]
SELECT_FP8 = ["explain", "--platform", "cuda", "--capability", "9.0", "--kv-cache-dtype", "fp8"]
REJECT = ["explain", "--platform", "cuda", "--capability", "10.0", "--kv-cache-dtype", "bfloat16"]


def dsv4sel_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "dsv4sel")
    if os.path.exists(script):
        return [script]
    return [sys.executable, "-c", "import sys; from dsv4sel.cli import main; sys.exit(main())"]


def imports_after_warm_explain() -> list[str]:
    """Run explain in this process (the cache is warm) and report forbidden imports."""
    from dsv4sel.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        rc = main(REJECT)
    assert rc == 1, rc
    return sorted(m for m in sys.modules if m.split(".")[0] in FORBIDDEN)


def time_processes(cmds: list[list[str]], runs: int, env: dict[str, str]) -> list[list[float]]:
    """Wall times in ms of ``runs`` fresh processes of each command, run in turn (A B C A B C ...),
    so that a change in the machine's load reaches every command alike."""
    times: list[list[float]] = [[] for _ in cmds]
    for _ in range(runs):
        for cmd, out in zip(cmds, times):
            start = time.perf_counter()
            proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            out.append((time.perf_counter() - start) * 1000)
            if proc.returncode not in (0, 1):
                raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stderr.decode()}")
    return times


def summary(times: list[float]) -> str:
    q = statistics.quantiles(times, n=10)
    return (f"median {statistics.median(times):6.1f} ms   min {min(times):6.1f}   p90 {q[-1]:6.1f}   "
            f"(n={len(times)})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=25, help="fresh processes per case (>= 20)")
    args = parser.parse_args()
    runs = max(args.runs, 20)

    cache = tempfile.mkdtemp(prefix="dsv4sel-bench-cache-")
    pycache = tempfile.mkdtemp(prefix="dsv4sel-bench-pyc-")
    os.environ["DSV4SEL_CACHE_DIR"] = cache  # this process and its children share one warm cache
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "NO_COLOR")}
    cmd = dsv4sel_command()
    subprocess.run(cmd + SELECT, stdout=subprocess.DEVNULL, env=base, check=True)  # compile the rules once

    try:
        return measure(cmd, runs, base, pycache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(pycache, ignore_errors=True)


def measure(cmd: list[str], runs: int, base: dict[str, str], pycache: str) -> int:
    failed = False
    bad = imports_after_warm_explain()
    print(f"warm-cache explain imports of {', '.join(FORBIDDEN)}: {', '.join(bad) if bad else 'none'}")
    failed |= bool(bad)

    print(f"machine: {os.cpu_count()} CPUs, Python {sys.version.split()[0]}; budget {BUDGET_MS:.0f} ms median")
    modes = [
        ("bytecode cache (normal install)", {**base, "PYTHONPYCACHEPREFIX": pycache}),
        ("no bytecode (PYTHONDONTWRITEBYTECODE=1)", {**base, "PYTHONDONTWRITEBYTECODE": "1"}),
    ]
    for label, env in modes:
        subprocess.run(cmd + SELECT, stdout=subprocess.DEVNULL, env=env, check=True)  # write .pyc if allowed
        print(f"\n{label}")
        cases = (("explain (selects)", SELECT), ("explain (selects, fp8)", SELECT_FP8),
                 ("explain (rejects)", REJECT))
        floor, *timed = time_processes([[sys.executable, "-c", "pass"], *(cmd + argv for _, argv in cases)],
                                       runs, env)
        print(f"  python -c pass                  {summary(floor)}")
        for (name, _), times in zip(cases, timed):
            over = statistics.median(times) > BUDGET_MS
            failed |= over
            print(f"  dsv4sel {name:<23} {summary(times)}{'   OVER BUDGET' if over else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
