"""Run every benchmark in this folder, one fresh process each, and print their figures.

Run: make bench   (or .venv/bin/python benchmarks/run_all.py)
"""

from __future__ import annotations

import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = [
    ("this machine's speed now (read the figures below beside it)", ["machine_speed.py"]),
    ("select(): warm vs seed, cold start", ["bench_select.py"]),
    ("dsv4sel explain: cold CLI", ["bench_cli.py"]),
    ("dsv4sel diff --pack against check", ["bench_diff.py"]),
    ("dsv4sel check: verification scale", ["bench_verify.py"]),
    ("kernels: layout codecs (CPU)", ["kernels/bench_layouts.py", "--device", "cpu"]),
    ("kernels: reference decode (CPU)", ["kernels/bench_reference_decode.py", "--device", "cpu"]),
]


def main() -> int:
    failed = 0
    for title, (script, *args) in SCRIPTS:
        path = os.path.join(HERE, script)
        print(f"== {title} ({script}) ==", flush=True)
        if not os.path.exists(path):
            print(f"missing: {script}")
            failed += 1
            continue
        result = subprocess.run([sys.executable, path, *args], cwd=os.path.dirname(path))
        failed += result.returncode != 0
        print(flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
