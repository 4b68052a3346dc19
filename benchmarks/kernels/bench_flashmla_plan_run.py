"""dsv4sel's FlashMLA adapter against the raw ``flash_mla_with_kvcache`` call, in one process.

    python benchmarks/kernels/bench_flashmla_plan_run.py            # b=64, h=64, top-k 128 + 512
    python benchmarks/kernels/bench_flashmla_plan_run.py --batch 1,64,128 --heads 64,128 --json out.json

Shape per request: one query token, 128 sliding-window slots (``indices`` into
a window cache) plus 512 top-k slots (``extra_indices`` into a compressed
cache), both fp8_ds_mla pages of 64 tokens, a per-head sink, int32 indices and
per-request lengths (``topk_length`` = 128, ``extra_topk_length`` drawn in
256..512), as a serving engine passes them.

Timed, per call:

* ``raw``: ``flash_mla_with_kvcache`` with a ``sched_meta`` planned once and
  reused (what an engine that plans once per step calls), page views made once;
* ``raw, fresh meta``: the same with a new ``sched_meta`` every call (FlashMLA
  then re-runs its planning kernel);
* ``run``: ``impl.run(...)`` with one ``impl.plan(...)`` (eager, for a plan of at most
  ``MAX_REPLAY_ROWS`` query rows: the replay of a graph captured once per cache pair,
  ``flashmla_replay``);
* ``run, op called directly``: the same on a plan made with ``$DSV4SEL_FLASHMLA_REPLAY=off``;
* ``forward_decode``: the one-shot API, called again with the same shapes (its kept plan's run);
* ``plan``: ``impl.plan(...)`` alone (once per step, shared by every layer).

Eager: ``--calls`` back-to-back calls (distinct layers' caches and indices,
round robin), then one synchronize; wall time / calls: whichever of host and
GPU is slower sets it. Graph: the same ``--calls`` calls captured in one CUDA
graph, replayed; CUDA-event time / calls. Every figure is the median of
``--rounds`` rounds, variants interleaved within a round. Ratios are against
``raw`` in the same mode.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from _timing import dump, machine, markdown

from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl, flashmla_build
from dsv4sel.kernels.flashmla_replay import REPLAY_ENV

WINDOW, TOPK, BLOCK = 128, 512, 64


def make_layer(impl, batch, heads, gen, device):
    window = impl.allocate_kv_cache(-(-batch * WINDOW // BLOCK), device=device)
    comp = impl.allocate_kv_cache(batch * 2048 // BLOCK, device=device)
    for cache in (window, comp):
        n = cache.shape[0] * BLOCK
        impl.write_kv(cache, torch.randn(n, 512, generator=gen).to(device), torch.arange(n, device=device))
    req = torch.arange(batch).view(batch, 1, 1)
    idx = (req * WINDOW + torch.arange(WINDOW).view(1, 1, WINDOW)).int().to(device)
    top = torch.argsort(torch.rand(batch, 2048, generator=gen), dim=-1)[:, :TOPK].view(batch, 1, TOPK)
    extra = (req * 2048 + top).int().to(device)
    q = torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16).to(device)
    sink = torch.randn(heads, generator=gen).to(device)
    return dict(q=q, kv_cache=window, indices=idx, extra_kv_cache=comp, extra_indices=extra, attn_sink=sink)


def eager(fn, calls):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(calls):
        fn(i)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls


def graphed(fn, calls):
    """A CUDA graph of ``calls`` calls, and a timer for one replay (seconds per call)."""
    for i in range(calls):  # warm up outside the capture
        fn(i)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for i in range(calls):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    torch.cuda.synchronize()

    def timed():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / calls

    return graph, timed


def bench_shape(batch, heads, args, device):
    gen = torch.Generator().manual_seed(batch * 1000 + heads)
    impl = DeepseekV4FlashMLASparseImpl("fp8_ds_mla", BLOCK)
    lib = flashmla_build().module
    layers = [make_layer(impl, batch, heads, gen, device) for _ in range(args.layers)]
    scale = 512**-0.5
    topk_length = torch.full((batch,), WINDOW, dtype=torch.int32, device=device)
    extra_topk_length = torch.randint(256, TOPK + 1, (batch,), generator=gen, dtype=torch.int32).to(device)
    pages = [(impl._pages(layer["kv_cache"]), impl._pages(layer["extra_kv_cache"])) for layer in layers]
    # The raw call takes only 64 or 128 heads: at other counts it gets q and the sink padded once,
    # outside the timing (what a caller that pads itself would hand it).
    h_raw = 64 if heads <= 64 else 128
    sinks = [torch.nn.functional.pad(layer["attn_sink"].float(), (0, h_raw - heads)).contiguous() for layer in layers]
    raw_q = [torch.nn.functional.pad(layer["q"], (0, 0, 0, h_raw - heads)).contiguous() for layer in layers]

    def raw_call(i, meta):
        layer, (kc, ec) = layers[i % len(layers)], pages[i % len(layers)]
        return lib.flash_mla_with_kvcache(
            raw_q[i % len(layers)], kc, None, None, 512, meta, num_splits=None, softmax_scale=scale, causal=False,
            is_fp8_kvcache=True, indices=layer["indices"], attn_sink=sinks[i % len(layers)], extra_k_cache=ec,
            extra_indices_in_kvcache=layer["extra_indices"], topk_length=topk_length,
            extra_topk_length=extra_topk_length,
        )

    raw_meta = lib.get_mla_metadata()[0]
    raw_call(0, raw_meta)  # plans raw_meta once
    plan = impl.plan(batch=batch, heads=heads, topk=WINDOW, extra_topk=TOPK, softmax_scale=scale,
                     topk_length=topk_length, extra_topk_length=extra_topk_length)
    # The same plan with eager run calling the op directly (no graph replay), for comparison.
    os.environ[REPLAY_ENV] = "off"
    try:
        direct = impl.plan(batch=batch, heads=heads, topk=WINDOW, extra_topk=TOPK, softmax_scale=scale,
                           topk_length=topk_length, extra_topk_length=extra_topk_length)
    finally:
        del os.environ[REPLAY_ENV]

    # Same numbers first: the adapter's run is the raw call.
    ref_out, ref_lse = raw_call(0, raw_meta)
    got = impl.run(**layers[0], plan=plan)
    same = torch.equal(got.out, ref_out[:, :, :heads]) and torch.equal(got.lse, ref_lse.transpose(1, 2)[:, :, :heads])
    fwd = impl.forward_decode(softmax_scale=scale, topk_length=topk_length, extra_topk_length=extra_topk_length,
                              **layers[0])
    same = same and torch.equal(fwd.out, got.out) and torch.equal(fwd.lse, got.lse)
    got = impl.run(**layers[0], plan=direct)
    same = same and torch.equal(got.out, fwd.out) and torch.equal(got.lse, fwd.lse)

    for _ in range(3):  # forward_decode's first call plans; the timed ones reuse that plan
        impl.forward_decode(softmax_scale=scale, topk_length=topk_length, extra_topk_length=extra_topk_length,
                            **layers[0])
    variants = {
        "raw": lambda i: raw_call(i, raw_meta),
        "raw, fresh meta": lambda i: raw_call(i, lib.get_mla_metadata()[0]),
        "run": lambda i: impl.run(**layers[i % len(layers)], plan=plan),
        "run, op called directly": lambda i: impl.run(**layers[i % len(layers)], plan=direct),
        "forward_decode (again, same shapes)": lambda i: impl.forward_decode(
            softmax_scale=scale, topk_length=topk_length, extra_topk_length=extra_topk_length,
            **layers[i % len(layers)],
        ),
        "plan": lambda i: impl.plan(batch=batch, heads=heads, topk=WINDOW, extra_topk=TOPK, softmax_scale=scale,
                                    topk_length=topk_length, extra_topk_length=extra_topk_length),
    }
    graphed_names = ["raw", "run"]
    if plan.query_buffer is not None:  # padded heads: q written straight into the plan's buffer
        qbuf = plan.query_buffer
        variants["run, q in plan.query_buffer"] = lambda i: impl.run(**{**layers[i % len(layers)], "q": qbuf},
                                                                    plan=plan)
        graphed_names.append("run, q in plan.query_buffer")
    graphs = {name: graphed(variants[name], args.calls) for name in graphed_names}
    plan_calls = max(3, args.calls // 10)
    eager_t = {name: [] for name in variants}
    graph_t = {name: [] for name in graphs}
    for _ in range(args.rounds):
        for name, fn in variants.items():
            calls = plan_calls if name == "plan" else args.calls
            eager(fn, 3)
            eager_t[name].append(eager(fn, calls))
        for name, (_, timed) in graphs.items():
            timed()
            graph_t[name].append(timed())
    rows = []
    raw_e = statistics.median(eager_t["raw"])
    raw_g = statistics.median(graph_t["raw"])
    for name in variants:
        e = statistics.median(eager_t[name])
        row = {"batch": batch, "heads": heads, "variant": name, "eager_us": e * 1e6, "eager_ratio": e / raw_e,
               "graph_us": "", "graph_ratio": ""}
        if name in graph_t:
            g = statistics.median(graph_t[name])
            row["graph_us"], row["graph_ratio"] = g * 1e6, g / raw_g
        rows.append(row)
    return rows, same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", default="64")
    parser.add_argument("--heads", default="64")
    parser.add_argument("--layers", type=int, default=4, help="distinct layers' caches, used round robin")
    parser.add_argument("--calls", type=int, default=60, help="calls per timed block (and per captured graph)")
    parser.add_argument("--rounds", type=int, default=11)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = "cuda"
    build = flashmla_build()
    ok, reason = DeepseekV4FlashMLASparseImpl.is_available()
    if not ok:
        raise SystemExit(f"FlashMLA cannot run here: {reason}")
    rows, checks = [], []
    for b in [int(x) for x in args.batch.split(",")]:
        for h in [int(x) for x in args.heads.split(",")]:
            shape_rows, same = bench_shape(b, h, args, device)
            rows += shape_rows
            checks.append({"batch": b, "heads": h, "run_equals_raw_bitwise": same})
    print(f"# FlashMLA adapter vs raw flash_mla_with_kvcache, {machine(device)}")
    print(f"# build: {build.describe()}")
    print(f"# top-k {WINDOW} window + {TOPK} compressed, block {BLOCK}, {args.calls} calls per block, "
          f"median of {args.rounds} rounds")
    print(markdown(rows, [("batch", "b"), ("heads", "h"), ("variant", "variant"), ("eager_us", "eager µs/call"),
                          ("eager_ratio", "eager / raw"), ("graph_us", "graph µs/call"),
                          ("graph_ratio", "graph / raw")]))
    print("bitwise: " + ", ".join(f"b={c['batch']} h={c['heads']}: {c['run_equals_raw_bitwise']}" for c in checks))
    dump(args.json, {"machine": machine(device), "build": build.describe(), "args": vars(args), "rows": rows,
                     "checks": checks})


if __name__ == "__main__":
    main()
