"""Warm select() against the seed's hand-written functions, and the cold start.

Run: .venv/bin/python benchmarks/bench_select.py

1. Warm: per-call time of ``dsv4sel.select()`` vs the seed's
   ``select_impl() + resolve_kv_cache_dtype()`` (seed_baseline.py), in one
   process, interleaved rounds, median of rounds. Reported as a ratio.
2. Cold: ``import dsv4sel`` + first ``select()`` in fresh processes with a warm
   compiled cache (median of 25), and which heavy modules got imported.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import timeit
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import dsv4sel  # noqa: E402
import seed_baseline as seed  # noqa: E402

ROUNDS, NUMBER = 15, 200_000


def warm() -> dict[str, float]:
    config = SimpleNamespace(attention_config=SimpleNamespace(backend=None),
                             cache_config=SimpleNamespace(cache_dtype="fp8_ds_mla"))

    def seed_call():
        seed.select_impl(config)
        seed.resolve_kv_cache_dtype(None, "fp8_ds_mla", None)

    def dsv4sel_call():
        dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="fp8_ds_mla")

    dsv4sel_call()
    results: dict[str, list[float]] = {"seed": [], "dsv4sel.select": []}
    for _ in range(ROUNDS):  # interleave so drift hits both alike
        results["seed"].append(timeit.timeit(seed_call, number=NUMBER) / NUMBER)
        results["dsv4sel.select"].append(timeit.timeit(dsv4sel_call, number=NUMBER) / NUMBER)
    return {k: statistics.median(v) * 1e6 for k, v in results.items()}


COLD_CODE = """
import time, sys
t0 = time.perf_counter()
import dsv4sel
dsv4sel.select(platform="cuda", capability="9.0", kv_cache_dtype="auto")
t1 = time.perf_counter()
heavy = [m for m in ("torch", "yaml", "jsonschema") if m in sys.modules]
print((t1 - t0) * 1e3, ",".join(heavy) or "-")
"""


def cold(runs: int = 25) -> tuple[float, float, str]:
    # as an installed package runs: with bytecode (a PYTHONDONTWRITEBYTECODE
    # shell would otherwise make every run compile dsv4sel from source)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", COLD_CODE], check=True, capture_output=True, env=env)  # fill the caches
    times, heavy = [], set()
    for _ in range(runs):
        out = subprocess.run([sys.executable, "-c", COLD_CODE], check=True, capture_output=True,
                             text=True, env=env).stdout.split()
        times.append(float(out[0]))
        heavy.add(out[1])
    return statistics.median(times), max(times), ",".join(sorted(heavy))


def main() -> None:
    w = warm()
    ratio = w["dsv4sel.select"] / w["seed"]
    print(f"warm  seed select_impl+resolve_kv : {w['seed']:.3f} us/call")
    print(f"warm  dsv4sel.select()            : {w['dsv4sel.select']:.3f} us/call  (ratio {ratio:.2f}x of seed)")
    median, worst, heavy = cold()
    print(f"cold  import dsv4sel + 1st select : {median:.1f} ms median, {worst:.1f} ms max "
          f"(heavy modules imported: {heavy})")


if __name__ == "__main__":
    main()
