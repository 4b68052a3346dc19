"""Probe (issue 21): what the padded-head copy costs beside FlashMLA's decode inside a CUDA graph.

    python benchmarks/kernels/probe_head_copy.py [--json out.json]

At h = 16 (padded to 64) ``run`` under a caller's CUDA graph is one copy kernel plus the raw call,
so its ratio to the raw call is (decode + copy node) / decode. Each variant is a graph of ``CALLS``
iterations of [prepare the padded ``q``; the raw call on it], timed by CUDA events per iteration,
median of ``ROUNDS`` replays, the variants interleaved; ``raw`` has no preparation, ``empty`` a
kernel that does nothing (the floor of any kernel node), ``pdl`` variants are launched with
programmatic dependent launch and wait on the previous kernel before touching memory.
"""

from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl
from _timing import dump, machine
from bench_flashmla_plan_run import TOPK, WINDOW, graphed
from probe_host_costs import SCALE, flashmla_setup

from dsv4sel.kernels.flashmla import flashmla_build

CALLS, ROUNDS = 20, 41


@triton.jit
def _empty(x):
    pass


@triton.jit
def _rows(q, out, heads, h_pad, ROWS: tl.constexpr, COLS: tl.constexpr, PDL: tl.constexpr):
    """Program ``p`` copies ``ROWS`` consecutive head rows of ``q`` (``heads`` per token) into ``out``."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    token = r // heads
    head = r - token * heads
    cols = tl.arange(0, COLS)
    src = q + (r * COLS)[:, None] + cols[None, :]
    dst = out + ((token * h_pad + head) * COLS)[:, None] + cols[None, :]
    tl.store(dst, tl.load(src))


@triton.jit
def _empty_pdl(x):
    tl.extra.cuda.gdc_wait()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    print(machine("cuda"), flush=True)
    lib = flashmla_build().module
    batch, heads = args.batch, 16
    impl, layers, tl_, etl, raw, _ = flashmla_setup(lib, batch, heads)
    plan = impl.plan(batch=batch, heads=heads, topk=WINDOW, extra_topk=TOPK, softmax_scale=SCALE,
                     topk_length=tl_, extra_topk_length=etl)
    q_src = layers[0]["q"]
    buf = torch.zeros(batch, 1, 64, 512, dtype=torch.bfloat16, device="cuda")
    rows = batch * heads

    def copier(rows_per_program, warps, pdl=False):
        grid = (rows // rows_per_program,)
        return lambda: _rows[grid](q_src, buf, heads, 64, ROWS=rows_per_program, COLS=512, PDL=pdl,
                                   num_warps=warps, launch_pdl=pdl)

    variants = {
        "raw": lambda: None,
        "empty kernel": lambda: _empty[(1,)](buf),
        "empty kernel, pdl": lambda: _empty_pdl[(1,)](buf, launch_pdl=True),
        "copy 1 row/program, 2 warps (run's)": copier(1, 2),
        "copy 1 row/program, 4 warps": copier(1, 4),
        "copy 2 rows/program, 4 warps": copier(2, 4),
        "copy 4 rows/program, 4 warps": copier(4, 4),
        "copy 16 rows/program, 8 warps": copier(16, 8),
        f"copy {rows} rows in 1 program, 8 warps": copier(rows, 8),
        "copy 1 row/program, 2 warps, pdl": copier(1, 2, pdl=True),
        "copy 4 rows/program, 4 warps, pdl": copier(4, 4, pdl=True),
        "torch copy_": lambda: buf[:, :, :heads].copy_(q_src),
    }
    # each copy variant must produce the padded q the raw call reads
    for name, prep in variants.items():
        if name.startswith("copy") or name.startswith("torch"):
            buf.zero_()
            prep()
            torch.cuda.synchronize()
            assert torch.equal(buf[:, :, :heads], q_src) and not buf[:, :, heads:].any(), name
    timers = {}  # name: a timer of one replay (seconds per call)
    for name, prep in variants.items():
        def step(_, prep=prep):
            prep()
            raw(buf)  # the raw call on the padded buffer
        try:
            timers[name] = graphed(step, CALLS)[1]
        except Exception as exc:  # noqa: BLE001 - one variant that cannot be captured must not cost the call
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
    c = [0]

    def run_step(_):
        i = c[0] = (c[0] + 1) & 3
        impl.run(**layers[i], plan=plan)
    timers["run (plan, under the graph)"] = graphed(run_step, CALLS)[1]
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(ROUNDS):
        for name, timed in timers.items():
            times[name].append(timed())
    med = {name: statistics.median(v) * 1e6 for name, v in times.items()}
    base = med["raw"]
    results = {}
    for name, us in med.items():
        results[name] = {"us": us, "over_raw_us": us - base, "ratio": us / base}
        print(f"{name:<44} {us:7.2f} µs  +{us - base:5.2f}  {us / base:.3f}x", flush=True)
    if args.json:
        dump(args.json, results)


if __name__ == "__main__":
    main()
