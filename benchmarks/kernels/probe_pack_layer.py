"""The pack layer's decode call site with FlashMLA, against vLLM's own FlashMLA call: bitwise, eager
and under a CUDA graph (issue 33; runs on the GPU machine, which has no vLLM).

    python benchmarks/kernels/probe_pack_layer.py [--json out.json]      # a CUDA GPU, SM90 / SM100
    python benchmarks/kernels/probe_pack_layer.py --cpu                  # the plumbing, on the CPU

The call site is dsv4sel's, unchanged: ``PackImplAttention._forward_decode`` of
``dsv4sel.vllm_plugin.pack_layer`` on an object that has the attributes vLLM's FlashMLA layer gives it
(``swa_cache_layer.kv_cache``, ``attn_sink`` padded to 64 heads with -inf, ``scale``, ``compress_ratio``,
``topk_indices_buffer``) and metadata objects with the fields vLLM's builders fill
(``DeepseekSparseSWAMetadata``: ``decode_swa_indices`` ``[T, 1, 128]``, ``decode_swa_lens``,
``is_valid_token``, ``token_to_req_indices``, ``num_decodes``, ``num_decode_tokens``;
``DeepseekV4FlashMLAMetadata``: ``block_size``, ``block_table``, C128A's ``c128a_global_decode_topk_indices``
/ ``c128a_decode_topk_lens``); the caches are byte pages bound as vLLM binds them
(``(num_blocks, block_size, 584)`` views of padded pages). The impl is
``DeepseekV4FlashMLASparseImpl`` on vLLM 0.33.0's bundled FlashMLA (``DSV4SEL_VLLM_FLASHMLA_DIR``, as
``gpu_session.sh`` sets it up). vLLM's side is what ``DeepseekV4FlashMLAAttention._forward_decode``
does with the same tensors: ``flash_mla_with_kvcache`` of the same bundled interface (vLLM's
``vllm.v1.attention.ops.flashmla.flash_mla_with_kvcache`` is that function) with its keywords, a
fresh ``get_mla_metadata()[0]`` per layer type and step, ``out=output.unsqueeze(1)``.

Layers: a sliding-window layer, a C128A layer and two C4A layers of one step. The second C4A layer
has its own top-k slots and the first one's lengths, as in vLLM, where every C4A layer of a step
sees the same number of compressed tokens per request: vLLM reuses the first layer's schedule
there, the pack layer re-plans (``replan``). A fifth layer, ``c4a-other-lens``, gives the second C4A
layer other lengths, which vLLM never hands it: each side is compared with the torch reference
decode there, to show what the reuse of a schedule assumes and that the re-plan does not.
vLLM's Triton ``compute_global_topk_indices_and_lens`` is not in the bundle: the C4A slots are computed
once here, in torch, and handed to both sides. Eager: each side once per layer, outputs compared
bit for bit. Graph: each side's calls of the sliding-window and C128A layers captured in one CUDA
graph after an eager warm-up (the step's plan made outside the graph), replayed, compared with the eager
outputs. One JSON document (``--json``) and a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import types

import torch

from dsv4sel.kernels.layouts import get_layout

WINDOW, TOPK, HEADS, SWA_BLOCK, CACHE_BLOCK = 128, 512, 64, 64, 256
_TOPK_SLOTS: dict = {}


def compute_global_topk_indices_and_lens(topk_indices, token_to_req_indices, block_table, block_size, is_valid):
    """What vLLM's Triton kernel returns for the C4A slots: the values computed once per layer here."""
    return _TOPK_SLOTS[topk_indices.data_ptr()]


class _Base:
    """Stands in for vLLM's layer class: the call site reads vLLM's functions from its module (this one)."""


def stand_in(impl, ratio: int, device, tokens: int):
    """An object with what vLLM's FlashMLA layer hands ``_forward_decode``'s code."""
    from dsv4sel.vllm_plugin.pack_layer import PackImplAttention

    cls = type("FlashMLALayerStandIn", (PackImplAttention, _Base),
               {"_dsv4sel_base": _Base, "_dsv4sel_v41": False, "__module__": __name__})
    layer = object.__new__(cls)
    layer._dsv4sel_kernel, layer._dsv4sel_views = impl, {}
    layer.compress_ratio, layer.scale = ratio, 512 ** -0.5
    # vLLM sizes it for the most tokens a step batches
    layer.topk_indices_buffer = torch.full((max(64, tokens), TOPK), -1, dtype=torch.int32, device=device)
    return layer


