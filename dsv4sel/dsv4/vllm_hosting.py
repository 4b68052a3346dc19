"""Where vLLM has a DeepSeek-V4 layer that can serve a rule's impl as its sparse decode: data.

A rule whose ``hosts: vllm`` class is dsv4sel's pack layer (:data:`PACK_LAYER`) is built by the
vLLM plugin as vLLM's own layer for the rule's cache layout, with the rule's impl as its sparse
decode (``dsv4sel.vllm_plugin.pack_layer``). This module says, per vLLM release, model, platform and
GPU generation, which of vLLM's layer classes that is and what its cache spec is (layout, bytes
per token, the block size vLLM sets for it), where vLLM's own sparse prefill kernel of that layer
runs, and which of the rules' inputs the layer's ``__init__`` needs. ``dsv4sel check`` reads it to
prove, per rule, that the rule's selection and its impl agree with the layer (DSV415); the plugin
reads it to pick the layer. Nothing here imports vLLM or torch.

The figures are vLLM's (read from its 0.33.0 and 0.34.0 wheels, and held by the vLLM suite, which
builds each layer for real): the layers are the four whose sparse decode is one call site,
``_forward_decode(q, kv_cache, swa_metadata, attn_metadata, swa_only, output)``, reading packed
byte pages (FlashMLA's and FlashInfer's SM120 layers, V4 and V4.1). vLLM's other DeepSeek-V4
layers (FlashInfer's SM10x plain-row layers, ROCm, mega-attention) decode in another shape, and on
AMD, CPU and XPU DeepSeek-V4.0 vLLM builds a fixed class whatever is selected: none of those hosts
an impl.
"""

from __future__ import annotations

from ..engine.hosts import version_matches
from .host_registry import HOSTS
from ..record import Frozen
from .profile import PACK_LAYER  # the vLLM host class a rule names to be served by its own impl

__all__ = ["PACK_LAYER", "HOST_LAYERS", "RELEASES", "HostLayer", "host_layer", "major_of", "releases_of"]

#: The vLLM releases this table describes (``check`` proves a rule for each its spec admits).
#: the vLLM releases the host registry supports (their tested versions)
RELEASES = tuple(r.version for r in HOSTS["vllm"].releases)

_V4 = "vllm.models.deepseek_v4.nvidia"
_V41 = "vllm.models.deepseek_v41.nvidia"
_FLASHMLA_PREFILL = "FlashMLA's flash_mla_sparse_fwd"
_SM120_PREFILL = "FlashInfer's SM120 sparse MLA kernel"


class HostLayer(Frozen):
    """One of vLLM's DeepSeek-V4 layers as a host of a rule's impl, for one (release range, model,
    platform, GPU generations)."""

    __slots__ = ("versions", "model", "platform", "majors", "base", "layout", "bytes_per_token", "block_size",
                 "prefill_majors", "prefill_kernel", "requires")
    versions: str  # the vLLM releases this row holds for
    model: str
    platform: str
    majors: frozenset[int]  # CUDA major versions (9 = SM9x)
    base: str  # vLLM's layer class, "module:Class"
    layout: str  # the cache layout that layer stores (its sliding-window and compressed pages)
    bytes_per_token: int  # its KV-cache spec's bytes per token
    block_size: int  # the cache block size vLLM sets for it
    prefill_majors: frozenset[int]  # where vLLM's own sparse prefill kernel of that layer runs
    prefill_kernel: str  # that kernel, in words
    requires: tuple[tuple[str, str], ...]  # rule inputs the layer's own __init__ needs at these values

    @property
    def base_name(self) -> str:
        return self.base.rpartition(":")[2]


def _rows(versions: str, sm120_v41_block: int) -> tuple[HostLayer, ...]:
    sm120 = (("flashinfer_sm120", "available"),)
    not12 = frozenset({7, 8, 9, 10, 11})
    return (
        HostLayer(versions, "deepseek_v4", "cuda", not12, f"{_V4}.flashmla:DeepseekV4FlashMLAAttention",
                  "fp8_ds_mla", 584, 256, frozenset({9, 10}), _FLASHMLA_PREFILL, ()),
        HostLayer(versions, "deepseek_v4", "cuda", frozenset({12}),
                  f"{_V4}.flashinfer_sparse:DeepseekV4FlashInferSM120Attention", "fp8_ds_mla", 584, 256,
                  frozenset({12}), _SM120_PREFILL, sm120),
        HostLayer(versions, "deepseek_v4_1", "cuda", frozenset({9}), f"{_V41}.flashmla:DeepseekV4FlashMLAAttention",
                  "fp8_ds_mla", 584, 64, frozenset({9, 10}), _FLASHMLA_PREFILL, ()),
        # V4.1's 528-byte record on SM100 only (vllm/models/deepseek_v41/attention.py, _use_v41_mxfp8_kv_record)
        HostLayer(versions, "deepseek_v4_1", "cuda", frozenset({10}), f"{_V41}.flashmla:DeepseekV4FlashMLAAttention",
                  "fp8_ds_mla_v41", 528, 128, frozenset({9, 10}), _FLASHMLA_PREFILL, ()),
        HostLayer(versions, "deepseek_v4_1", "cuda", frozenset({7, 8, 11}),
                  f"{_V41}.flashmla:DeepseekV4FlashMLAAttention", "fp8_ds_mla", 584, 128, frozenset({9, 10}),
                  _FLASHMLA_PREFILL, ()),
        HostLayer(versions, "deepseek_v4_1", "cuda", frozenset({12}),
                  f"{_V41}.flashinfer_sparse:DeepseekV4FlashInferSM120Attention", "fp8_ds_mla", 584,
                  sm120_v41_block, frozenset({12}), _SM120_PREFILL, sm120),
    )


#: vLLM 0.34 moved FlashInfer-V4.1 on SM12x to 64-token kernel blocks (0.33: 128).
HOST_LAYERS: tuple[HostLayer, ...] = (*_rows(">=0.33.0,<0.34", 128), *_rows(">=0.34.0,<0.35", 64))


def major_of(capability: str | None) -> int | None:
    """The CUDA major of a capability value (``"12.1"`` -> 12); None for ``unknown`` or a ROCm arch."""
    head = (capability or "").partition(".")[0]
    return int(head) if head.isdigit() else None


def host_layer(release: str, model: str, platform: str, capability: str | None) -> HostLayer | None:
    """vLLM's layer that hosts an impl for this input on vLLM ``release``, or None where vLLM has none
    (another platform, an unknown capability, a release this table does not describe)."""
    major = major_of(capability)
    for row in HOST_LAYERS:
        if (row.model == model and row.platform == platform and major in row.majors
                and version_matches(release, row.versions)):
            return row
    return None


def releases_of(spec: str) -> tuple[str, ...]:
    """The releases of :data:`RELEASES` a rule's ``versions:`` spec admits."""
    try:
        return tuple(r for r in RELEASES if version_matches(r, spec))
    except ValueError:  # the compiler reports a bad spec (DSV315)
        return ()
