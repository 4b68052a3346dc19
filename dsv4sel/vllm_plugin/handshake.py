"""The KV wire contract in vLLM's NIXL compatibility hash, without changing the NIXL protocol.

vLLM's NIXL connector hashes a few factors of each side (``compute_nixl_compatibility_hash``:
the vLLM and connector versions, the model path and dtype, the first layer's backend name, the
cache dtype *string*, ...) and refuses a remote whose hash differs (``RuntimeError`` "NIXL
compatibility hash mismatch. Local: ..., Remote: ...", at the first request to that remote; the
``enforce_handshake_compat`` escape hatch turns the check off). For DeepSeek-V4 that string is
both too strict (``fp8`` and ``fp8_e4m3`` on FlashInfer's rows are the same bytes) and too weak
(V4.1's 584-byte UE8M0 record on SM90 and its 528-byte MXFP8 record on SM100 both hash as
``fp8_ds_mla``).

The plugin replaces the name where ``nixl/base_worker.py`` imported it (a release folder's
``LATER`` target, patched when vLLM imports NIXL: :mod:`.later`). In a worker whose layers were
built with a dsv4sel decision (the last Selection the resolver applied, ``_state["selection"]``):

- vLLM's own hash is computed with the cache dtype string replaced by the contract's wire form
  (``Selection.contract_for("vllm", vllm.__version__)``, :meth:`KVContract.wire
  <dsv4sel.dsv4.contract.KVContract.wire>`): the contract is hashed, not the spelling;
- the value is that digest, ``;`` and the wire form, so the two sides' values are equal exactly
  when vLLM's other factors and the contracts are, and vLLM's own message prints both contracts
  (the differing field by name) or, for a peer without dsv4sel, a bare digest.

A worker with no decision (another model) gets vLLM's own hash, unchanged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..dsv4.contract import WIRE_PREFIX
from .state import _say_once, _state

SEPARATOR = ";"


class _Over:
    """``real`` read attribute by attribute, with the attributes ``over`` names replaced (what
    vLLM's hash function does with the config: it only reads)."""

    def __init__(self, real: Any, **over: Any):
        self._real, self._over = real, over

    def __getattr__(self, name: str) -> Any:
        over = self.__dict__["_over"]
        return over[name] if name in over else getattr(self.__dict__["_real"], name)


def contract_wire(selection) -> str:
    """The wire form of the contract the installed vLLM builds for ``selection``."""
    import vllm

    return selection.contract_for("vllm", vllm.__version__).wire()


def make_nixl_hash(original: Callable) -> Callable:
    def compute_nixl_compatibility_hash(vllm_config, attn_backend_name, transfer_mode="pull"):
        selection = _state.get("selection")
        if selection is None:
            return original(vllm_config, attn_backend_name, transfer_mode=transfer_mode)
        wire = contract_wire(selection)
        cache = vllm_config.cache_config
        view = _Over(vllm_config, cache_config=_Over(cache, cache_dtype=wire))
        digest = original(view, attn_backend_name, transfer_mode=transfer_mode)
        _say_once(logging.INFO, f"dsv4sel: the NIXL compatibility hash carries this worker's KV contract "
                                f"{wire.split(' ')[2]} (hashed in place of the cache dtype string "
                                f"{cache.cache_dtype}); a peer whose hash has no '{WIRE_PREFIX.strip()}' part "
                                "runs without dsv4sel, and vLLM refuses it")
        return f"{digest}{SEPARATOR}{wire}"

    compute_nixl_compatibility_hash.__doc__ = ("vLLM's NIXL compatibility hash with the worker's dsv4sel KV contract "
                                               "(dsv4sel.vllm_plugin.handshake).")
    return compute_nixl_compatibility_hash