def pages(num_blocks: int, rows: int, device, gen):
    """A cache bound as vLLM binds it: padded pages, viewed (num_blocks, rows, 584); and its data."""
    layout = get_layout("fp8_ds_mla")
    page = layout.page_bytes(rows)
    raw = torch.zeros(num_blocks * page, dtype=torch.uint8, device=device)
    flat = raw.view(num_blocks, page)
    layout.write(flat, torch.randn(num_blocks * rows, 512, generator=gen).to(device),
                 torch.arange(num_blocks * rows, device=device))
    return raw.as_strided((num_blocks, rows, 584), (page, 584, 1))


def step(tokens: int, device, gen):
    """One decode step's metadata: ``tokens`` requests of one token; request r owns SWA blocks 2r, 2r+1
    and compressed blocks 2r, 2r+1."""
    req = torch.arange(tokens, dtype=torch.int32, device=device)
    table = (2 * req.view(-1, 1) + torch.arange(2, dtype=torch.int32, device=device)).contiguous()
    swa_local = torch.stack([torch.randperm(2 * SWA_BLOCK, generator=gen)[:WINDOW] for _ in range(tokens)])
    lens = torch.randint(1, WINDOW + 1, (tokens,), generator=gen, dtype=torch.int32)
    swa_local[torch.arange(WINDOW).view(1, -1) >= lens.view(-1, 1)] = -1
    slots = _paged(swa_local.to(device), table, SWA_BLOCK)
    swa = types.SimpleNamespace(num_decodes=tokens, num_decode_tokens=tokens, decode_swa_indices=slots.unsqueeze(1),
                                decode_swa_lens=lens.to(device), is_valid_token=torch.ones(tokens, dtype=torch.bool,
                                                                                           device=device),
                                token_to_req_indices=req, block_table=table)
    return swa, table


