"""dsv4sel's DeepSeek-V4 attention layer for vLLM: vLLM's own layer, with the rule's impl as its sparse decode.

A rule names it as its vLLM host class, ``hosts: {vllm: {class:
"dsv4sel.vllm_plugin.pack_layer:PackImplAttention", versions: ...}}``
(:data:`~dsv4sel.dsv4.vllm_hosting.PACK_LAYER`). The plugin then builds, for the decision, a subclass
of vLLM's own layer for the rule's cache layout on that model, platform and GPU generation
(:mod:`dsv4sel.dsv4.vllm_hosting`: FlashMLA's or FlashInfer's SM120 layer, V4 or V4.1) with
:class:`PackImplAttention` first in its bases. Everything is vLLM's (``__init__``, the projections,
the indexer, the compressor, the sliding-window cache layer, the KV-cache spec, the metadata
builders, the cache writes, the output projection) except two methods:

* ``_forward_decode``, the sparse decode of one layer: the token's cache slots and lengths are the
  ones vLLM's layer computes (the sliding-window slots and lengths of vLLM's metadata, the compressed
  slots from the indexer's top-k through vLLM's ``compute_global_topk_indices_and_lens``, or C128A's
  precomputed ones), and the impl decodes: ``plan`` once per step and layer type (shared by every
  layer of that type; a C4A layer's own lengths go in with ``replan``), ``run`` per layer, exactly the
  hooks of docs/kernels.md;
* ``_forward_prefill``, only when the impl writes the optional prefill hook (``has_prefill()``):
  each prefill token is a row of :meth:`SparseMLAImpl.prefill`, with the paged slots vLLM's metadata
  holds. Without the hook, vLLM's own prefill runs (FlashMLA's ``flash_mla_sparse_fwd``, FlashInfer's
  SM120 kernel); ``dsv4sel check`` refuses a rule that selects where neither runs (DSV415).

The impl is one object per (impl, layout, page size) in the process, made when the first layer is
built (an impl that does not import fails there, with the rule's location); its library is asked
for at the first decode (``KernelUnavailableError`` naming what to install).

A pack's own vLLM layer (:func:`own_layer`) is imported only from a module the process allows, as an
impl is (``--allow-impl-module`` / ``DSV4SEL_ALLOW_IMPL_MODULES``, or the installed pack's package),
and must subclass vLLM's DeepSeek-V4 attention layer of its model.
"""

from __future__ import annotations

import importlib
import sys
import threading
from typing import Any, ClassVar

from ..dsv4.profile import PROFILE
from ..dsv4.vllm_hosting import PACK_LAYER, HostLayer, host_layer
from ..errors import SelectionError

__all__ = ["PACK_LAYER", "PackImplAttention", "layer_for", "own_layer"]

_lock = threading.Lock()
#: (vLLM base class, impl, layout, allowed modules) -> the generated layer class
_classes: dict[tuple, type] = {}
#: (impl, layout, page size) -> the impl object every layer of that kind shares
_impls: dict[tuple, Any] = {}
#: vLLM's base classes of the two model families (a pack's own layer must subclass its model's)
_ATTENTION_BASES = {"deepseek_v4": "vllm.models.deepseek_v4.attention:DeepseekV4Attention",
                    "deepseek_v4_1": "vllm.models.deepseek_v41.attention:DeepseekV4Attention"}


