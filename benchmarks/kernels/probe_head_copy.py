# ruff: noqa: B023 - every closure is called inside the iteration that made it
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
from probe_host_costs import flashmla_setup

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


def graph_us(step, calls=CALLS):
    """A timer of one replay of a graph of ``calls`` calls of ``step`` (µs per call)."""
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()

    def timed():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls

    return graph, timed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--batch", type=int, default=4)
    args = ap.parse_args()
    print(machine("cuda"), flush=True)
    lib = flashmla_build().module
    batch, heads = args.batch, 16
    impl, layers, tl_, etl, raw, counter = flashmla_setup(lib, batch, heads)
    from bench_flashmla_plan_run import TOPK, WINDOW
    from probe_host_costs import SCALE

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
    pages = (impl._pages(layers[0]["kv_cache"]), impl._pages(layers[0]["extra_kv_cache"]))
    sink = torch.nn.functional.pad(layers[0]["attn_sink"].float(), (0, 64 - heads)).contiguous()
    meta = lib.get_mla_metadata()[0]

    def decode():
        la = layers[0]
        return lib.flash_mla_with_kvcache(buf, pages[0], None, None, 512, meta, num_splits=None, softmax_scale=SCALE,
                                          causal=False, is_fp8_kvcache=True, indices=la["indices"], attn_sink=sink,
                                          extra_k_cache=pages[1], extra_indices_in_kvcache=la["extra_indices"],
                                          topk_length=tl_, extra_topk_length=etl)

    decode()
    timers = {}
    for name, prep in variants.items():
        def step(prep=prep):
            prep()
            decode()
        try:
            timers[name] = graph_us(step)
        except Exception as exc:  # noqa: BLE001 - one variant that cannot be captured must not cost the call
            print(f"{name}: FAILED {type(exc).__name__}: {exc}", flush=True)
    q_rows = [la["q"] for la in layers]
    c = [0]

    def run_step():
        i = c[0] = (c[0] + 1) & 3
        impl.run(q=q_rows[i], kv_cache=layers[0]["kv_cache"], indices=layers[0]["indices"],
                 extra_kv_cache=layers[0]["extra_kv_cache"], extra_indices=layers[0]["extra_indices"],
                 attn_sink=layers[0]["attn_sink"], plan=plan)
    timers["run (plan, under the graph)"] = graph_us(run_step)
    times: dict[str, list[float]] = {name: [] for name in timers}
    for _ in range(ROUNDS):
        for name, (_, timed) in timers.items():
            times[name].append(timed())
    med = {name: statistics.median(v) for name, v in times.items()}
    base = med["raw"]
    results = {}
    for name, us in med.items():
        results[name] = {"us": us, "over_raw_us": us - base, "ratio": us / base}
        print(f"{name:<44} {us:7.2f} µs  +{us - base:5.2f}  {us / base:.3f}x", flush=True)
    if args.json:
        dump(args.json, results)


if __name__ == "__main__":
    main()
