"""dsv4sel's pack layer in the real vLLM 0.33 on CPU, one process (runs in .venv-vllm only).

    DSV4SEL_RULES_PATH=<b12x pack rules>:<torchref pack> DSV4SEL_ALLOW_IMPL_MODULES=dsv4sel_b12x \\
        .venv-vllm/bin/python tests/vllm33/pack_layer.py MODEL_DIR LLAMA_DIR

Prints one JSON line per case. The platform is CUDA, stubbed (:mod:`stubs`), its capability set per
case. The plugin is loaded as vLLM loads it (vLLM's default logging configuration, its real
``load_general_plugins()`` finding the installed entry point); every configuration is built as
``vllm serve`` builds it (``EngineArgs(...).create_engine_config()``), and the layer as vLLM's decoder
layer builds it: the class vLLM's ``_select_dsv4_attn_cls`` returns, constructed with ``prefix=`` under
``set_current_vllm_config``.

``config`` cases: a pack's backend named by ``--attention-backend`` and chosen by the pack's default
rule (the B12X example pack on SM120 / SM121, the torch-reference pack on SM90), a rejection, an
unknown name, and a pack name given to a model that is not DeepSeek-V4.

``decode`` cases: the pack layer on vLLM's FlashMLA layer (torch-reference pack) with a sliding-window
layer, a C4A layer and a C128A layer, its caches laid out as vLLM binds them (byte pages of the
size vLLM's own KV-cache spec gives, ``bind_kv_cache``), the metadata objects vLLM's builders make
(``DeepseekSparseSWAMetadata``, ``DeepseekV4FlashMLAMetadata``) holding slot indices, lengths, block
tables and validity, the sink, the indexer's top-k buffer; ``forward_mqa`` runs under vLLM's
``set_forward_context`` on a batch of decode tokens and one prefill request, and its output is
compared with :func:`dsv4sel.kernels.reference.sparse_mla_decode` on the same pages, with the slots
computed here from the block tables. Only hardware is stubbed: vLLM's Triton kernel
``compute_global_topk_indices_and_lens`` (no Triton on this CPU) by :func:`global_topk`, its torch
statement.
"""
from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import stubs  # noqa: E402

stubs.setup("cuda")

WINDOW, TOPK, HEADS = 128, 512, 64


def emit(**kw) -> None:
    print(json.dumps(kw, sort_keys=True), flush=True)


def load_plugins() -> None:
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging
    from vllm.plugins import load_general_plugins

    configure_logging(LoggingConfig())
    load_general_plugins()


def describe(layer, cfg) -> dict:
    """What vLLM will allocate for the built layer, and which impl serves its decode."""
    from vllm.platforms import current_platform

    from dsv4sel.vllm_plugin.pack_layer import PackImplAttention

    spec = layer.swa_cache_layer.get_kv_cache_spec(cfg)
    current_platform.update_block_size_for_backend(cfg)
    impl = getattr(layer, "_dsv4sel_kernel", None)
    base = getattr(type(layer), "_dsv4sel_base", None)
    return {"class": f"{type(layer).__module__}.{type(layer).__qualname__}",
            "pack_layer": isinstance(layer, PackImplAttention),
            "vllm_base": None if base is None else f"{base.__module__}.{base.__qualname__}",
            "is_vllm_base": base is not None and isinstance(layer, base),
            "impl": None if impl is None else f"{type(impl).__module__}:{type(impl).__qualname__}",
            "impl_layout": None if impl is None else impl.layout.name,
            "cache_dtype": str(layer.kv_cache_dtype), "cache_config": str(cfg.cache_config.cache_dtype),
            "torch_dtype": str(layer.kv_cache_torch_dtype).removeprefix("torch."),
            "bytes_per_token": spec.state_content_size_bytes, "block_size": cfg.cache_config.block_size}