class PackImplAttention:
    """The mixin of dsv4sel's pack layer: put first in the bases of one of vLLM's DeepSeek-V4 layer
    classes (:func:`layer_for` makes the class), it replaces that layer's sparse decode (and, when the
    impl has the hook, its sparse prefill) by the rule's impl. Class attributes, set per class:"""

    #: the impl class ("module:Class"), the layout it reads, the modules it may be imported from
    _dsv4sel_impl: ClassVar[str] = ""
    _dsv4sel_layout: ClassVar[str] = ""
    _dsv4sel_allowed: ClassVar[tuple[str, ...]] = ()
    #: the deciding rule, for messages; vLLM's base class; V4.1 (every compressed layer reads the indexer)
    _dsv4sel_rule: ClassVar[str] = ""
    _dsv4sel_base: ClassVar[type] = object
    _dsv4sel_v41: ClassVar[bool] = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        layer: Any = self
        self._dsv4sel_kernel = _shared_impl(type(self), int(layer.swa_cache_layer.block_size))
        self._dsv4sel_views: dict[int, tuple[Any, Any]] = {}

    # -- the decode call site ---------------------------------------------
    def _forward_decode(self, q: Any, kv_cache: Any, swa_metadata: Any, attn_metadata: Any, swa_only: bool,
                        output: Any) -> None:
        """One layer's sparse decode by the impl: ``q`` ``[T, H, 512]`` (T decode tokens), ``kv_cache`` the
        compressed cache (None on a sliding-window-only layer), ``output`` ``[T, padded heads, 512]``."""
        layer: Any = self
        tokens = swa_metadata.num_decode_tokens
        extra_indices = extra_lens = None
        per_layer_lens = False
        if not swa_only:
            extra_indices, extra_lens, per_layer_lens = self._dsv4sel_compressed(
                swa_metadata, attn_metadata, slice(0, tokens), decode=True)
        swa_indices, swa_lens = swa_metadata.decode_swa_indices, swa_metadata.decode_swa_lens
        heads = int(q.shape[1])
        pages = self._dsv4sel_pages(layer.swa_cache_layer.kv_cache)
        extra_pages = None if kv_cache is None or swa_only else self._dsv4sel_pages(kv_cache)
        impl = self._dsv4sel_kernel
        plan, fresh = self._dsv4sel_plan(impl, swa_metadata, tokens, heads, swa_indices, swa_lens, extra_indices,
                                         extra_lens, extra_pages, q.device)
        if per_layer_lens and not fresh:  # this layer's own top-k lengths into the step's plan
            impl.replan(plan, extra_topk_length=extra_lens)
        got = impl.run(q.unsqueeze(1), pages, swa_indices, extra_kv_cache=extra_pages, extra_indices=extra_indices,
                       attn_sink=layer.attn_sink[:heads], plan=plan)
        output[:, :heads].copy_(got.out.squeeze(1))

    def _forward_prefill(self, *args: Any, **kwargs: Any) -> Any:
        """vLLM's own prefill, unless the impl writes the prefill hook: then each prefill token is one
        row of the impl's :meth:`prefill`, with the paged sliding-window slots vLLM's metadata holds and
        the compressed slots vLLM's layer computes."""
        impl = self._dsv4sel_kernel
        parent: Any = super()
        if args or not impl.has_prefill():
            return parent._forward_prefill(*args, **kwargs)
        layer: Any = self
        q, output = kwargs["q"], kwargs["output"]
        swa_metadata, attn_metadata = kwargs["swa_metadata"], kwargs["attn_metadata"]
        compressed = kwargs.get("compressed_k_cache")
        start = swa_metadata.num_decode_tokens
        rows = slice(start, start + swa_metadata.num_prefill_tokens)
        extra_indices = extra_lens = None
        if compressed is not None:
            extra_indices, extra_lens, _ = self._dsv4sel_compressed(swa_metadata, attn_metadata, rows, decode=False)
        heads = int(q.shape[1])
        got = impl.prefill(
            q.unsqueeze(1), self._dsv4sel_pages(kwargs["swa_k_cache"]), swa_metadata.prefill_swa_indices,
            softmax_scale=layer.scale, attn_sink=layer.attn_sink[:heads], topk_length=swa_metadata.prefill_swa_lens,
            extra_kv_cache=None if compressed is None else self._dsv4sel_pages(compressed),
            extra_indices=extra_indices, extra_topk_length=extra_lens)
        output[:, :heads].copy_(got.out.squeeze(1))
        return None

    # -- what the call site hands the impl ------------------------------
    def _dsv4sel_compressed(self, swa_metadata: Any, attn_metadata: Any, rows: slice,
                            decode: bool) -> tuple[Any, Any, bool]:
        """The compressed cache's slots ``[n, 1, topk]`` and lengths ``[n]`` for the tokens ``rows``,
        as vLLM's own layer computes them, and whether the lengths are this layer's own (the
        indexer's top-k, per layer) rather than the step's (C128A's, shared)."""
        layer: Any = self
        if attn_metadata is None or swa_metadata.is_valid_token is None:
            raise RuntimeError(f"{type(self).__qualname__}: a compressed layer needs vLLM's sparse-MLA and "
                               "sliding-window metadata")
        from_indexer = self._dsv4sel_v41 or layer.compress_ratio == 4
        if not from_indexer and decode:
            return attn_metadata.c128a_global_decode_topk_indices, attn_metadata.c128a_decode_topk_lens, False
        local = (layer.topk_indices_buffer[rows] if from_indexer else attn_metadata.c128a_prefill_topk_indices)
        if decode:
            requests, block_table = swa_metadata.token_to_req_indices, attn_metadata.block_table[:swa_metadata.num_decodes]
        else:
            requests, block_table = swa_metadata.token_to_req_indices[rows], attn_metadata.block_table
        compute = _vllm_global(self, "compute_global_topk_indices_and_lens")
        slots, lens = compute(local, requests, block_table, attn_metadata.block_size // layer.compress_ratio,
                              swa_metadata.is_valid_token[rows])
        return slots.view(slots.shape[0], 1, -1), lens, from_indexer

    def _dsv4sel_pages(self, cache: Any) -> Any:
        """A cache as vLLM binds it (``(num_blocks, block_size, bytes_per_token)`` byte pages) as the
        impl's layout takes it (``[num_blocks, page_bytes]``, the same storage); kept per tensor."""
        hit = self._dsv4sel_views.get(id(cache))
        if hit is not None and hit[0] is cache:
            return hit[1]
        impl = self._dsv4sel_kernel
        if cache.dim() != 3 or cache.shape[2] != impl.layout.bytes_per_token:
            raise RuntimeError(f"{type(self).__qualname__}: vLLM's cache {tuple(cache.shape)} is not "
                               f"{impl.layout.name} pages (num_blocks, block_size, {impl.layout.bytes_per_token})")
        page = impl.layout.page_bytes(int(cache.shape[1]))
        if cache.stride(0) != page or cache.stride(1) != impl.layout.bytes_per_token:
            raise RuntimeError(
                f"{type(self).__qualname__}: vLLM's {impl.layout.name} pages are {cache.stride(0)} bytes apart, "
                f"the impl reads pages of {page} bytes back to back; set VLLM_KV_CACHE_LAYOUT to a layer-major "
                "layout (the default) for this layer")
        view = cache.as_strided((int(cache.shape[0]), page), (page, 1), cache.storage_offset())
        self._dsv4sel_views[id(cache)] = (cache, view)
        return view

    def _dsv4sel_plan(self, impl: Any, swa_metadata: Any, tokens: int, heads: int, swa_indices: Any, swa_lens: Any,
                      extra_indices: Any, extra_lens: Any, extra_pages: Any, device: Any) -> tuple[Any, bool]:
        """The step's plan for this layer type, and whether this call made it: made by the first layer
        of the type that decodes in this step (vLLM builds a new metadata object per step), reused by
        the others."""
        layer: Any = self
        # kept on the step's metadata object (vLLM's builders make a new one per step); an object
        # without a __dict__ keeps none, and every layer plans for itself
        plans = getattr(swa_metadata, "__dict__", {}).setdefault("_dsv4sel_plans", {})
        key = (impl.impl_name, id(impl), layer.compress_ratio, heads, int(swa_indices.shape[-1]),
               None if extra_indices is None else int(extra_indices.shape[-1]))
        plan = plans.get(key)
        if plan is not None:
            return plan, False
        plan = plans[key] = impl.plan(
            batch=tokens, heads=heads, topk=int(swa_indices.shape[-1]), softmax_scale=float(layer.scale),
            extra_topk=None if extra_indices is None else int(extra_indices.shape[-1]), topk_length=swa_lens,
            extra_topk_length=extra_lens,
            extra_block_size=None if extra_pages is None else impl.layout.block_size_of(extra_pages), device=device)
        return plan, True


