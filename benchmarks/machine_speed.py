"""How fast this machine runs plain Python right now: the CPU seconds of one fixed workload.

Run: .venv/bin/python benchmarks/machine_speed.py

The test machine is a VM whose speed moves through the day (the same suite, the same code, one
CPU figure an hour later a quarter higher). A suite timing means something beside this figure,
taken just before and after it: README's timing table gives both. The workload is dict updates,
int-to-str and a sort, what the suite's Python does most; it allocates a few MB and no more.
"""

from __future__ import annotations

import time


def workload() -> int:
    counts: dict[int, int] = {}
    for i in range(3_000_000):
        counts[i % 1000] = counts.get(i % 1000, 0) + len(str(i))
    return len(sorted(str(x) for x in range(300_000))) + sum(counts.values())


def main() -> int:
    start = time.process_time()
    workload()
    print(f"machine speed: {time.process_time() - start:.2f} s of CPU for the fixed workload (lower is faster)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