def _paged(local, table, block):
    valid = local >= 0
    loc = local.clamp(min=0).long()
    slots = table.long().gather(1, loc // block) * block + loc % block
    return torch.where(valid, slots, torch.full_like(slots, -1)).to(torch.int32).contiguous()


def compressed(layer, ratio: int, tokens: int, table, device, gen, lens=None):
    """The compressed layer's metadata and slots (C4A: the indexer's top-k with ``lens``, or lengths
    of its own; C128A: precomputed in the metadata)."""
    rows = CACHE_BLOCK // ratio
    width = TOPK if ratio == 4 else 8
    local = torch.stack([torch.randperm(2 * rows, generator=gen)[:width] if 2 * rows >= width else
                         torch.cat([torch.randperm(2 * rows, generator=gen), torch.full((width - 2 * rows,), -1)])
                         for _ in range(tokens)]).to(torch.int32)
    if lens is None:
        lens = torch.randint(1, min(width, 2 * rows) + 1, (tokens,), generator=gen, dtype=torch.int32)
    lens = lens.cpu()
    local[torch.arange(width).view(1, -1) >= lens.view(-1, 1)] = -1
    slots = _paged(local.to(device), table, rows)
    lens = lens.to(device)
    md = types.SimpleNamespace(block_size=CACHE_BLOCK, block_table=table, c128a_global_decode_topk_indices=None,
                               c128a_decode_topk_lens=None)
    if ratio == 128:
        md.c128a_global_decode_topk_indices, md.c128a_decode_topk_lens = slots.unsqueeze(1), lens
    else:
        layer.topk_indices_buffer[:tokens] = local.to(device)
        _TOPK_SLOTS[layer.topk_indices_buffer.data_ptr()] = (slots, lens)
    return md, slots.unsqueeze(1), lens


def vllm_call(lib, layer, q, kv_cache, swa_md, topk_indices, topk_lens, tile_md, output):
    """``DeepseekV4FlashMLAAttention._forward_decode``'s kernel call (vLLM 0.33.0), same keywords."""
    swa_only = kv_cache is None
    lib.flash_mla_with_kvcache(
        q=q.unsqueeze(1), k_cache=layer.swa_cache_layer.kv_cache.unsqueeze(-2), block_table=None, head_dim_v=512,
        tile_scheduler_metadata=tile_md, cache_seqlens=None, is_fp8_kvcache=True, indices=swa_md.decode_swa_indices,
        topk_length=swa_md.decode_swa_lens, softmax_scale=layer.scale, attn_sink=layer.attn_sink,
        extra_k_cache=None if swa_only else kv_cache.unsqueeze(-2), extra_indices_in_kvcache=topk_indices,
        extra_topk_length=topk_lens, out=output.unsqueeze(1))


def reference_call(layer, q, kv_cache, swa_md, topk_indices, topk_lens, output):
    """``--cpu``: the reference decode in place of FlashMLA (the plumbing, not the kernel)."""
    from dsv4sel.kernels.reference import sparse_mla_decode

    def flat(cache):
        return cache.as_strided((cache.shape[0], cache.stride(0)), (cache.stride(0), 1))

    out, _ = sparse_mla_decode(q.unsqueeze(1), flat(layer.swa_cache_layer.kv_cache), "fp8_ds_mla",
                               swa_md.decode_swa_indices, layer.scale, layer.attn_sink, swa_md.decode_swa_lens,
                               extra_cache=None if kv_cache is None else flat(kv_cache), extra_indices=topk_indices,
                               extra_topk_length=topk_lens)
    output.copy_(out.squeeze(1).to(torch.bfloat16))


def build(impl, device, gen, tokens):
    """Four layers of one step: (name, layer, compressed cache, compressed metadata, slots, lengths)."""
    swa_md, table = step(tokens, device, gen)
    out = []
    c4a_lens = None
    for name, ratio in (("swa", 1), ("c128a", 128), ("c4a", 4), ("c4a-second", 4), ("c4a-other-lens", 4)):
        layer = stand_in(impl, ratio, device, tokens)
        layer.swa_cache_layer = types.SimpleNamespace(kv_cache=pages(2 * tokens, SWA_BLOCK, device, gen))
        sink = torch.full((HEADS,), float("-inf"), device=device)
        sink[:HEADS] = torch.randn(HEADS, generator=gen).to(device)
        layer.attn_sink = sink
        cache = md = slots = lens = None
        if ratio > 1:
            cache = pages(2 * tokens, CACHE_BLOCK // ratio, device, gen)
            md, slots, lens = compressed(layer, ratio, tokens, table, device, gen,
                                         c4a_lens if name == "c4a-second" else None)
            c4a_lens = lens if name == "c4a" else c4a_lens
        out.append((name, layer, cache, md, slots, lens))
    return swa_md, out


def run(args) -> dict:
    device = torch.device("cpu" if args.cpu else "cuda")
    gen = torch.Generator().manual_seed(0)
    if args.cpu:
        from dsv4sel.kernels.reference import DeepseekV4ReferenceSparseImpl as Impl
        lib = None
    else:
        from dsv4sel.kernels.flashmla import DeepseekV4FlashMLASparseImpl as Impl
        from dsv4sel.kernels.flashmla import flashmla_build

        build_info = flashmla_build()
        if not build_info.found:
            raise SystemExit(f"no FlashMLA: {build_info.describe()}")
        lib = build_info.module
    impl = Impl("fp8_ds_mla", SWA_BLOCK)
    swa_md, layers = build(impl, device, gen, args.tokens)
    q = {name: torch.randn(args.tokens, HEADS, 512, generator=gen).to(torch.bfloat16).to(device)
         for name, *_ in layers}
    tiles = {}

    def vllm_side(name, layer, cache, md, slots, lens, output):
        if args.cpu:
            return reference_call(layer, q[name], cache, swa_md, slots, lens, output)
        # one schedule per layer type and step, planned by the type's first call (vLLM's tile_sched_*)
        kind = layer.compress_ratio
        if kind not in tiles:
            tiles[kind] = lib.get_mla_metadata()[0]
        return vllm_call(lib, layer, q[name], cache, swa_md, slots, lens, tiles[kind], output)

    def pack_side(name, layer, cache, md, slots, lens, output):
        layer._forward_decode(q[name], cache, swa_md, md, layer.compress_ratio <= 1, output)

    result: dict = {"device": "cpu" if args.cpu else torch.cuda.get_device_name(), "tokens": args.tokens,
                    "eager": {}, "graph": {}}
    eager: dict = {}
    for name, layer, cache, md, slots, lens in layers:
        a, b = (torch.full((args.tokens, HEADS, 512), float("nan"), dtype=torch.bfloat16, device=device)
                for _ in range(2))
        vllm_side(name, layer, cache, md, slots, lens, a)
        pack_side(name, layer, cache, md, slots, lens, b)
        eager[name] = (a.clone(), b.clone())
        result["eager"][name] = {"bitwise": bool(torch.equal(a, b)),
                                 "max_abs_diff": float((a.float() - b.float()).abs().max())}
        if not args.cpu:  # each side against the torch reference decode of the same data
            ref = torch.empty_like(a)
            reference_call(layer, q[name], cache, swa_md, slots, lens, ref)
            result["eager"][name].update({f"{side}_vs_reference": float((x.float() - ref.float()).abs().max())
                                          for side, x in (("vllm", a), ("pack", b))})
    if not args.cpu:
        result["graph"] = graphed(layers, vllm_side, pack_side, eager, args.tokens, device)
    return result


def graphed(layers, vllm_side, pack_side, eager, tokens, device) -> dict:
    """Each side's calls captured in CUDA graphs (their plan and vLLM's schedules made by the eager
    calls above), replayed, compared with the eager outputs: the sliding-window and C128A layers in
    one graph, the two C4A layers of the step (the second re-plans its lengths) in another. A capture
    that fails is reported with its error."""
    out: dict = {}
    for names in (("swa", "c128a"), ("c4a", "c4a-second")):
        try:
            out.update(_graphed([e for e in layers if e[0] in names], vllm_side, pack_side, eager, tokens, device))
        except RuntimeError as exc:  # reported, not raised: the table says which capture failed
            torch.cuda.synchronize()
            out.update({name: {"capture_error": str(exc).splitlines()[0][:200], "bitwise": False} for name in names})
    return out


def _graphed(chosen, vllm_side, pack_side, eager, tokens, device) -> dict:
    out: dict = {}
    for side, fn in (("vllm", vllm_side), ("pack", pack_side)):
        bufs = {name: torch.empty(tokens, HEADS, 512, dtype=torch.bfloat16, device=device) for name, *_ in chosen}
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            for name, layer, cache, md, slots, lens in chosen:
                fn(name, layer, cache, md, slots, lens, bufs[name])
        torch.cuda.current_stream().wait_stream(stream)
        for b in bufs.values():
            b.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for name in bufs:
            want = eager[name][0 if side == "vllm" else 1]
            out.setdefault(name, {})[f"{side}_replay_equals_eager"] = bool(torch.equal(bufs[name], want))
    for name in out:
        out[name]["bitwise"] = bool(torch.equal(eager[name][0], eager[name][1])) and all(out[name].values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16, help="decode tokens (one per request)")
    ap.add_argument("--cpu", action="store_true", help="the plumbing on the CPU, the reference in place of FlashMLA")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    result = run(args)
    print(f"# pack layer call site vs vLLM's FlashMLA call, {result['device']}, {args.tokens} decode tokens")
    print("| layer | eager bitwise | max abs diff | graph bitwise (both replays equal their eager) "
          "| vLLM vs reference | pack vs reference |")
    print("|---|---|---|---|---|---|")
    for name, e in result["eager"].items():
        g = result["graph"].get(name, {}).get("bitwise", "-")
        refs = " | ".join(f"{e[k]:.3g}" if k in e else "-" for k in ("vllm_vs_reference", "pack_vs_reference"))
        print(f"| {name} | {e['bitwise']} | {e['max_abs_diff']:.3g} | {g} | {refs} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    # c4a-other-lens is a case vLLM never has (see the module docstring): reported, not required
    ok = all(e["bitwise"] for name, e in result["eager"].items() if name != "c4a-other-lens") and \
        all(g["bitwise"] for g in result["graph"].values())
    for name, g in result["graph"].items():
        if "capture_error" in g:
            print(f"graph capture of {name}: {g['capture_error']}")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