def _vllm_global(layer: Any, name: str) -> Any:
    """``name`` as the module of the layer's vLLM base class sees it (vLLM's own function)."""
    return getattr(sys.modules[type(layer)._dsv4sel_base.__module__], name)


def _shared_impl(cls: Any, page_tokens: int) -> Any:
    """The impl object of ``cls``'s rule for pages of ``page_tokens`` tokens, one per process."""
    from ..engine.values import load_impl_class

    key = (cls._dsv4sel_impl, cls._dsv4sel_layout, page_tokens)
    with _lock:
        impl = _impls.get(key)
        if impl is None:
            try:
                impl_cls = load_impl_class(cls._dsv4sel_impl, cls._dsv4sel_allowed, PROFILE.impl_base)
            except ImportError as exc:
                raise SelectionError(f"{exc}; it was selected by {cls._dsv4sel_rule}") from None
            impl = _impls[key] = impl_cls(cls._dsv4sel_layout, page_tokens)
    return impl


def _import_class(path: str) -> Any:
    module_name, _, attr = path.partition(":")
    return getattr(importlib.import_module(module_name), attr, None)


def _where(selection: Any) -> str:
    return f"rule {selection.rule.id} ({selection.rule.location})"


def _check_selection(selection: Any, row: HostLayer, version: str) -> None:
    """Refuse a selection the layer would store otherwise than the rule says (``dsv4sel check``
    proves this per rule, DSV415; a stale cache or an unchecked pack meets it here)."""
    wrong = [f"{name} {got!r} (vLLM's layer: {want!r})" for name, got, want in (
        ("layout", selection.layout, row.layout), ("bytes_per_token", selection.bytes_per_token, row.bytes_per_token),
        ("block_size", selection.block_size, row.block_size)) if got != want]
    if wrong:
        raise SelectionError(
            f"{_where(selection)} serves {selection.impl} in vLLM {version}'s {row.base_name} through dsv4sel's "
            f"pack layer, but selects {', '.join(wrong)}; `dsv4sel check` reports this as DSV415",
            rule=selection.rule, query=selection.query, path=selection.path)


