"""dsv4sel as a vLLM plugin: vLLM 0.33's DeepSeek-V4 / V4.1 attention selection, decided by the rules.

Installed with ``pip install 'dsv4sel[vllm]'``; vLLM runs :func:`register` in
every engine and worker process (entry point ``dsv4sel`` in the group
``vllm.general_plugins``; ``VLLM_PLUGINS=dsv4sel`` selects it by name).

vLLM 0.33 decides in two module globals that it looks up at call time
(nothing imports them by name), so replacing them reaches every call site:

* ``_select_dsv4_attn_cls(vllm_config)`` in ``deepseek_v4/nvidia/model.py``,
  ``deepseek_v41/nvidia/model.py`` and ``deepseek_v41/amd/model.py``: called
  by the decoder layer (also MTP and DSpark) before it builds the attention
  layer. Here dsv4sel takes the whole decision from the config (platform,
  capability or gfx arch, ``--attention-backend``, ``--kv-cache-dtype``,
  model family, and the inputs the rules declare: ``mega_attn``,
  ``prefill_context_parallel`` and ``flashinfer_sm120``, each from vLLM's own answer),
  returns the vLLM layer class the deciding rule names (``hosts: vllm``),
  logs one line naming the rule's ``file:line``, and on a rejection raises
  :class:`dsv4sel.SelectionError` (with suggestions) before any layer is
  built, leaving the config untouched.
* ``_resolve_dsv4_kv_cache_dtype(layout_flag, kv_cache_dtype, cache_config, ...)``
  in ``deepseek_v4/attention.py`` and ``deepseek_v41/attention.py``: called
  from the attention layer's ``__init__``. Here the same decision is taken
  again (it is memoized) and its rewrites are applied to ``cache_config`` all
  or nothing; the function returns the Selection's cache dtype string and
  torch dtype. It refuses a layer whose class or layout flag is not the one
  the rules name.

AMD, CPU and XPU DeepSeek-V4.0 hard-code their layer class in vLLM 0.33 and
never call ``_select_dsv4_attn_cls``: there the resolver is the only hook. It
enforces the rules' rejections (raised in the first attention layer's
``__init__``, before the config is changed), rewrites and dtypes, and checks
that the hard-coded class is the one the rules name; it cannot make vLLM build
another class. docs/vllm.md lists what is enforced where.

The plugin patches only the vLLM versions it was written for
(:data:`SUPPORTED`): any other version gets one RuntimeError and nothing is
patched. Every target is looked up and checked before the first one is
replaced, so it never half-patches.
"""

from __future__ import annotations

import inspect
import logging
import sys
import threading
from typing import Any, Callable

from ..errors import SelectionError
from ..engine.hosts import version_matches

#: vLLM versions this plugin's targets and config reading are written for.
SUPPORTED = ">=0.33.0,<0.34"
HOST = "vllm"

logger = logging.getLogger("dsv4sel.vllm_plugin")

# (module, attribute, model family, expected parameters): what register() replaces.
_SELECT = ("vllm_config",)
_RESOLVE_V4 = ("use_fp8_ds_mla_layout", "kv_cache_dtype", "cache_config")
_RESOLVE_V41 = ("use_fp8_ds_mla_layout", "kv_cache_dtype", "cache_config", "packed_kv_cache_dtype")
_TARGETS = {
    "cuda": (
        ("vllm.models.deepseek_v4.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4", _RESOLVE_V4),
        ("vllm.models.deepseek_v41.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4_1", _RESOLVE_V41),
        ("vllm.models.deepseek_v4.nvidia.model", "_select_dsv4_attn_cls", "deepseek_v4", _SELECT),
        ("vllm.models.deepseek_v41.nvidia.model", "_select_dsv4_attn_cls", "deepseek_v4_1", _SELECT),
    ),
    "rocm": (
        ("vllm.models.deepseek_v4.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4", _RESOLVE_V4),
        ("vllm.models.deepseek_v41.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4_1", _RESOLVE_V41),
        ("vllm.models.deepseek_v41.amd.model", "_select_dsv4_attn_cls", "deepseek_v4_1", _SELECT),
    ),
    # vLLM 0.33 sends DeepSeek-V4.1 on every non-ROCm platform to its NVIDIA code.
    "cpu": (
        ("vllm.models.deepseek_v4.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4", _RESOLVE_V4),
        ("vllm.models.deepseek_v41.attention", "_resolve_dsv4_kv_cache_dtype", "deepseek_v4_1", _RESOLVE_V41),
        ("vllm.models.deepseek_v41.nvidia.model", "_select_dsv4_attn_cls", "deepseek_v4_1", _SELECT),
    ),
}
_TARGETS["xpu"] = _TARGETS["cpu"]