class on_cpu:
    """While a layer is built, the stubbed CUDA platform allocates on the CPU (vLLM's compressor and
    indexer put their buffers on ``current_platform.device_type``) and DeepGEMM reads as installed
    (the indexer's CUDA op refuses to be built without it): hardware, stubbed."""

    def __enter__(self):
        import vllm.model_executor.layers.sparse_attn_indexer as indexer
        from vllm.platforms import current_platform

        self.platform, self.had = current_platform, current_platform.__dict__.get("device_type")
        self.indexer, self.deep_gemm = indexer, indexer.has_deep_gemm
        current_platform.device_type = "cpu"
        indexer.has_deep_gemm = lambda: True

    def __exit__(self, *exc):
        self.indexer.has_deep_gemm = self.deep_gemm
        if self.had is None:
            del self.platform.device_type
        else:
            self.platform.device_type = self.had


def build_from_config(cfg, prefix: str = "model.layers.0.self_attn", **kw):
    """The attention layer vLLM's DeepSeek-V4 decoder layer builds for ``cfg``."""
    import vllm.models.deepseek_v4.nvidia.model as model
    from vllm.config import set_current_vllm_config

    import layers

    layers.prepare()
    cfg.kernel_config.enable_jit_warmup = False  # registers CUDA kernels' JIT warmups (CuTe DSL): hardware
    with set_current_vllm_config(cfg), on_cpu():
        cls = model._select_dsv4_attn_cls(cfg)
        return cls(cfg, prefix=prefix, topk_indices_buffer=kw.get("topk_indices_buffer"), aux_stream_list=None)


def config_case(name: str, capability: str, model_dir: str, fi_sm120: bool = True, **args) -> None:
    from vllm.engine.arg_utils import EngineArgs

    from dsv4sel import SelectionError

    stubs.set_device(capability, "cuda")
    stubs.set_flashinfer_sm120(fi_sm120)
    kw = {"model": model_dir, "skip_tokenizer_init": True, "load_format": "dummy", "max_model_len": 1024, **args}
    try:
        cfg = EngineArgs(**kw).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - the case's observation
        cause = exc
        errors = getattr(exc, "errors", None)
        if callable(errors):
            ctx = (errors() or [{}])[0].get("ctx", {}).get("error")
            cause = ctx if isinstance(ctx, BaseException) else exc
        emit(case=name, ok=False, error=type(cause).__name__, at="config",
             selection_error=isinstance(cause, SelectionError), message=str(cause).strip()[:2000])
        return
    try:
        layer = build_from_config(cfg)
    except Exception as exc:  # noqa: BLE001
        emit(case=name, ok=False, error=type(exc).__name__, at="layer", message=str(exc)[:2000],
             trace=traceback.format_exc()[-3000:])
        return
    emit(case=name, ok=True, **describe(layer, cfg))