def layer_for(selection: Any) -> type:
    """The pack layer class for ``selection`` (its rule names :data:`PACK_LAYER`): vLLM's layer for the
    decision's model, platform and GPU, with :class:`PackImplAttention` first in its bases."""
    import vllm

    query = selection.query
    row = host_layer(vllm.__version__, query.model, query.platform, query.capability)
    if row is None:
        raise SelectionError(
            f"{_where(selection)} names dsv4sel's pack layer for vllm, but vLLM {vllm.__version__} has no "
            f"DeepSeek-V4 layer that can serve an impl for {query.model} on {query.platform} "
            f"{query.capability or ''}".rstrip() + "; `dsv4sel check` reports this as DSV415",
            rule=selection.rule, query=selection.query, path=selection.path)
    _check_selection(selection, row, vllm.__version__)
    base = _import_class(row.base)
    if not isinstance(base, type):
        raise SelectionError(f"vLLM {vllm.__version__} has no class {row.base} (dsv4sel's pack layer for "
                             f"{_where(selection)})", rule=selection.rule, query=selection.query, path=selection.path)
    allowed = tuple(selection.allowed_impl_modules)
    key = (base, selection.impl, selection.layout, allowed)
    with _lock:
        cls = _classes.get(key)
        if cls is None:
            attrs = {"__module__": __name__, "__doc__": f"dsv4sel's pack layer: vLLM's {row.base_name}, with "
                     f"{selection.impl} as its sparse decode.", "_dsv4sel_impl": selection.impl,
                     "_dsv4sel_layout": selection.layout, "_dsv4sel_allowed": allowed,
                     "_dsv4sel_rule": _where(selection), "_dsv4sel_base": base,
                     "_dsv4sel_v41": query.model == "deepseek_v4_1"}
            family = "V41" if query.model == "deepseek_v4_1" else ""
            name = "PackImpl" + base.__name__.replace("DeepseekV4", "DeepseekV4" + family, 1)
            cls = _classes[key] = type(name, (PackImplAttention, base), attrs)
    return cls


def own_layer(selection: Any, path: str) -> type | None:
    """A pack's own vLLM layer class ``path``, when the process allows its module (the impl
    allow-list); None when it does not (the caller refuses it). It must subclass vLLM's
    DeepSeek-V4 attention layer of the decision's model."""
    from ..engine.values import check_impl_allowed
    from ..errors import ImplLoadError

    try:
        check_impl_allowed(path, tuple(selection.allowed_impl_modules))
    except ImplLoadError:
        return None
    try:
        cls = _import_class(path)
    except BaseException as exc:  # noqa: BLE001 - a pack module failing to import (sys.exit too) is the error
        raise SelectionError(f"{_where(selection)} names the vLLM layer {path}, which cannot be imported: "
                             f"{type(exc).__name__}: {exc}", rule=selection.rule, query=selection.query,
                             path=selection.path) from None
    base_path = _ATTENTION_BASES.get(selection.query.model)
    expected = None if base_path is None else _import_class(base_path)
    if not isinstance(cls, type) or not isinstance(expected, type) or not issubclass(cls, expected):
        raise SelectionError(
            f"{_where(selection)} names the vLLM layer {path}, which is not a subclass of vLLM's "
            f"{_ATTENTION_BASES.get(selection.query.model, 'DeepSeek-V4 attention layer')}", rule=selection.rule,
            query=selection.query, path=selection.path)
    return cls
