"""Every figure of issue 21's table, as ratios, in one process on one GPU.

    python benchmarks/kernels/bench_issue21.py --json out.json

* FlashMLA (``bench_flashmla_plan_run.bench_shape``: 128 window + 512 top-k slots, fp8_ds_mla pages of
  64, sinks, int32 lengths): ``forward_decode`` called again with the same shapes and ``run`` eager and
  under a CUDA graph, each over the raw ``flash_mla_with_kvcache`` call with a planned ``sched_meta``
  (at h = 16 the raw call gets q and the sink padded to 64 heads once, outside the timing).
* Codecs (``bench_codecs.timed``: CUDA-event time of back-to-back calls, so a call whose host work
  outlasts its GPU work is timed by its host work): bf16 rows written to a random permutation of the
  slots of a cache of exactly n tokens (block 64) and read back; bytes = 1,024 in + bytes per token
  out (write), the reverse (read); ratio = rate over a 1 GiB device-to-device copy in this process.
  ``default`` = ``layout.write`` / ``read`` as called with no options (slot range checked on the device,
  last-row election), ``unchecked`` = ``check=False`` (and ``unique=True`` for writes).
* A decode step's cache write: 64 tokens into a 1M-token cache, eager µs per call (default and
  unchecked writes, and the default read of those 64 slots, with the direct launcher and with Triton's
  own launch path; all eighteen in turn, median over ``--step-rounds`` rounds), and per call in a CUDA
  graph of 10 calls.
"""

from __future__ import annotations

import argparse
import statistics
import types

import torch
from _timing import dump, machine, markdown
from bench_codecs import CODECS, copy_rate, timed
from bench_flashmla_plan_run import bench_shape

from dsv4sel.kernels import triton_codecs, triton_launch
from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl, flashmla_build
from dsv4sel.kernels.layouts import LAYOUTS, raise_slot_errors

TOKENS = (64, 1024, 4096, 65536, 131072, 1048576)


def flashmla_rows(args):
    shapes = [(b, 64) for b in (1, 4, 64, 128)] + [(128, 128), (4, 16)]
    out, checks = [], []
    ns = types.SimpleNamespace(layers=4, calls=args.calls, rounds=args.rounds)
    for b, h in shapes:
        rows, same = bench_shape(b, h, ns, "cuda")
        checks.append({"batch": b, "heads": h, "run_and_forward_decode_equal_raw_bitwise": same})
        by = {r["variant"]: r for r in rows}
        raw = by["raw"]
        out.append({"b": b, "h": h, "raw_eager_us": raw["eager_us"],
                    "forward_decode_ratio": by["forward_decode (again, same shapes)"]["eager_ratio"],
                    "run_eager_ratio": by["run"]["eager_ratio"],
                    "run_direct_eager_ratio": by["run, op called directly"]["eager_ratio"],
                    "raw_graph_us": raw["graph_us"],
                    "run_graph_ratio": by["run"]["graph_ratio"], "plan_us": by["plan"]["eager_us"]})
        zero = by.get("run, q in plan.query_buffer")
        out[-1]["run_qbuf_eager_ratio"] = zero["eager_ratio"] if zero else ""
        out[-1]["run_qbuf_graph_ratio"] = zero["graph_ratio"] if zero else ""
    return out, checks


