"""How the compiled form grows with the decision space.

Run: .venv/bin/python benchmarks/bench_compile.py [POINTS ...]

The shipped rules plus a pack that declares an input
``shard`` with ``n`` values and a backend ``SHARDED_DSV4`` whose eight rules
take interleaved, non-contiguous subsets of the shards (the worst case for
painting: no rule covers a run of shards). The space then has P x n
points (P: the shipped rules' points, measured), each with every backend
choice. For each size, in fresh processes:

- cold: ``load_rules()`` with an empty cache (YAML, schema, compile, write)
  plus the first ``select()``;
- warm: a new process reading that cache, then one ``select()``;
- per call: the memoized ``select()`` in that process.

Beyond :data:`dsv4sel.engine.artifact.MAX_INPUTS` the compiler refuses with one
RuleError; the last size shows that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

DEFAULT_SIZES = (10_000, 100_000, 1_000_000, 10_000_000)

VOCABULARY = """\
kind: vocabulary
inputs:
  shard:
    description: a synthetic input that multiplies the space
    default: s0
    values: [{values}]
"""

TABLE = """\
kind: backend
backends: [SHARDED_DSV4]
hit_policy: first
defaults:
  impl: dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl
  layout: fp8_ds_mla
  cache_dtype: fp8_ds_mla
  torch_dtype: uint8
  bytes_per_token: 584
  block_size: 256
rules:
{rules}
  - id: sharded-rest
    reject:
      reason: SHARDED_DSV4 does not serve shard {{shard}} with {{kv_cache_dtype}}.
"""

CHILD = r"""
import json, sys, time, timeit
t0 = time.perf_counter()
import dsv4sel, dsv4sel.engine.sources
try:
    rules = dsv4sel.load_rules(paths=[*dsv4sel.engine.sources.default_packs(), sys.argv[1]])
except dsv4sel.RuleError as exc:
    print(json.dumps({"error": str(exc.problems[0])}))
    raise SystemExit(0)
query = dict(platform="cuda", capability="9.0", kv_cache_dtype="fp8", shard="s1")
sel = dsv4sel.select(rules=rules, **query)
t1 = time.perf_counter()
per_call = min(timeit.repeat(lambda: dsv4sel.select(rules=rules, **query), number=20000, repeat=5)) / 20000
print(json.dumps({"first": t1 - t0, "per_call_us": per_call * 1e6, "inputs": rules.size,
                  "points": rules.size // (len(rules.backends) + 1),
                  "backend": sel.backend, "yaml": "yaml" in sys.modules}))
"""


def write_pack(directory: str, shards: int) -> None:
    names = [f"s{i}" for i in range(shards)]
    with open(os.path.join(directory, "shard.vocabulary.yaml"), "w") as fh:
        fh.write(VOCABULARY.format(values=", ".join(names)))
    rules = []
    for r in range(8):
        chosen = names[r::8][: max(1, shards // 16)]  # every 8th shard: no contiguous run
        if not chosen:
            continue
        rules.append(f"  - id: sharded-{r}\n    when: {{platform: cuda, shard: [{', '.join(chosen)}]}}\n"
                     "    select: {}")
    with open(os.path.join(directory, "sharded.yaml"), "w") as fh:
        fh.write(TABLE.format(rules="\n".join(rules)))


def run(pack: str, cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["DSV4SEL_CACHE_DIR"] = cache
    start = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD, pack], capture_output=True, text=True, env=env,
                         timeout=600)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    result = json.loads(out.stdout)
    result["wall"] = wall
    return result


def shipped_points() -> int:
    """Points of the shipped rules' space (inputs without the backend choice)."""
    import dsv4sel

    rules = dsv4sel.default_rules()
    return rules.size // (len(rules.backends) + 1)


def main(sizes) -> None:
    base = shipped_points()
    print(f"shipped rules: {base:,} points")
    print(f"{'points':>12} {'inputs':>13} {'cold first select':>18} {'warm first select':>18} "
          f"{'per call':>9}")
    for points in sizes:
        shards = max(1, round(points / base))
        with tempfile.TemporaryDirectory() as pack, tempfile.TemporaryDirectory() as cache:
            write_pack(pack, shards)
            cold = run(pack, cache)
            if "error" in cold:
                print(f"{base * shards:>12,} {'-':>13} refused: {cold['error'][:150]}...")
                continue
            warm = run(pack, cache)
        print(f"{cold['points']:>12,} {cold['inputs']:>13,} {cold['first']:>16.2f} s "
              f"{warm['first'] * 1e3:>15.1f} ms {warm['per_call_us']:>6.2f} us"
              + ("" if not warm["yaml"] else "  (warm start imported yaml!)"))


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or DEFAULT_SIZES)
