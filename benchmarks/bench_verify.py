"""How fast is ``dsv4sel check``'s analysis on big synthetic rule tables?

Run: .venv/bin/python benchmarks/bench_verify.py [--quick]

A synthetic Program (built directly, no YAML: this measures the verifier,
not the parser) has the shape of the real rules: model, platform,
capability scoped by platform (capability values form families such as
``3.x``), kv_cache_dtype (16 values) and 1-3 extra inputs sized to reach the
wanted number of points. One backend table of N rules tiles the space with
boxes (a grid of contiguous value ranges, some cells dropped: gaps), ~0.5%
of the boxes are widened into a neighbour (overlaps), every fifth rule
rejects, select rules differ in block size (so an overlap may be redundant
or conflicting). Under hit policy ``first`` the last rule is a catch-all
reject. The default table routes every input to that backend with ``use:``.
A stress row uses random boxes instead (each rule: 2-3 random inputs, 1-3
random values each), where millions of rule pairs overlap and the report
lists bounded, per-rule findings.

For each configuration it times ``dsv4sel.verify_program`` (the full
report: gaps, overlaps, redundancy, shadowed and dead rules, coverage, impl
and layout checks, findings with compact cubes and counterexamples; best of
3) and measures its peak traced memory (tracemalloc, a separate run). For
the smallest space it also times brute force: ``Program.resolve`` for every
input, which is what point enumeration costs.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import sys
import time
import tracemalloc

from dsv4sel.dsv4.profile import PROFILE  # noqa: E402
from dsv4sel.engine.model import DEFAULT_TABLE, InputDecl, Outcome, Program, Rule, Table
from dsv4sel.engine.values import RuleRef
from dsv4sel.check.verifier import verify_program

PLATFORMS = ("p0", "p1", "p2", "p3")
KV = tuple(f"kv{i:02d}" for i in range(16))
IMPL = "dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl"
BACKEND = "SYN"


def _chunks(values: tuple, n: int) -> list[tuple]:
    """``values`` cut into ``n`` contiguous, nearly equal chunks."""
    size, extra = divmod(len(values), n)
    out, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        out.append(values[start:end])
        start = end
    return out


def _extras(points: int, base: int) -> list[int]:
    """Sizes of the extra inputs so that base * prod(sizes) >= points."""
    need = max(1, math.ceil(points / base))
    count = 1 if need <= 64 else 2 if need <= 64 ** 2 else 3
    side = math.ceil(need ** (1 / count))
    sizes = [side] * count
    while base * math.prod(sizes[:-1]) * (sizes[-1] - 1) >= points and sizes[-1] > 1:
        sizes[-1] -= 1
    return sizes


def synthetic_program(points: int, rules: int, policy: str = "unique", seed: int = 0,
                      caps: int = 4, shape: str = "grid") -> Program:
    """A Program with >= ``points`` points and exactly ``rules`` rules in table SYN.

    ``shape="grid"`` tiles the space (see the module docstring);
    ``shape="random"`` gives every rule 2-3 random inputs constrained to 1-3
    random values each: a stress case where rules overlap by the million."""
    rng = random.Random(seed)
    cap_values = {p: tuple(f"{i + 1}.{j}" for j in range(caps)) for i, p in enumerate(PLATFORMS)}
    extra_sizes = _extras(points, len(PLATFORMS) * caps * len(KV))
    inputs = {
        "model": InputDecl("model", ("m",), default="m"),
        "platform": InputDecl("platform", PLATFORMS),
        "capability": InputDecl("capability", tuple(v for p in PLATFORMS for v in cap_values[p]),
                                "platform", tuple(cap_values.items())),
        "kv_cache_dtype": InputDecl("kv_cache_dtype", KV, default=KV[0]),
    }
    for i, size in enumerate(extra_sizes):
        name = f"e{i + 1}"
        inputs[name] = InputDecl(name, tuple(f"{name}v{j}" for j in range(size)), default=f"{name}v0")

    # grid blocks: grow the dimension with the most values per block until
    # the grid has enough cells
    grid_rules = rules - (1 if policy == "first" else 0)
    sizes = {"capability": caps, "kv_cache_dtype": len(KV), **{f"e{i + 1}": s for i, s in enumerate(extra_sizes)}}
    blocks = {name: 1 for name in sizes}
    while len(PLATFORMS) * math.prod(blocks.values()) < grid_rules:
        name = max((n for n in sizes if blocks[n] < sizes[n]), key=lambda n: sizes[n] / blocks[n])
        blocks[name] += 1
    axes = [[(("platform", frozenset([p])), ("capability", frozenset(c)))
             for p in PLATFORMS for c in _chunks(cap_values[p], blocks["capability"])]]
    for name in sizes:
        if name == "capability":
            continue
        values = inputs[name].values
        axes.append([((name, frozenset(c)),) if blocks[name] > 1 else () for c in _chunks(values, blocks[name])])
    cells = [()]
    for axis in axes:
        cells = [cell + part for cell in cells for part in axis]
    keep = sorted(rng.sample(range(len(cells)), grid_rules))  # the dropped cells are gaps
    conditions = [dict(cells[i]) for i in keep]
    kv_chunks = _chunks(KV, blocks["kv_cache_dtype"])
    for cond in rng.sample(conditions, max(1, grid_rules // 200)):  # overlaps: widen into a neighbour
        own = cond.get("kv_cache_dtype", frozenset(KV))
        nxt = next((c for c in kv_chunks if min(c) > max(own)), kv_chunks[0])
        cond["kv_cache_dtype"] = own | {nxt[0]}
    if shape == "random":
        names = [n for n in inputs if n != "model"]
        conditions = [{n: frozenset(rng.sample(inputs[n].values, min(len(inputs[n].values), rng.randint(1, 3))))
                       for n in rng.sample(names, rng.randint(2, 3))} for _ in range(grid_rules)]

    table = Table(BACKEND, (BACKEND,), policy, "synthetic/syn.yaml", 1)
    all_rules: list[Rule] = []
    for i, cond in enumerate(conditions):
        ref = RuleRef(f"r{i}", "synthetic/syn.yaml", 2 + 3 * i)
        if i % 5 == 4:
            outcome = Outcome("reject", reason="synthetic rejection")
        else:
            fields = (("block_size", 64 << (i % 4)), ("bytes_per_token", 584), ("cache_dtype", "fp8_ds_mla"),
                      ("impl", IMPL), ("layout", "fp8_ds_mla"), ("torch_dtype", "uint8"), ("rewrites", {}))
            outcome = Outcome("select", fields=fields)
        order = list(inputs)
        table.rules.append(Rule(ref, BACKEND, i, tuple(sorted(cond.items(), key=lambda c: order.index(c[0]))),
                                outcome))
    if policy == "first":
        table.rules.append(Rule(RuleRef("catch-all", "synthetic/syn.yaml", 2 + 3 * len(conditions)), BACKEND,
                                len(conditions), (), Outcome("reject", reason="nothing else matched")))
    all_rules.extend(table.rules)
    default = Table(DEFAULT_TABLE, (), "first", "synthetic/defaults.yaml", 1)
    default.rules.append(Rule(RuleRef("route", "synthetic/defaults.yaml", 2), DEFAULT_TABLE, 0, (),
                              Outcome("use", target=BACKEND)))
    return Program(inputs, default, {BACKEND: table}, (BACKEND,), [*default.rules, *all_rules],
                   ("dsv4sel.kernels",), ("synthetic/defaults.yaml", "synthetic/syn.yaml"), PROFILE)


def measure(program: Program, repeat: int = 3) -> dict:
    best = math.inf
    report = None
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        report = verify_program(program)
        best = min(best, time.perf_counter() - t0)
    gc.collect()
    tracemalloc.start()
    verify_program(program)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    kinds: dict[str, int] = {}
    for f in report.findings:
        kinds[f.kind] = kinds.get(f.kind, 0) + 1
    return {"seconds": best, "peak_mib": peak / 2 ** 20, "report": report, "kinds": kinds}


def brute_force(program: Program) -> float:
    t0 = time.perf_counter()
    for point in program.points():
        for backend in (None, *program.backends):
            program.resolve(backend, point)
    return time.perf_counter() - t0


def row(label: str, program: Program, result: dict, brute: float | None = None) -> str:
    cov = result["report"].coverage
    k = result["kinds"]
    findings = " ".join(f"{n}={k[n]}" for n in ("gap", "overlap", "redundant", "shadowed", "dead") if n in k)
    brute_text = f"{brute:9.2f}" if brute is not None else "        -"
    return (f"{label:<28} {len(program.rules) - 1:>6} {cov.points:>10} {cov.inputs:>10} "
            f"{result['seconds']:8.3f} {result['peak_mib']:8.1f} {brute_text}  {findings}")


HEADER = (f"{'configuration':<28} {'rules':>6} {'points':>10} {'inputs':>10} {'time s':>8} "
          f"{'peak MiB':>8} {'brute s':>9}  findings")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip the 10^7-point configuration")
    args = parser.parse_args(argv)
    verify_program(synthetic_program(1000, 10))  # imports the kernels modules once, outside the timings
    print(f"python {sys.version.split()[0]}; time = best of 3 verify_program() runs, "
          "peak = tracemalloc peak of one run")
    print(HEADER)
    for policy in ("unique", "first"):
        program = synthetic_program(1_000_000, 10_000, policy)
        print(row(f"headline, hit policy {policy}", program, measure(program)))
    for policy in ("unique", "first"):
        program = synthetic_program(1_000_000, 10_000, policy, shape="random")
        print(row(f"random boxes, {policy}", program, measure(program)))
    print()
    print("rules grow, ~10^6 points, hit policy unique")
    print(HEADER)
    for n in (100, 300, 1_000, 3_000, 10_000):
        program = synthetic_program(1_000_000, n)
        print(row(f"{n} rules", program, measure(program)))
    print()
    print("points grow, 1,000 rules, hit policy unique")
    print(HEADER)
    for exp in (4, 5, 6, 7):
        if args.quick and exp == 7:
            continue
        program = synthetic_program(10 ** exp, 1_000)
        brute = brute_force(program) if exp == 4 else None
        print(row(f"10^{exp} points", program, measure(program), brute))
    return 0


if __name__ == "__main__":
    sys.exit(main())