def codec_rows(args, copy_gbps):
    rows = []
    gen = torch.Generator().manual_seed(0)
    for n in TOKENS:
        num_blocks = -(-n // 64)
        kv = torch.randn(n, 512, generator=gen).to(torch.bfloat16).cuda()
        slots = torch.randperm(num_blocks * 64, generator=gen)[:n].cuda()
        rows += [codec_row(name, kv, slots, num_blocks, args, copy_gbps) for name in CODECS]
        del kv, slots
        torch.cuda.empty_cache()
    raise_slot_errors("cuda")  # random permutations: nothing may have been out of range
    return rows


def codec_row(name, kv, slots, num_blocks, args, copy_gbps):
    """One codec's ratios at one token count, on a cache of its own (freed when this returns)."""
    layout = LAYOUTS[name]
    cache = layout.allocate(num_blocks, 64, device="cuda")
    moved = kv.shape[0] * (1024 + layout.bytes_per_token)
    row = {"codec": name, "tokens": kv.shape[0]}
    for key, fn in (("write default", lambda: layout.write(cache, kv, slots)),
                    ("write unchecked", lambda: layout.write(cache, kv, slots, check=False, unique=True)),
                    ("read default", lambda: layout.read(cache, slots)),
                    ("read unchecked", lambda: layout.read(cache, slots, check=False))):
        seconds = timed(fn, args.codec_calls, args.reps)
        row[key] = moved / seconds / 1e9 / copy_gbps
    return row


def step_rows(args):
    """64 tokens into a 1M-token cache per codec, as one layer of one decode step writes them.

    Host time moves by tens of percent over seconds on these machines: every variant of every codec
    is measured in turn, one block each per round, and each figure is the median over the rounds."""
    gen = torch.Generator().manual_seed(2)
    setups = {name: step_setup(name, gen) for name in CODECS}
    default, times = triton_launch.STATE[0], {}
    for _ in range(args.step_rounds):
        for launcher in ("direct", "triton"):
            triton_launch.STATE[0] = launcher == "direct"
            for name, calls in setups.items():
                for key, fn in calls:
                    times.setdefault((name, f"{key} eager µs ({launcher} launcher)"), []).append(
                        timed(fn, 20, 1) * 1e6)
    triton_launch.STATE[0] = default
    rows = []
    for name, calls in setups.items():
        row = {"codec": name}
        row.update({key: statistics.median(values) for (codec, key), values in times.items() if codec == name})
        row["default graph µs"] = graph_write_us(calls[0][1], args)
        rows.append(row)
    return rows


def step_setup(name, gen):
    """One codec's cache, rows and slots, as (variant, call) pairs: default write, unchecked write, read."""
    layout = LAYOUTS[name]
    cache = layout.allocate(1 << 14, 64, device="cuda")
    kv = torch.randn(64, 512, generator=gen).to(torch.bfloat16).cuda()
    slots = torch.randperm(1 << 20, generator=gen)[:64].cuda()
    return (("default", lambda: layout.write(cache, kv, slots)),
            ("unchecked", lambda: layout.write(cache, kv, slots, check=False, unique=True)),
            ("read default", lambda: layout.read(cache, slots)))


def graph_write_us(write, args):
    """µs per call of ``write`` in a CUDA graph of 10 calls."""
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    write()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        for _ in range(10):
            write()
    torch.cuda.current_stream().wait_stream(stream)
    return timed(graph.replay, 5, args.reps) * 1e6 / 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--codec-calls", type=int, default=10)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--step-rounds", type=int, default=15, help="rounds of the 64-token figures")
    parser.add_argument("--skip-flashmla", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    copy_gbps = copy_rate(args.reps)
    torch.cuda.empty_cache()
    payload = {"machine": machine("cuda"), "copy_gbps": copy_gbps, "args": vars(args)}
    print(f"# issue 21 figures, {machine('cuda')}; copy rate {copy_gbps:,.0f} GB/s")
    if not args.skip_flashmla:
        ok, reason = DeepseekV4FlashMLASparseImpl.is_available()
        if not ok:
            raise SystemExit(f"FlashMLA cannot run here: {reason}")
        print(f"# FlashMLA: {flashmla_build().describe()}")
        fm, checks = flashmla_rows(args)
        print(markdown(fm, [("b", "b"), ("h", "h"), ("raw_eager_us", "raw eager µs"),
                            ("forward_decode_ratio", "forward_decode again / raw"),
                            ("run_eager_ratio", "run / raw, eager"),
                            ("run_direct_eager_ratio", "run, op called directly / raw, eager"), ("raw_graph_us", "raw graph µs"),
                            ("run_graph_ratio", "run / raw, graph"),
                            ("run_qbuf_eager_ratio", "run, q in query_buffer / raw, eager"),
                            ("run_qbuf_graph_ratio", "… graph"), ("plan_us", "plan µs")]))
        print("bitwise: " + ", ".join(f"b={c['batch']} h={c['heads']}: {c['run_and_forward_decode_equal_raw_bitwise']}"
                                      for c in checks))
        payload.update(flashmla=fm, checks=checks)
    codecs = codec_rows(args, copy_gbps)
    print("# codecs, ratio to the copy rate (random slots)")
    print(markdown(codecs, [("codec", "codec"), ("tokens", "tokens"), ("write default", "write default"),
                            ("read default", "read default"), ("write unchecked", "write unchecked"),
                            ("read unchecked", "read unchecked")]))
    steps = step_rows(args)
    print("# a decode step's cache write: 64 tokens, µs per call")
    print(markdown(steps, [(k, k) for k in steps[0]]))
    kept = {name: (len(launcher.variants), launcher.fast) for name, launcher in (
        ("write fp8_ds_mla", triton_codecs._write_ds), ("read fp8_ds_mla", triton_codecs._read_ds),
        ("write rows", triton_codecs._write_rows), ("read rows", triton_codecs._read_rows))}
    print(f"# direct launcher: {triton_launch.STATE}, (compiled variants kept, direct launches) {kept}")
    payload.update(codecs=codecs, step=steps, launcher={"enabled": triton_launch.STATE[0], "kept": kept})
    dump(args.json, payload)


if __name__ == "__main__":
    main()
