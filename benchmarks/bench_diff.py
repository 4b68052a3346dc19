"""``dsv4sel diff --pack`` against ``dsv4sel check`` on the example pack, in one run.

Run: .venv/bin/python benchmarks/bench_diff.py [--runs N]

Reviewing what a pack changes should cost about what checking it costs (issue 18: it was
7-10 s against check's 0.5 s). Both commands run as fresh processes with one warm
compiled-rules cache; the figure is the ratio of their median wall times, taken in the
same run so that the machine's load cancels out. Exit 1 when diff costs more than
``BUDGET_RATIO`` times check.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile

from bench_cli import dsv4sel_command, summary, time_processes

BUDGET_RATIO = 3.0
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACK = os.path.join(REPO, "examples", "b12x-pack")
DIFF = ["diff", "--pack", "--allow-impl-module", "dsv4sel_b12x", "-", os.path.join(PACK, "dsv4sel_b12x", "rules")]
CHECK = ["check"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="fresh processes per command (>= 5)")
    runs = max(parser.parse_args().runs, 5)
    cache = tempfile.mkdtemp(prefix="dsv4sel-bench-cache-")
    env = dict(os.environ, DSV4SEL_CACHE_DIR=cache, PYTHONPATH=PACK)
    cmd = dsv4sel_command()
    try:
        time_processes(cmd + DIFF, 1, env)  # compile both rule sets into the cache once
        diff, check = time_processes(cmd + DIFF, runs, env), time_processes(cmd + CHECK, runs, env)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    ratio = statistics.median(diff) / statistics.median(check)
    print(f"dsv4sel diff --pack  {summary(diff)}")
    print(f"dsv4sel check        {summary(check)}")
    print(f"diff / check         {ratio:.2f}x (budget {BUDGET_RATIO:.1f}x)")
    return 1 if ratio > BUDGET_RATIO else 0


if __name__ == "__main__":
    sys.exit(main())
