"""Drop-in replacements for vLLM's hand-written DeepSeek-V4 selection
(``vllm/models/deepseek_v4/attention.py`` at the seed commit).

Same names without the leading underscore, same arguments and return values::

    from dsv4sel.vllm import (resolve_dsv4_backend, resolve_dsv4_kv_cache_dtype,
                              select_v4_sparse_impl)

Differences, all deliberate: the default ``auto`` dtype works, ROCm never
gets a CUDA-only impl, fp8_e5m2 and non-fp8 dtypes are rejected instead of
rewritten or asserted, and a rejection raises :class:`~dsv4sel.SelectionError`
(a ValueError) with working alternatives while leaving ``cache_config``
untouched. Configs are duck-typed, so vLLM is not imported.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from . import select
from .dsv4.platform import detect
from .dsv4.selection import Selection

logger = logging.getLogger("dsv4sel")
_logged: set[tuple[int, str]] = set()
_logged_lock = threading.Lock()


def _log_once(level: int, text: str) -> None:
    with _logged_lock:
        if (level, text) in _logged:
            return
        _logged.add((level, text))
    logger.log(level, text)


def _log_messages(selection: Selection) -> None:
    for message in selection.messages:
        _log_once(logging.WARNING if message.level == "warning" else logging.INFO, str(message))


def _where(platform: str | None, capability: Any) -> tuple[str, Any]:
    if platform is None:
        return detect()
    return platform, capability


def resolve_dsv4_backend(vllm_config: Any) -> Any:
    """Return the explicitly requested attention backend (an enum member, a
    name, or whatever ``vllm_config.attention_config.backend`` holds), or None."""
    if vllm_config is None:
        return None
    attention_config = getattr(vllm_config, "attention_config", None)
    return getattr(attention_config, "backend", None) if attention_config is not None else None


def resolve_dsv4_kv_cache_dtype(backend: Any, kv_cache_dtype: str, cache_config: Any, *,
                                platform: str | None = None, capability: Any = None):
    """Map ``(backend, --kv-cache-dtype)`` to ``(cache_dtype_str, torch.dtype)``.

    ``backend`` is None (platform default), a name or an enum member. When the
    rules rewrite the cache config (e.g. ``cache_dtype`` -> ``fp8_ds_mla``) the
    rewrite is applied to ``cache_config`` (if given) and the info message is
    logged once. ``platform=None`` detects platform and capability.
    Raises :class:`~dsv4sel.SelectionError`; ``cache_config`` is then untouched.
    """
    platform, capability = _where(platform, capability)
    selection = select(platform=platform, capability=capability, backend=backend,
                       kv_cache_dtype=kv_cache_dtype)
    selection.apply(cache_config)
    _log_messages(selection)
    return selection.cache_dtype, selection.torch_dtype


def select_v4_sparse_impl(vllm_config: Any = None, *, platform: str | None = None,
                          capability: Any = None) -> type:
    """Pick the DeepSeek-V4 sparse MLA impl class for ``vllm_config``.

    Reads ``attention_config.backend`` and ``cache_config.cache_dtype`` (``auto``
    when absent), logs ``Using <BACKEND> backend.`` once, and returns the class
    named by the deciding rule (imported only from the allow-listed modules).
    """
    backend = resolve_dsv4_backend(vllm_config)
    cache_config = getattr(vllm_config, "cache_config", None)
    kv_cache_dtype = getattr(cache_config, "cache_dtype", None) or "auto"
    platform, capability = _where(platform, capability)
    selection = select(platform=platform, capability=capability, backend=backend,
                       kv_cache_dtype=kv_cache_dtype)
    _log_once(logging.INFO, f"Using {selection.backend} backend.")
    return selection.load_impl()