_lock = threading.Lock()
_state: dict[str, Any] = {"patched": None, "rules": None}
_logged: set[str] = set()


class PluginError(RuntimeError):
    """The plugin cannot patch this vLLM (wrong version, a target missing or changed)."""


# ------------------------------------------------------------------ entry point
def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point. Idempotent (vLLM loads
    plugins once per process, but may call this in many processes)."""
    install()


def install(rules: Any = None) -> list[tuple[str, str]]:
    """Patch vLLM; returns the ``(module, attribute)`` pairs replaced.

    ``rules`` is the :class:`dsv4sel.RuleSet` to decide with (default: the
    shipped rules plus installed packs, as :func:`dsv4sel.select`). Raises
    :class:`PluginError`, with nothing patched, on an unsupported vLLM.
    """
    with _lock:
        if rules is not None:
            _state["rules"] = rules
        if _state["patched"] is not None:
            return [(m, a) for m, a, _ in _state["patched"]]
        import vllm

        version = getattr(vllm, "__version__", "unknown")
        try:
            supported = version_matches(version, SUPPORTED)
        except ValueError:
            supported = False
        if not supported:
            raise PluginError(
                f"dsv4sel's vLLM plugin is written for vllm {SUPPORTED} and this is vllm {version}; "
                "it patched nothing. Install a vLLM in that range, a dsv4sel release written for "
                f"vllm {version}, or leave dsv4sel out of VLLM_PLUGINS.")
        platform = _platform()
        targets = _TARGETS.get(platform)
        if targets is None:
            raise PluginError(f"dsv4sel's vLLM plugin has no targets for platform {platform!r}; "
                              "it patched nothing")
        # look everything up first: any missing or changed target patches nothing
        import importlib

        found = []
        for module_name, attr, model, params in targets:
            try:
                module = importlib.import_module(module_name)
            except Exception as exc:
                raise PluginError(f"dsv4sel's vLLM plugin cannot import {module_name} on vllm {version} "
                                  f"({type(exc).__name__}: {exc}); it patched nothing") from exc
            original = getattr(module, attr, None)
            got = tuple(inspect.signature(original).parameters) if callable(original) else None
            if got != params:
                raise PluginError(f"dsv4sel's vLLM plugin expected {module_name}.{attr}"
                                  f"({', '.join(params)}) on vllm {version}, found "
                                  f"{'nothing' if got is None else '(' + ', '.join(got) + ')'}; "
                                  "it patched nothing")
            wrapper = (_make_select(model, original) if attr == "_select_dsv4_attn_cls"
                       else _make_resolve(model, original))
            found.append((module, attr, original, wrapper))
        done = []
        try:
            for module, attr, original, wrapper in found:
                setattr(module, attr, wrapper)
                done.append((module, attr, original))
        except Exception:  # pragma: no cover - setattr on a module does not fail
            for module, attr, original in done:
                setattr(module, attr, original)
            raise
        _state["patched"] = [(m.__name__, a, o) for m, a, o in done]
        logger.info("dsv4sel: DeepSeek-V4 attention selection of vllm %s is decided by dsv4sel "
                    "(%d functions replaced on %s)", version, len(done), platform)
        return [(m, a) for m, a, _ in _state["patched"]]


def uninstall() -> None:
    """Put vLLM's own functions back (for tests)."""
    import importlib

    with _lock:
        for module_name, attr, original in _state["patched"] or ():
            setattr(importlib.import_module(module_name), attr, original)
        _state["patched"] = None
        _state["rules"] = None


# ------------------------------------------------------------------ reading vLLM
def _platform() -> str:
    from vllm.platforms import current_platform as p

    if p.is_cuda():
        return "cuda"
    if p.is_rocm():
        return "rocm"
    if p.is_xpu():
        return "xpu"
    if p.is_cpu():
        return "cpu"
    return str(getattr(p, "device_name", "unknown"))


def _capability(platform: str) -> str | None:
    """CUDA ``major.minor`` or the ROCm gfx arch as vLLM read it; None when unknown."""
    from vllm.platforms import current_platform as p

    if platform == "cuda":
        cap = p.get_device_capability()
        return None if cap is None else f"{cap.major}.{cap.minor}"
    if platform == "rocm":
        rocm = sys.modules.get("vllm.platforms.rocm")
        arch = getattr(rocm, "_GCN_ARCH", None) if rocm is not None else None
        return arch.split(":")[0] if arch else None
    return None


