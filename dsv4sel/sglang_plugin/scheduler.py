"""Guards in SGLang's scheduler process: what is actually built is what the rules decided.

The launcher's resolution hook (:func:`dsv4sel.sglang_plugin.decide`) decides at config time and
publishes the decision in the environment variable :data:`DECISION_ENV` (JSON: the class, the
settings, the deciding rule and its ``file:line``, the KV contract's wire form). SGLang spawns its scheduler processes after
resolution, so they inherit it; ``load_plugins()`` runs there too and :func:`register_guards`
puts SGLang ``HookRegistry`` AFTER hooks on the functions that build the cache and the backend
after the weights load:

- ``deepseek_v4_memory_pool.select_dsv4_kv_layout`` (the main-cache KV layout);
- ``deepseek_v4_trtllm_backend.create_deepseek_v4_attn_backend`` (the class on CUDA and XPU,
  target and draft extend: every caller imports it at call time);
- ``deepseek_v4_backend_hip_radix.DeepseekV4HipRadixBackend.__init__`` (ROCm builds it
  directly, not through that factory).

Each raises :class:`dsv4sel.SelectionError` naming the rule when the built layout or class is not
the decided one (something changed ``SGLANG_DSV4_KV_LAYOUT`` or the resolved arguments after the
decision). With no published decision (another model, or the plugin not asked for in the
launcher) they check nothing.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ..errors import SelectionError

DECISION_ENV = "DSV4SEL_SGLANG_DECISION"
LAYOUT_TARGET = "sglang.srt.mem_cache.deepseek_v4_memory_pool.select_dsv4_kv_layout"
FACTORY_TARGET = "sglang.srt.layers.attention.deepseek_v4_trtllm_backend.create_deepseek_v4_attn_backend"
HIP_TARGET = "sglang.srt.layers.attention.deepseek_v4_backend_hip_radix.DeepseekV4HipRadixBackend.__init__"


def publish(cls: str, settings: dict[str, Any], rule_id: str, location: str, contract: str) -> None:
    """Record the launcher's decision for the scheduler processes it spawns; ``contract`` is the
    wire form of the KV contract SGLang builds for it (:mod:`dsv4sel.sglang_plugin.handshake`)."""
    os.environ[DECISION_ENV] = json.dumps({"class": cls, "kv_layout": settings["kv_layout"],
                                           "rule": rule_id, "location": location, "contract": contract})


def forget() -> None:
    """No decision (another model, or a refused input): the guards check nothing."""
    os.environ.pop(DECISION_ENV, None)


#: the fields a published decision carries, each a string
_FIELDS = ("class", "kv_layout", "rule", "location", "contract")


def published() -> dict[str, str] | None:
    """The launcher's published decision, or None when there is none. A value that is not the
    JSON :func:`publish` writes (edited, truncated, set by hand) is one SelectionError: the guard
    cannot tell what was decided, so it refuses rather than check nothing."""
    text = os.environ.get(DECISION_ENV)
    if not text:
        return None
    try:
        decided = json.loads(text)
    except ValueError:
        decided = None
    if not (isinstance(decided, dict) and all(isinstance(decided.get(k), str) for k in _FIELDS)):
        from ..engine.text import escape

        raise SelectionError(
            f"DeepSeek-V4 attention in SGLang: {DECISION_ENV} is not a decision dsv4sel published "
            f"({escape(text[:120])!r}); it must be the JSON object the launcher's dsv4sel plugin writes, with "
            f"{', '.join(_FIELDS)}. Unset {DECISION_ENV} and launch again with SGLANG_PLUGINS=dsv4sel.")
    return decided


def _refuse(what: str, built: str, decided: dict[str, str], want: str) -> SelectionError:
    return SelectionError(
        f"DeepSeek-V4 attention in SGLang: the scheduler built {what} {built}, but dsv4sel decided {want} "
        f"(rule {decided['rule']} at {decided['location']}); something changed SGLANG_DSV4_KV_LAYOUT or the "
        "resolved server arguments after the decision. Launch again without changing them.")


def check_layout(result, *args, **kwargs) -> None:
    """AFTER ``select_dsv4_kv_layout()``: its (layout, compressed option) has the decided layout."""
    decided = published()
    if decided is None:
        return
    built = result[0].name.lower()
    if built != decided["kv_layout"]:
        raise _refuse("the KV layout", built, decided, decided["kv_layout"])
    return


def _class_path(obj: object) -> str:
    return f"{type(obj).__module__}:{type(obj).__qualname__}"


def check_backend(result, *args, **kwargs) -> None:
    """AFTER ``create_deepseek_v4_attn_backend(runner)``: it built the decided class."""
    decided = published()
    if decided is not None and _class_path(result) != decided["class"]:
        raise _refuse("the attention backend", _class_path(result), decided, decided["class"])


def check_hip_backend(result, self, *args, **kwargs) -> None:
    """AFTER ``DeepseekV4HipRadixBackend.__init__``: the HIP class is the decided one. Its
    multi-step draft subclass runs this ``__init__`` too; a draft is not the target's class."""
    if type(self).__name__ == "DeepseekV4HipRadixBackend":
        check_backend(self)


def register_guards() -> None:
    """Register the three AFTER hooks with SGLang's ``HookRegistry`` (``load_plugins()`` applies
    them right after the plugins ran)."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(LAYOUT_TARGET, check_layout, HookType.AFTER)
    HookRegistry.register(FACTORY_TARGET, check_backend, HookType.AFTER)
    HookRegistry.register(HIP_TARGET, check_hip_backend, HookType.AFTER)
