"""Throughput of the KV-cache layouts' default ``write`` and ``read`` (fused Triton kernels on CUDA).

For the fused kernels against the copy rate, their variants and 1k..1M tokens,
use bench_codecs.py; ``--backend torch`` here times the torch-op codecs.

    python benchmarks/kernels/bench_layouts.py --device cuda --tokens 131072
    python benchmarks/kernels/bench_layouts.py --device cpu --tokens 16384

Each call handles ``--tokens`` rows at randomly permuted slots (block size 64).
Bytes counted: write = bf16 input (1024 B/token) + cache bytes written
(``bytes_per_token``); read = cache bytes read + bf16 output (1024 B/token).
Slot indices and the slot range check (one device sync per call) are part of
the timed call but not of the byte count. The fraction is of ``--peak-tbps``
(4.8 TB/s, the H200's HBM3e datasheet figure). On CUDA a plain 1 GiB
device-to-device copy (bytes read + written) is timed first, as the measured
ceiling.
"""

from __future__ import annotations

import argparse

import torch
from _timing import dump, machine, markdown, measure

from dsv4sel.kernels.layouts import LAYOUTS


def layout_rows(name, layout, kv, slots, num_blocks, args, reps):
    """One layout's write and read rows, timed on a cache of its own (freed when this returns)."""
    tokens = kv.shape[0]
    cache = layout.allocate(num_blocks, args.block_size, device=args.device)
    layout.write(cache, kv, slots)
    if not torch.equal(layout.read(cache, slots[:8]).cpu(), layout.read(cache.cpu(), slots[:8].cpu())):
        raise SystemExit(f"{name}: device read disagrees with CPU read")
    write_s = measure(lambda: layout.write(cache, kv, slots, backend=args.backend), args.device, args.warmup, reps)
    read_s = measure(lambda: layout.read(cache, slots, backend=args.backend), args.device, args.warmup, reps)
    moved = tokens * (1024 + layout.bytes_per_token)
    rows = []
    for op, seconds in (("write", write_s), ("read", read_s)):
        gbps = moved / seconds / 1e9
        rows.append(
            {
                "layout": name,
                "op": op,
                "tokens": tokens,
                "ms": seconds * 1e3,
                "mtok_s": tokens / seconds / 1e6,
                "gbps": gbps,
                "peak_frac": gbps / (args.peak_tbps * 1e3),
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tokens", type=int, default=None, help="rows per call (default 131072 on CUDA, 16384 on CPU)")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--reps", type=int, default=None, help="timed calls (default 20 on CUDA, 5 on CPU)")
    parser.add_argument("--peak-tbps", type=float, default=4.8)
    parser.add_argument("--backend", default="auto", choices=["auto", "torch", "triton"])
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    tokens = args.tokens or (131072 if cuda else 16384)
    reps = args.reps or (20 if cuda else 5)

    gen = torch.Generator().manual_seed(0)
    num_blocks = -(-tokens // args.block_size)
    kv = torch.randn(tokens, 512, generator=gen).to(torch.bfloat16).to(args.device)
    slots = torch.randperm(num_blocks * args.block_size, generator=gen)[:tokens].to(args.device)

    rows = []
    if cuda:
        src = torch.empty(1 << 30, dtype=torch.uint8, device=args.device)
        dst = torch.empty_like(src)
        seconds = measure(lambda: dst.copy_(src), args.device, args.warmup, reps)
        gbps = 2 * src.numel() / seconds / 1e9
        rows.append({"layout": "(1 GiB copy)", "op": "copy", "tokens": 0, "ms": seconds * 1e3, "mtok_s": 0.0,
                     "gbps": gbps, "peak_frac": gbps / (args.peak_tbps * 1e3)})
        del src, dst
    for name, layout in LAYOUTS.items():
        if layout.has_codec:  # size-only V4.1 records have nothing to write or read
            rows += layout_rows(name, layout, kv, slots, num_blocks, args, reps)

    print(f"# KV-cache layout write/read, {machine(args.device)}, block {args.block_size}, {tokens} tokens/call")
    columns = [("layout", "layout"), ("op", "op"), ("ms", "ms/call"), ("mtok_s", "Mtok/s"), ("gbps", "GB/s")]
    if cuda:  # a fraction of HBM bandwidth means nothing for a CPU run
        columns.append(("peak_frac", f"of {args.peak_tbps} TB/s"))
    print(markdown(rows, columns))
    dump(args.json, {"machine": machine(args.device), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