def _mega_attn(vllm_config: Any, model: str, platform: str) -> str:
    """Whether vLLM's mega-attention layer can serve this config: the kernel is
    built and usable here and the topology gives it 8 heads per ``wo_a`` group
    (vLLM's own ``is_available_for``)."""
    if model != "deepseek_v4_1" or platform != "cuda":
        return "unavailable"
    from vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn import DeepseekV4MegaAttnAttention

    return "available" if DeepseekV4MegaAttnAttention.is_available_for(vllm_config) else "unavailable"


def _flashinfer_sm120(vllm_config: Any, model: str, platform: str, capability: str | None) -> str:
    """Whether FlashInfer has the SM120 decode specialization the SM120 layer will ask for: the
    same question, with vLLM's own functions, that the layer's ``__init__`` asks (and raises on)."""
    if platform != "cuda" or not capability or not capability.startswith("12."):
        return "available"
    import importlib

    package = "deepseek_v4" if model == "deepseek_v4" else "deepseek_v41"
    layer_module = importlib.import_module(f"vllm.models.{package}.nvidia.flashinfer_sparse")
    flashinfer = importlib.import_module("vllm.utils.flashinfer")
    hf = vllm_config.model_config.hf_config
    hf = getattr(hf, "text_config", hf)
    tp = getattr(getattr(vllm_config, "parallel_config", None), "tensor_parallel_size", 1) or 1
    padded = layer_module.DeepseekV4FlashInferSM120Attention.get_padded_num_q_heads(hf.num_attention_heads // tp)
    top_k = layer_module._required_sm120_sparse_topk(vllm_config, hf.sliding_window)
    return "available" if flashinfer.has_flashinfer_sparse_mla_sm120_config(padded, top_k) else "missing"


def _rules():
    rules = _state["rules"]
    if rules is None:
        import dsv4sel

        rules = _state["rules"] = dsv4sel.default_rules()
    return rules


def query_of(vllm_config: Any, model: str, kv_cache_dtype: str | None = None) -> dict[str, Any]:
    """The dsv4sel query for a vLLM config: keyword arguments of ``RuleSet.select``."""
    platform = _platform()
    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if kv_cache_dtype is None:
        kv_cache_dtype = getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", None) or "auto"
    extra: dict[str, str] = {}
    rules = _rules()
    if "mega_attn" in rules.extra_inputs:
        extra["mega_attn"] = _mega_attn(vllm_config, model, platform)
    capability = _capability(platform)
    if "flashinfer_sm120" in rules.extra_inputs:
        extra["flashinfer_sm120"] = _flashinfer_sm120(vllm_config, model, platform, capability)
    pcp = getattr(getattr(vllm_config, "parallel_config", None), "prefill_context_parallel_size", 1) or 1
    if "prefill_context_parallel" in rules.extra_inputs:
        # declared per model: vLLM 0.33 decides on it for V4.1 only (V4.0 has just "off")
        on = pcp > 1 and "on" in rules.values("prefill_context_parallel", model)
        extra["prefill_context_parallel"] = "on" if on else "off"
    elif pcp > 1 and model == "deepseek_v4_1":
        raise SelectionError(
            "DeepSeek-V4.1 with prefill context parallelism: vLLM 0.33 decides on it, but these rules "
            "declare no prefill_context_parallel input, so dsv4sel cannot decide it")
    return {"platform": platform, "capability": capability,
            "backend": getattr(backend, "name", backend), "kv_cache_dtype": str(kv_cache_dtype),
            "model": model, "extra": extra}


def decide(vllm_config: Any, model: str, kv_cache_dtype: str | None = None):
    """The Selection for a vLLM config (raises SelectionError on a rejection)."""
    return _rules().select(**query_of(vllm_config, model, kv_cache_dtype))


def _explain_hint(sel_or_query: dict) -> str:
    q = sel_or_query
    parts = [f"--platform {q['platform']}"]
    if q["capability"]:
        parts.append(f"--capability {q['capability']}")
    if q["backend"]:
        parts.append(f"--backend {q['backend']}")
    parts.append(f"--kv-cache-dtype {q['kv_cache_dtype']}")
    if q["model"] != "deepseek_v4":
        parts.append(f"--model {q['model']}")
    rules = _rules()
    parts += [f"--input {k}={v}" for k, v in sorted(q["extra"].items()) if v != rules.default_of(k)]
    return "dsv4sel explain " + " ".join(parts)


def host_class(selection) -> type:
    """Import the vLLM layer class the deciding rule names for this vLLM."""
    import importlib

    import vllm

    named = selection.host_class(HOST)
    if named is None:
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) selects {selection.backend} but names "
            "no vLLM layer class (hosts: vllm); vLLM cannot build it", rule=selection.rule,
            query=selection.query, path=selection.path)
    cls_path, versions = named
    if not version_matches(vllm.__version__, versions):
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) names {cls_path} for vllm {versions}, "
            f"not for vllm {vllm.__version__}", rule=selection.rule, query=selection.query, path=selection.path)
    module_name, _, attr = cls_path.partition(":")
    if module_name != "vllm" and not module_name.startswith("vllm."):  # pragma: no cover - compile refuses it
        raise SelectionError(f"host class {cls_path} is outside vllm", rule=selection.rule)
    return getattr(importlib.import_module(module_name), attr)


