"""The plugin's process state (what is patched, the rules it decides with) and its log: every line
goes to ``vllm.dsv4sel`` once per process."""

from __future__ import annotations

import logging
import threading
from typing import Any

#: A logger under vLLM's ``vllm`` logger: vLLM's default logging configuration gives only that
#: logger a handler (``propagate: false``, no root handler), so a line logged anywhere else never
#: shows in ``vllm serve``. As a child it takes vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.dsv4sel")
#: ``patched``: what install() replaced (None: nothing); ``rules``: the RuleSet decided with;
#: ``release``: the release folder install() wired (None: not installed); ``startup``: the
#: start-up line, held until vLLM has configured its logging.
_lock = threading.RLock()
_state: dict[str, Any] = {"patched": None, "rules": None, "release": None}
_logged: set[str] = set()


def _startup(text: str) -> None:
    """Log the start-up line now if anything would print it, else when vLLM has configured its
    logging: ``vllm serve`` loads plugins while it builds its argument parser, before its
    ``configure_logging_from_args``, when the ``vllm`` logger has no handler yet."""
    if logger.hasHandlers():
        _say_once(logging.INFO, text)
    else:
        _state["startup"] = text


def _flush_startup() -> None:
    text = _state.pop("startup", None)
    if text is not None:
        _say_once(logging.INFO, text)


def _say_once(level: int, text: str) -> None:
    from ..engine.text import escape

    # a line may quote a model's architecture name or an exception's text: never raw control characters
    text = escape(text, keep_newlines=True)
    with _lock:
        if text in _logged:
            return
        _logged.add(text)
    logger.log(level, text)