# ------------------------------------------------------------------ the decode call site
def global_topk(topk_indices, token_to_req_indices, block_table, block_size, is_valid_token):
    """vLLM's ``compute_global_topk_indices_and_lens`` (a Triton kernel) in torch: a local index
    ``i`` of a token's request becomes ``block_table[req, i // block_size] * block_size + i %
    block_size``, -1 stays -1; the length is the number of valid entries, 0 for a padding token."""
    import torch

    valid = topk_indices >= 0
    req = token_to_req_indices[: topk_indices.shape[0]].long()
    local = topk_indices.clamp(min=0).long()
    blocks = block_table[req.unsqueeze(1), local // block_size]
    slots = torch.where(valid, blocks * block_size + local % block_size, torch.full_like(blocks, -1))
    lens = torch.where(is_valid_token, valid.sum(-1), torch.zeros_like(valid.sum(-1)))
    return slots.to(topk_indices.dtype), lens.to(torch.int32)


def byte_pages(spec, num_blocks: int, rows: int):
    """A cache as vLLM allocates and binds it for ``spec``: ``num_blocks`` pages of
    ``spec.page_size_bytes`` (padded as vLLM pads them), viewed ``[B, H=1, N, C]``."""
    import torch

    page = spec.page_size_bytes
    raw = torch.zeros(num_blocks * page, dtype=torch.uint8)
    width = spec.state_content_size_bytes
    return raw.as_strided((num_blocks, 1, rows, width), (page, rows * width, width, 1))


class Batch:
    """Two decode requests (one token each) and one prefill request of three tokens, vLLM's order
    (decodes first); request r's blocks in the block tables are ``r*2, r*2+1`` (SWA and compressed)."""

    def __init__(self, torch, gen):
        self.torch = torch
        self.decode_tokens, self.prefill_tokens = 2, 3
        self.tokens = self.decode_tokens + self.prefill_tokens
        self.req = torch.tensor([0, 1, 2, 2, 2], dtype=torch.int32)
        self.reqs = 3
        self.block_table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
        self.gen = gen


def pick(torch, gen, width: int, limit: int, count: int):
    """``count`` distinct local indices below ``limit`` in a row of ``width``, -1 after them."""
    row = torch.full((width,), -1, dtype=torch.int32)
    count = min(count, limit, width)
    row[:count] = torch.randperm(limit, generator=gen)[:count].to(torch.int32)
    return row


def paged(torch, local, block_table_row, block_size):
    valid = local >= 0
    loc = local.clamp(min=0).long()
    slots = block_table_row[loc // block_size].long() * block_size + loc % block_size
    return torch.where(valid, slots, torch.full_like(slots, -1)).to(torch.int32)


def count_calls(impl) -> dict:
    """Count the impl's plan / replan / run / prefill calls from now on (instance attributes wrapping
    the class's methods)."""
    calls = {"plan": 0, "replan": 0, "run": 0, "prefill": 0}
    for name in calls:
        impl.__dict__.pop(name, None)
        method = getattr(impl, name)

        def counted(*args, _name=name, _method=method, **kwargs):
            calls[_name] += 1
            return _method(*args, **kwargs)

        setattr(impl, name, counted)
    return calls


def decode_case(cfg, layer, ratio: int, seed: int) -> dict:
    import torch
    from vllm.forward_context import set_forward_context
    from vllm.models.deepseek_v4.sparse_mla import DeepseekV4FlashMLAMetadata
    from vllm.v1.attention.backends.mla.sparse_swa import DeepseekSparseSWAMetadata

    from dsv4sel.kernels.layouts import get_layout
    from dsv4sel.kernels.reference import sparse_mla_decode

    gen = torch.Generator().manual_seed(seed)
    b = Batch(torch, gen)
    layout = get_layout("fp8_ds_mla")
    # the caches, as vLLM allocates and binds them (its own specs give the page sizes)
    swa_spec = layer.swa_cache_layer.get_kv_cache_spec(cfg)
    swa_rows = swa_spec.block_size
    layer.swa_cache_layer.bind_kv_cache(byte_pages(swa_spec, 8, swa_rows))
    swa = layer.swa_cache_layer.kv_cache
    swa_pages = swa.as_strided((swa.shape[0], swa_spec.page_size_bytes), (swa_spec.page_size_bytes, 1))
    layout.write(swa_pages, torch.randn(8 * swa_rows, 512, generator=gen), torch.arange(8 * swa_rows))
    comp_pages = None
    comp_rows = cfg.cache_config.block_size // ratio if ratio > 1 else 0
    if ratio > 1:
        spec = layer.get_kv_cache_spec(cfg)
        layer.bind_kv_cache(byte_pages(spec, 8, comp_rows))
        comp = layer.kv_cache
        comp_pages = comp.as_strided((comp.shape[0], spec.page_size_bytes), (spec.page_size_bytes, 1))
        layout.write(comp_pages, torch.randn(8 * comp_rows, 512, generator=gen), torch.arange(8 * comp_rows))
    # the sliding-window slots vLLM's metadata builder computes (paged coordinates), per token
    swa_local = torch.stack([pick(torch, gen, WINDOW, 2 * swa_rows, 5 + 7 * t) for t in range(b.tokens)])
    swa_slots = torch.stack([paged(torch, swa_local[t], b.block_table[b.req[t]], swa_rows) for t in range(b.tokens)])
    swa_lens = (swa_local >= 0).sum(-1).to(torch.int32)
    valid = torch.tensor([True, True, True, True, False])  # the last prefill token is padding
    # the compressed top-k: the indexer's local indices (C4A) or C128A's precomputed slots
    comp_local = comp_slots = comp_lens = None
    if ratio > 1:
        comp_local = torch.stack([pick(torch, gen, TOPK if ratio == 4 else 8, 2 * comp_rows, 3 + 4 * t)
                                  for t in range(b.tokens)])
        comp_slots = torch.stack([paged(torch, comp_local[t], b.block_table[b.req[t]], comp_rows)
                                  for t in range(b.tokens)])
        comp_lens = torch.where(valid, (comp_local >= 0).sum(-1), 0).to(torch.int32)
    d = b.decode_tokens
    swa_md = DeepseekSparseSWAMetadata(
        block_table=b.block_table, slot_mapping=torch.zeros(b.tokens, dtype=torch.int64), block_size=swa_rows,
        is_valid_token=valid, token_to_req_indices=b.req, decode_swa_indices=swa_slots[:d].unsqueeze(1),
        decode_swa_lens=swa_lens[:d], decode_swa_width=WINDOW, prefill_swa_indices=swa_slots[d:].unsqueeze(1),
        prefill_swa_lens=swa_lens[d:], query_start_loc=torch.tensor([0, 1, 2, 5], dtype=torch.int32),
        query_start_loc_cpu=torch.tensor([0, 1, 2, 5], dtype=torch.int32), num_decodes=2, num_prefills=1,
        num_decode_tokens=d, num_prefill_tokens=b.prefill_tokens)
    md = {layer.swa_cache_layer.prefix: swa_md}
    if ratio > 1:
        md[layer.prefix] = DeepseekV4FlashMLAMetadata(
            num_reqs=b.reqs, max_query_len=3, max_seq_len=512, num_actual_tokens=b.tokens,
            query_start_loc=swa_md.query_start_loc, slot_mapping=torch.zeros(b.tokens, dtype=torch.int64),
            block_table=b.block_table, req_id_per_token=b.req, block_size=cfg.cache_config.block_size,
            topk_tokens=TOPK,
            c128a_global_decode_topk_indices=None if ratio != 128 else comp_slots[:d].unsqueeze(1),
            c128a_decode_topk_lens=None if ratio != 128 else comp_lens[:d],
            c128a_prefill_topk_indices=None if ratio != 128 else comp_local[d:])
        if ratio == 4:
            layer.topk_indices_buffer[: b.tokens] = comp_local
    sink = torch.full((layer.padded_heads,), float("-inf"))
    sink[:HEADS] = torch.randn(HEADS, generator=gen)
    layer.attn_sink.data.copy_(sink)
    q = torch.randn(b.tokens, layer.padded_heads, 512, generator=gen).to(torch.bfloat16)
    q[:, HEADS:] = 0  # vLLM's fused insert zero-fills the padding heads
    calls = count_calls(layer._dsv4sel_kernel)
    output = torch.full_like(q, float("nan"))
    again = torch.full_like(q, float("nan"))
    with set_forward_context(md, cfg):
        layer.forward_mqa(q, None, torch.arange(b.tokens, dtype=torch.int64), output)
        # the same layer type again in the same step (what the next layer of the type does): the plan is reused
        layer.forward_mqa(q, None, torch.arange(b.tokens, dtype=torch.int64), again)
    # the reference decode on the same pages, each token its own row
    want, _ = sparse_mla_decode(
        q.unsqueeze(1), swa_pages, layout, swa_slots.unsqueeze(1), layer.scale, layer.attn_sink[:layer.padded_heads],
        swa_lens, extra_cache=comp_pages, extra_indices=None if comp_slots is None else comp_slots.unsqueeze(1),
        extra_topk_length=comp_lens)
    want = want.squeeze(1).to(torch.bfloat16)
    got = output[:, :HEADS]
    return {"equal": bool(torch.equal(got, want[:, :HEADS])), "again_equal": bool(torch.equal(again, output)),
            "calls": dict(calls), "tokens": b.tokens,
            "max_abs_diff": float((got.float() - want[:, :HEADS].float()).abs().max()),
            "finite": bool(torch.isfinite(got.float()).all()), "class": type(layer).__qualname__,
            "swa_page_bytes": swa_spec.page_size_bytes, "swa_rows": swa_rows, "compressed_rows": comp_rows}


def decode_cases(v4_dir: str) -> None:
    """Three layers of one DeepSeek-V4 config (sliding-window, C4A, C128A) through the pack layer."""
    import torch
    import vllm.models.deepseek_v4.nvidia.flashmla as flashmla
    import vllm.models.deepseek_v4.nvidia.model as model
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.platforms import current_platform

    import layers

    stubs.set_device("9.0", "cuda")
    flashmla.compute_global_topk_indices_and_lens = global_topk  # a Triton kernel: hardware, stubbed
    cfg = EngineArgs(model=v4_dir, skip_tokenizer_init=True, load_format="dummy", max_model_len=1024,
                     attention_backend="TORCHREF_MLA_SPARSE").create_engine_config()
    hf = cfg.model_config.hf_config
    hf.num_hidden_layers = 3
    hf.layer_types = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
    cfg.kernel_config.enable_jit_warmup = False
    layers.prepare()
    with set_current_vllm_config(cfg), on_cpu():
        cls = model._select_dsv4_attn_cls(cfg)
        built = [cls(cfg, prefix=f"model.layers.{i}.self_attn",
                     topk_indices_buffer=torch.full((64, TOPK), -1, dtype=torch.int32), aux_stream_list=None)
                 for i in range(3)]
        current_platform.update_block_size_for_backend(cfg)
        for layer, seed in zip(built, (1, 2, 3)):
            name = f"decode-ratio-{layer.compress_ratio}"
            try:
                emit(case=name, ratio=layer.compress_ratio, **decode_case(cfg, layer, layer.compress_ratio, seed))
            except Exception as exc:  # noqa: BLE001
                emit(case=name, error=type(exc).__name__, message=str(exc)[:2000], trace=traceback.format_exc()[-4000:])


def main(v4_dir: str, llama_dir: str) -> None:
    load_plugins()
    config_case("b12x-by-name", "12.0", v4_dir, attention_backend="B12X_MLA_SPARSE")
    config_case("b12x-by-default", "12.1", v4_dir)
    config_case("torchref-by-name", "9.0", v4_dir, attention_backend="TORCHREF_MLA_SPARSE")
    config_case("b12x-rejected", "9.0", v4_dir, attention_backend="B12X_MLA_SPARSE")
    config_case("b12x-no-flashinfer", "12.1", v4_dir, fi_sm120=False)
    config_case("unknown-name", "12.0", v4_dir, attention_backend="B12X_MLA_SPARES")
    config_case("not-deepseek", "9.0", llama_dir, attention_backend="B12X_MLA_SPARSE")
    config_case("own-layer", "9.0", v4_dir, attention_backend="OWNLAYER_MLA_SPARSE")
    decode_cases(v4_dir)
    pickled_member()


def pickled_member() -> None:
    """A registered backend member pickled, then read back where vLLM's enum lacks it (an engine process
    started with ``spawn`` unpickles its config before it loads plugins): it comes back by name."""
    import pickle

    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from dsv4sel.vllm_plugin import backend_names

    data = pickle.dumps(AttentionBackendEnum["B12X_MLA_SPARSE"])
    backend_names.forget()  # as in a process that never registered it
    missing = "B12X_MLA_SPARSE" not in AttentionBackendEnum.__members__
    back = pickle.loads(data)
    emit(case="pickle", missing_before=missing, name=back.name, value=back.value,
         same=back is AttentionBackendEnum["B12X_MLA_SPARSE"])


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