def _log_decision(selection, cls: type, query: dict) -> None:
    line = (f"dsv4sel: {selection.backend} -> {cls.__module__}.{cls.__qualname__}, "
            f"cache_dtype {selection.cache_dtype}, decided by {selection.rule.id} "
            f"({selection.rule.location}); `{_explain_hint(query)}` shows why")
    with _lock:
        if line in _logged:
            return
        _logged.add(line)
    logger.info(line)
    for message in selection.messages:
        text = f"dsv4sel: {message}"
        with _lock:
            if text in _logged:
                continue
            _logged.add(text)
        logger.log(logging.WARNING if message.level == "warning" else logging.INFO, text)


# ------------------------------------------------------------------ the replacements
def _make_select(model: str, original: Callable) -> Callable:
    def _select_dsv4_attn_cls(vllm_config):
        query = query_of(vllm_config, model)
        selection = _rules().select(**query)  # SelectionError: nothing was built or changed
        cls = host_class(selection)
        _log_decision(selection, cls, query)
        return cls

    _select_dsv4_attn_cls.__wrapped_vllm__ = original
    _select_dsv4_attn_cls.__doc__ = f"dsv4sel's decision for {model} (replaces vLLM's {original.__qualname__})."
    return _select_dsv4_attn_cls


def _layer_of_caller() -> Any:
    """The attention layer whose ``__init__`` called the resolver, if any."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename == __file__:
        frame = frame.f_back
    layer = frame.f_locals.get("self") if frame is not None else None
    return layer if layer is not None and hasattr(layer, "_uses_fp8_ds_mla_layout") else None


def _make_resolve(model: str, original: Callable) -> Callable:
    def resolve(use_fp8_ds_mla_layout, kv_cache_dtype, cache_config, packed_kv_cache_dtype="fp8_ds_mla"):
        from vllm.config import get_current_vllm_config_or_none

        vllm_config = get_current_vllm_config_or_none()
        if vllm_config is None:
            raise SelectionError("dsv4sel: no current vLLM config while resolving the DeepSeek-V4 kv-cache "
                                 "dtype (called outside vLLM's model construction)")
        query = query_of(vllm_config, model, kv_cache_dtype)
        selection = _rules().select(**query)
        cls = host_class(selection)
        layer = _layer_of_caller()
        if layer is not None and not isinstance(layer, cls):
            raise SelectionError(
                f"vLLM is building {type(layer).__qualname__}, but {selection.rule.id} "
                f"({selection.rule.location}) names {cls.__qualname__} for this config; "
                "vLLM 0.33 hard-codes this platform's class, so the rules must name it",
                rule=selection.rule, query=selection.query, path=selection.path)
        packed = selection.torch_dtype_name == "uint8"
        if bool(use_fp8_ds_mla_layout) != packed:
            raise SelectionError(
                f"the layer stores {'packed' if use_fp8_ds_mla_layout else 'plain-row'} KV records but "
                f"{selection.rule.id} ({selection.rule.location}) selects layout {selection.layout} "
                f"({selection.torch_dtype_name})", rule=selection.rule, query=selection.query,
                path=selection.path)
        selection.apply(cache_config)  # all or nothing
        _log_decision(selection, cls, query)
        return selection.cache_dtype, selection.torch_dtype

    resolve.__name__ = resolve.__qualname__ = "_resolve_dsv4_kv_cache_dtype"
    resolve.__wrapped_vllm__ = original
    if model == "deepseek_v4":
        # keep vLLM's 3-parameter signature for V4.0 (install() checks signatures)
        def resolve_v4(use_fp8_ds_mla_layout, kv_cache_dtype, cache_config):
            return resolve(use_fp8_ds_mla_layout, kv_cache_dtype, cache_config)

        resolve_v4.__name__ = resolve_v4.__qualname__ = "_resolve_dsv4_kv_cache_dtype"
        resolve_v4.__wrapped_vllm__ = original
        return resolve_v4
    return resolve
