"""Fused Triton KV-cache codecs against the GPU's copy rate, measured in the same process.

    python benchmarks/kernels/bench_codecs.py                      # 1k .. 1M tokens, every codec
    python benchmarks/kernels/bench_codecs.py --tokens 131072 --json out.json

For each codec (fp8_ds_mla, bf16_row, fp8_e4m3_row) and token count, bf16 rows
``[n, 512]`` are written to randomly permuted slots of a cache of exactly n
tokens (block 64) and read back from those slots. Bytes counted: write = 1024
B/token in + ``bytes_per_token`` out (584, 1024, 512); read = ``bytes_per_token``
in + 1024 out (slots not counted). The copy rate is a 1 GiB device-to-device
``copy_`` (bytes read + written), timed first in the same process; each
figure's ratio is its rate over that one.

Variants: ``fused`` = the default call (``layout.write``/``read`` on a CUDA cache:
the Triton kernels, with the slot range check, one device sync, and for writes
the election of the last row per slot); ``fused, unchecked`` = ``check=False``
(and ``unique=True`` for writes): the kernels alone, no sync; ``fused, unique`` = checked but
no election of the last row per slot; ``fused, unchecked dups`` = the election but no check; ``torch`` =
``backend="torch"``, the torch-op codec. Each figure is the median of
``--reps`` CUDA-event-timed blocks of ``--calls`` back-to-back calls (more when a call is
short, so that a block lasts at least 2 ms), after 3 ms of untimed calls that bring the
GPU's clocks back up.
Before timing, the fused and torch writes of the same rows must give the
same bytes, and the reads the same values.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from _timing import dump, machine, markdown

from dsv4sel.kernels.layouts import LAYOUTS

CODECS = ("fp8_ds_mla", "bf16_row", "fp8_e4m3_row")
DEFAULT_TOKENS = "1024,4096,16384,65536,131072,262144,1048576"


def timed(fn, calls, reps, warm_s=0.003):
    """Median seconds per call over ``reps`` blocks of at least ``calls`` calls (more for short calls,
    so a block lasts >= 2 ms), after ``warm_s`` of untimed calls (the GPU clocks back up)."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    one = max(start.elapsed_time(end) / 1e3, 1e-6)
    calls = max(calls, int(0.002 / one))
    for _ in range(max(1, int(warm_s / one))):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def sweep(args, copy_gbps):
    """The kernels alone at --sweep-tokens over tokens-per-program x warps (module constants of triton_codecs)."""
    from dsv4sel.kernels import triton_codecs as tc

    saved = (tc._WRITE_TOKENS, tc._WRITE_WARPS, tc._READ_TOKENS, tc._READ_WARPS, tc._DSMLA_WRITE, tc._DSMLA_READ)
    rows = []
    n = args.sweep_tokens
    gen = torch.Generator().manual_seed(1)
    num_blocks = -(-n // args.block_size)
    kv = torch.randn(n, 512, generator=gen).to(torch.bfloat16).to("cuda")
    slots = torch.randperm(num_blocks * args.block_size, generator=gen)[:n].to("cuda")
    for name in args.codecs.split(","):
        rows += sweep_codec(tc, name, kv, slots, num_blocks, args, copy_gbps)
    tc._WRITE_TOKENS, tc._WRITE_WARPS, tc._READ_TOKENS, tc._READ_WARPS, tc._DSMLA_WRITE, tc._DSMLA_READ = saved
    return rows


def sweep_codec(tc, name, kv, slots, num_blocks, args, copy_gbps):
    """One codec's rows of the sweep, on a cache of its own (freed when this returns)."""
    layout = LAYOUTS[name]
    cache = layout.allocate(num_blocks, args.block_size, device="cuda")
    n = kv.shape[0]
    moved = n * (1024 + layout.bytes_per_token)
    calls = (("write", lambda: layout.write(cache, kv, slots, check=False, unique=True)),
             ("read", lambda: layout.read(cache, slots, check=False)))
    rows = []
    for tokens, warps in ((1, 2), (1, 4), (2, 2), (2, 4), (4, 4), (8, 4), (4, 8), (8, 8), (16, 8)):
        tc._WRITE_TOKENS = tc._READ_TOKENS = tokens
        tc._WRITE_WARPS = tc._READ_WARPS = warps
        tc._DSMLA_WRITE = tc._DSMLA_READ = (tokens, warps)
        for op, fn in calls:
            seconds = timed(fn, args.calls, args.reps)
            rows.append({"codec": name, "op": op, "tokens": n, "config": f"{tokens} x {warps}",
                         "us": seconds * 1e6, "of_copy": moved / seconds / 1e9 / copy_gbps})
    return rows


def copy_rate(reps):
    """GB/s (bytes read + written) of a 1 GiB device-to-device ``copy_``, its buffers freed on return."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    return 2 * src.numel() / timed(lambda: dst.copy_(src), 5, reps) / 1e9


def codec_figures(name, kv, slots, num_blocks, device, args, copy_gbps):
    """One codec at one token count: the fused-vs-torch check and the timed variants' rows.

    Its two caches live only while this runs: the next codec's are allocated beside the inputs alone."""
    n = kv.shape[0]
    layout = LAYOUTS[name]
    cache = layout.allocate(num_blocks, args.block_size, device=device)
    check = layout.allocate(num_blocks, args.block_size, device=device)
    layout.write(cache, kv, slots)
    layout.write(check, kv, slots, backend="torch")
    same_bytes = torch.equal(cache.view(torch.uint8), check.view(torch.uint8))
    same_read = torch.equal(layout.read(cache, slots).view(torch.int16),
                            layout.read(cache, slots, backend="torch").view(torch.int16))
    del check
    moved = n * (1024 + layout.bytes_per_token)
    variants = [
        ("write", "fused", lambda: layout.write(cache, kv, slots)),
        ("write", "fused, unique", lambda: layout.write(cache, kv, slots, unique=True)),
        ("write", "fused, unchecked dups", lambda: layout.write(cache, kv, slots, check=False)),
        ("write", "fused, unchecked", lambda: layout.write(cache, kv, slots, check=False, unique=True)),
        ("read", "fused", lambda: layout.read(cache, slots)),
        ("read", "fused, unchecked", lambda: layout.read(cache, slots, check=False)),
    ]
    if not args.no_torch:
        variants += [
            ("write", "torch", lambda: layout.write(cache, kv, slots, backend="torch")),
            ("read", "torch", lambda: layout.read(cache, slots, backend="torch")),
        ]
    rows = []
    for op, variant, fn in variants:
        seconds = timed(fn, args.calls, args.reps)
        gbps = moved / seconds / 1e9
        rows.append({"codec": name, "op": op, "variant": variant, "tokens": n, "us": seconds * 1e6,
                     "gbps": gbps, "of_copy": gbps / copy_gbps})
    return {"codec": name, "tokens": n, "bytes_equal": same_bytes, "read_equal": same_read}, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", default=DEFAULT_TOKENS)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--codecs", default=",".join(CODECS))
    parser.add_argument("--no-torch", action="store_true", help="skip the torch-op rows")
    parser.add_argument("--sweep", action="store_true", help="also time tile configurations of the kernels")
    parser.add_argument("--sweep-tokens", type=int, default=131072)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device = "cuda"

    copy_gbps = copy_rate(args.reps)
    torch.cuda.empty_cache()

    rows, checks = [], []
    gen = torch.Generator().manual_seed(0)
    for n in [int(x) for x in args.tokens.split(",")]:
        num_blocks = -(-n // args.block_size)
        kv = torch.randn(n, 512, generator=gen).to(torch.bfloat16).to(device)
        slots = torch.randperm(num_blocks * args.block_size, generator=gen)[:n].to(device)
        for name in args.codecs.split(","):
            check, codec_rows = codec_figures(name, kv, slots, num_blocks, device, args, copy_gbps)
            checks.append(check)
            rows += codec_rows
        del kv, slots
        torch.cuda.empty_cache()

    sweep_rows = sweep(args, copy_gbps) if args.sweep else []
    print(f"# KV-cache codecs, {machine(device)}, block {args.block_size}")
    if sweep_rows:
        print("# tile sweep (kernels alone: check=False, unique=True), tokens per program x warps")
        print(markdown(sweep_rows, [("codec", "codec"), ("op", "op"), ("tokens", "tokens"), ("config", "T x warps"),
                                    ("us", "µs/call"), ("of_copy", "of copy rate")]))
    print(f"# copy rate (1 GiB device-to-device, read + written): {copy_gbps:,.0f} GB/s")
    print(markdown(rows, [("codec", "codec"), ("op", "op"), ("variant", "variant"), ("tokens", "tokens"),
                          ("us", "µs/call"), ("gbps", "GB/s"), ("of_copy", "of copy rate")]))
    bad = [c for c in checks if not (c["bytes_equal"] and c["read_equal"])]
    print("fused vs torch: " + ("all equal" if not bad else f"DIFFER: {bad}"))
    dump(args.json, {"machine": machine(device), "copy_gbps": copy_gbps, "args": vars(args), "rows": rows,
                     "checks": checks, "sweep": sweep_rows})


if __name__ == "__main__":
    main()
