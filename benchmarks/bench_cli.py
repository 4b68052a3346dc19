"""Cold start of ``dsv4sel explain``, and what a warm-cache explain imports.

Run: .venv/bin/python benchmarks/bench_cli.py [--runs N]

1. Imports: in this process, with a warm compiled-rules cache, run
   ``dsv4sel.cli.main(["explain", ...])`` and list any of torch, yaml,
   jsonschema in ``sys.modules`` afterwards (must be none).
2. Cold: wall time of N fresh ``dsv4sel explain`` processes (console script,
   warm rules cache), for a selection and for a rejection (which also computes
   the alternatives). Measured twice: with Python's bytecode cache (a normal
   install) and with PYTHONDONTWRITEBYTECODE=1 (every module compiled from
   source, as in this repository's sandbox). ``python -c pass`` is the floor.

Exit 1 when the median of any explain case exceeds the budget (150 ms) or a
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

BUDGET_MS = 150.0
FORBIDDEN = ("torch", "yaml", "jsonschema")
SELECT = ["explain", "--platform", "cuda", "--capability", "9.0", "--kv-cache-dtype", "auto"]
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


def time_processes(cmd: list[str], runs: int, env: dict[str, str]) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        times.append((time.perf_counter() - start) * 1000)
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
        floor = time_processes([sys.executable, "-c", "pass"], runs, env)
        print(f"  python -c pass             {summary(floor)}")
        for name, argv in (("explain (selects)", SELECT), ("explain (rejects)", REJECT)):
            times = time_processes(cmd + argv, runs, env)
            over = statistics.median(times) > BUDGET_MS
            failed |= over
            print(f"  dsv4sel {name:<18} {summary(times)}{'   OVER BUDGET' if over else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
