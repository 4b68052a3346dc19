"""The torch reference sparse decode at DeepSeek-V4's decode shape.

    python benchmarks/kernels/bench_reference_decode.py --device cuda
    python benchmarks/kernels/bench_reference_decode.py --device cpu --batches 1,4,16,64

Shape: 64 query heads, one query token per request, and per request 128
sliding-window slots (its own two 64-token blocks of a window cache) plus 512
top-k slots drawn from its own 2048 compressed entries (a C4 cache, block 64),
both fp8_ds_mla by default; softmax over all 640 with a per-head sink. This is
:func:`dsv4sel.kernels.reference.sparse_mla_decode`, eager torch ops, no
fused kernel.

Reported: ms per call, decode tokens/s (requests x query tokens / time), and
the cache bytes the call gathers (640 x bytes_per_token per request) per second.
"""

from __future__ import annotations

import argparse

import torch
from _timing import dump, machine, markdown, measure

from dsv4sel.kernels.layouts import get_layout
from dsv4sel.kernels.reference import sparse_mla_decode

WINDOW = 128
TOPK = 512
COMPRESSED_PER_REQUEST = 2048


def build(batch: int, heads: int, layout_name: str, device: str, gen: torch.Generator):
    layout = get_layout(layout_name)
    block = 64
    window_cache = layout.allocate(batch * WINDOW // block, block, device=device)
    comp_cache = layout.allocate(batch * COMPRESSED_PER_REQUEST // block, block, device=device)
    for cache, n in ((window_cache, batch * WINDOW), (comp_cache, batch * COMPRESSED_PER_REQUEST)):
        kv = torch.randn(n, 512, generator=gen).to(torch.bfloat16).to(device)
        layout.write(cache, kv, torch.arange(n, device=device))
    req = torch.arange(batch).view(batch, 1, 1)
    window_idx = req * WINDOW + torch.arange(WINDOW).view(1, 1, WINDOW)
    topk = torch.argsort(torch.rand(batch, COMPRESSED_PER_REQUEST, generator=gen), dim=-1)[:, :TOPK]
    comp_idx = req * COMPRESSED_PER_REQUEST + topk.view(batch, 1, TOPK)
    q = torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16).to(device)
    sink = torch.randn(heads, generator=gen).to(device)
    return layout, q, window_cache, window_idx.to(device), comp_cache, comp_idx.to(device), sink


def batch_row(batch: int, args, gen: torch.Generator, warmup: int, reps: int) -> dict:
    """The figures of one batch size, its tensors built and freed within this call."""
    layout, q, win, win_idx, comp, comp_idx, sink = build(batch, args.heads, args.layout, args.device, gen)
    scale = 512**-0.5

    def call():
        return sparse_mla_decode(q, win, layout, win_idx, scale, sink, extra_cache=comp, extra_indices=comp_idx)

    out, lse = call()
    if not (torch.isfinite(out).all() and torch.isfinite(lse).all()):
        raise SystemExit(f"batch {batch}: non-finite output")
    seconds = measure(call, args.device, warmup, reps)
    gathered = batch * (WINDOW + TOPK) * layout.bytes_per_token
    return {
        "batch": batch,
        "ms": seconds * 1e3,
        "tok_s": batch / seconds,
        "gbps": gathered / seconds / 1e9,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64")
    parser.add_argument("--heads", type=int, default=64)
    parser.add_argument("--layout", default="fp8_ds_mla")
    parser.add_argument("--warmup", type=int, default=None, help="default 5 on CUDA, 1 on CPU")
    parser.add_argument("--reps", type=int, default=None, help="default 30 on CUDA, 3 on CPU")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    warmup = args.warmup if args.warmup is not None else (5 if cuda else 1)
    reps = args.reps or (30 if cuda else 3)

    gen = torch.Generator().manual_seed(0)
    rows = []
    for batch in (int(b) for b in args.batches.split(",")):
        rows.append(batch_row(batch, args, gen, warmup, reps))
        if cuda:  # the batch's tensors went with batch_row's return
            torch.cuda.empty_cache()

    print(
        f"# reference sparse decode, {machine(args.device)}: h={args.heads}, s_q=1, "
        f"top-k {TOPK} + {WINDOW} window, {args.layout}, sink on"
    )
    print(markdown(rows, [("batch", "batch"), ("ms", "ms/call"), ("tok_s", "decode tokens/s"), ("gbps", "cache GB/s gathered")]))
    dump(args.json, {"machine": machine(args.device), "args": vars(args), "rows": rows})


if __name__ == "__main__":
    main()
