"""dsv4sel as a vLLM plugin: vLLM 0.33's DeepSeek-V4 / V4.1 attention selection, decided by the rules.

Installed with ``pip install 'dsv4sel[vllm]'``; vLLM runs :func:`register` in every engine and
worker process (entry point ``dsv4sel`` in the group ``vllm.general_plugins``): with
``VLLM_PLUGINS`` unset it loads every installed plugin, so installed means active.

The decision is taken when vLLM validates its configuration: the current platform's
``check_and_update_config`` (which ``VllmConfig.__post_init__`` calls) is wrapped, and for a
DeepSeek-V4 / V4.1 architecture the rules decide there, on every platform, before the model, any
layer or any weight; a rejection raises :class:`dsv4sel.SelectionError` (with suggestions) and the
decision is logged once, with the path of deciding rules and the ``dsv4sel explain`` command.
``AttentionConfig.__post_init__`` is wrapped to keep the backend name the user gave (vLLM erases
the MiniMax aliases ``CUTLASS_MSA`` / ``TRITON_MSA``), so an explicit backend is always decided.

vLLM 0.33 then builds the layer through module globals looked up at call time (nothing imports
them by name), and those are replaced too, deciding the same input again (memoized):

* ``_select_dsv4_attn_cls(vllm_config)`` in ``deepseek_v4/nvidia/model.py``,
  ``deepseek_v41/nvidia/model.py`` and ``deepseek_v41/amd/model.py`` returns the vLLM layer class
  the deciding rule names (``hosts: vllm``), imported only from :data:`HOST_MODULES`;
* ``_resolve_dsv4_kv_cache_dtype(layout_flag, kv_cache_dtype, cache_config, ...)`` in
  ``deepseek_v4/attention.py`` and ``deepseek_v41/attention.py`` applies the rewrites to
  ``cache_config`` all or nothing and returns the Selection's cache dtype and torch dtype; it
  refuses a layer whose class or layout flag is not the one the rules name.

AMD, CPU and XPU DeepSeek-V4.0 hard-code their layer class (:data:`HARDCODED`): the config-time
decision checks that the rules name exactly it.

Loading never stops vLLM for what the plugin does not decide: with no platform, a vLLM version
it is not written for (:data:`SUPPORTED`) or a broken vLLM it patches nothing and logs one line,
unless the user named it in ``VLLM_PLUGINS``; then that is one :class:`PluginError`. Every
target is looked up and checked before the first one is replaced, so it never half-patches.
"""

from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import types
from typing import Any, Callable

from ..errors import SelectionError
from ..engine.hosts import version_matches

#: vLLM versions this plugin's targets and config reading are written for.
SUPPORTED = ">=0.33.0,<0.34"
HOST = "vllm"

#: A logger under vLLM's ``vllm`` logger: vLLM's default logging configuration gives only that
#: logger a handler (``propagate: false``, no root handler), so a line logged anywhere else never
#: shows in ``vllm serve``. As a child it takes vLLM's handler, format and VLLM_LOGGING_LEVEL.
logger = logging.getLogger("vllm.dsv4sel")

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

#: The only modules a vLLM host class may come from: vLLM 0.33's DeepSeek-V4 / V4.1 attention
#: layer modules. A rule (or a cache entry) naming any other module, ``vllm.evil`` included, is
#: refused before anything is imported: a prefix check would import whatever ``vllm.*`` names.
HOST_MODULES = frozenset({
    "vllm.models.deepseek_v4.nvidia.flashmla", "vllm.models.deepseek_v4.nvidia.flashinfer_sparse",
    "vllm.models.deepseek_v4.amd.rocm", "vllm.models.deepseek_v4.cpu.cpu_sparse",
    "vllm.models.deepseek_v4.xpu.xpu_sparse", "vllm.models.deepseek_v41.nvidia.flashmla",
    "vllm.models.deepseek_v41.nvidia.flashinfer_sparse", "vllm.models.deepseek_v41.nvidia.flash_mla_mega_attn",
    "vllm.models.deepseek_v41.amd.rocm",
})
#: The class vLLM 0.33 hard-codes where it has no selection function (AMD, CPU, XPU V4.0):
#: the rules must name exactly it, checked when vLLM validates its configuration.
HARDCODED = {
    ("deepseek_v4", "rocm"): "vllm.models.deepseek_v4.amd.rocm:DeepseekV4ROCMAiterMLAAttention",
    ("deepseek_v4", "cpu"): "vllm.models.deepseek_v4.cpu.cpu_sparse:DeepseekV4CPUAttention",
    ("deepseek_v4", "xpu"): "vllm.models.deepseek_v4.xpu.xpu_sparse:DeepseekV4XPUAttention",
}
#: vLLM's model packages (``ModelRegistry``'s module of an architecture) and the rules' model.
MODEL_PACKAGES = {"vllm.models.deepseek_v4": "deepseek_v4", "vllm.models.deepseek_v41": "deepseek_v4_1"}
#: Attribute the patched ``AttentionConfig.__post_init__`` leaves on the config: the backend the
#: user named, before vLLM erases ``CUTLASS_MSA`` / ``TRITON_MSA`` (MiniMax aliases) to None.
REQUESTED = "_dsv4sel_requested_backend"

_lock = threading.RLock()
_state: dict[str, Any] = {"patched": None, "rules": None}
_logged: set[str] = set()


class PluginError(ValueError):
    """The plugin cannot patch this vLLM: a version it is not written for, a vLLM that fails to
    import, or a target missing or changed. Nothing was patched. The only exception
    :func:`install` and :func:`register` raise."""


# ------------------------------------------------------------------ entry point
def requested() -> bool:
    """Whether the user named this plugin in ``VLLM_PLUGINS`` (vLLM's comma-separated filter).
    Unset, vLLM loads every installed plugin: the user did not ask for this one."""
    value = os.environ.get("VLLM_PLUGINS")
    return value is not None and "dsv4sel" in (part.strip() for part in value.split(","))


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


def register() -> None:
    """vLLM's ``vllm.general_plugins`` entry point, run in every engine and worker process.

    Installed means active: with ``VLLM_PLUGINS`` unset vLLM runs this for every installed
    plugin. Then nothing here stops vLLM: where the plugin cannot patch (no platform, a vLLM
    version it is not written for, a broken vLLM) it patches nothing and logs one line saying
    so. When the user named it (``VLLM_PLUGINS=dsv4sel``) those are one :class:`PluginError`,
    except "no platform", which is never an error (``vllm serve --help`` on a laptop)."""
    try:
        install()
    except PluginError as exc:
        if requested():
            raise PluginError(f"{exc} (VLLM_PLUGINS names dsv4sel: take it out to run vLLM's own "
                              "selection)") from None  # one error, not a chain of tracebacks
        _say_once(logging.WARNING, f"dsv4sel: {exc} (loaded because it is installed; uninstall dsv4sel or "
                                   "set VLLM_PLUGINS to the plugins you want)")


def install(rules: Any = None) -> list[tuple[str, str]]:
    """Patch vLLM; returns the ``(module, attribute)`` pairs replaced (empty where vLLM found no
    platform: then nothing is patched and one line says so).

    ``rules`` is the :class:`dsv4sel.RuleSet` to decide with (default: the shipped rules plus
    installed packs and ``DSV4SEL_RULES_PATH``, as :func:`dsv4sel.select`). Raises
    :class:`PluginError`, and only that, with nothing patched, on an unsupported or broken vLLM.
    """
    with _lock:
        if rules is not None:
            _state["rules"] = rules
        if _state["patched"] is not None:
            return [(m, a) for m, a, _ in _state["patched"]]
        try:
            plan = _plan()
        except PluginError:
            raise
        except BaseException as exc:  # a broken vLLM: SystemExit from its import included
            if isinstance(exc, KeyboardInterrupt):
                raise
            raise PluginError(f"dsv4sel's vLLM plugin cannot read this vLLM ({type(exc).__name__}: "
                              f"{_one_line(exc)}); it patched nothing") from exc
        if plan is None:
            return []
        version, platform, found = plan
        for owner, attr, _original, wrapper in found:
            setattr(owner, attr, wrapper)  # setattr on a module or class does not fail
        _state["patched"] = [(owner, attr, original) for owner, attr, original, _ in found]
        _startup(f"dsv4sel: DeepSeek-V4 attention selection of vllm {version} is decided by dsv4sel "
                 f"({len(found)} functions replaced on {platform}; decided when vLLM validates its config)")
        return [(_name(o), a) for o, a, _ in _state["patched"]]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else repr(exc)[:300]


def _name(owner: Any) -> str:
    return owner.__name__ if isinstance(owner, types.ModuleType) else f"{owner.__module__}.{owner.__qualname__}"


def _plan():
    """``(version, platform, [(owner, attribute, original, wrapper)])`` or None (no platform).
    Looks every target up and checks its signature before anything is replaced."""
    import importlib

    import vllm

    version = getattr(vllm, "__version__", None)
    if not isinstance(version, str):
        raise PluginError(f"dsv4sel's vLLM plugin cannot tell this vLLM's version (vllm.__version__ is "
                          f"{type(version).__name__}); it patched nothing")
    try:
        supported = version_matches(version, SUPPORTED)
    except (TypeError, ValueError):
        supported = False
    if not supported:
        raise PluginError(
            f"dsv4sel's vLLM plugin is written for vllm {SUPPORTED} and this is vllm {version}; it patched "
            f"nothing. Install a vLLM in that range or a dsv4sel release written for vllm {version}")
    platform = _platform()
    targets = _TARGETS.get(platform)
    if targets is None:
        _startup(f"dsv4sel: vLLM found no platform dsv4sel decides for ({platform}); DeepSeek-V4 "
                 "attention selection stays vLLM's own, nothing was patched")
        return None
    found = []
    for module_name, attr, model, params in targets:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise PluginError(f"dsv4sel's vLLM plugin cannot import {module_name} on vllm {version} "
                              f"({type(exc).__name__}: {_one_line(exc)}); it patched nothing") from exc
        original = getattr(module, attr, None)
        _expect(f"{module_name}.{attr}", original, params, version)
        wrapper = (_make_select(model, original) if attr == "_select_dsv4_attn_cls"
                   else _make_resolve(model, original))
        found.append((module, attr, original, wrapper))
    from vllm.config import AttentionConfig
    from vllm.platforms import current_platform

    post_init = AttentionConfig.__dict__.get("__post_init__")
    _expect("vllm.config.AttentionConfig.__post_init__", post_init, ("self",), version)
    found.append((AttentionConfig, "__post_init__", post_init, _make_post_init(post_init)))
    platform_cls = type(current_platform)
    hook = getattr(platform_cls, "check_and_update_config", None)
    _expect(f"{platform_cls.__qualname__}.check_and_update_config", hook, ("vllm_config",), version)
    raw = inspect.getattr_static(platform_cls, "check_and_update_config")
    found.append((platform_cls, "check_and_update_config", raw, _make_config_hook(hook)))
    return version, platform, found


def _expect(where: str, original: Any, params: tuple[str, ...], version: str) -> None:
    """Refuse (PluginError) a target that is missing or whose parameters are not ``params``."""
    try:
        got = tuple(inspect.signature(original).parameters) if callable(original) else None
    except (TypeError, ValueError) as exc:
        raise PluginError(f"dsv4sel's vLLM plugin cannot read the signature of {where} on vllm {version} "
                          f"({type(exc).__name__}: {_one_line(exc)}); it patched nothing") from exc
    if got != params:
        raise PluginError(f"dsv4sel's vLLM plugin expected {where}({', '.join(params)}) on vllm {version}, "
                          f"found {'nothing' if got is None else '(' + ', '.join(got) + ')'}; it patched nothing")


def uninstall() -> None:
    """Put vLLM's own functions back (for tests)."""
    with _lock:
        for owner, attr, original in _state["patched"] or ():
            setattr(owner, attr, original)
        _state["patched"] = None
        _state["rules"] = None
        _logged.clear()


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
    return type(p).__name__  # UnspecifiedPlatform, or an out-of-tree platform


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
    attention = getattr(vllm_config, "attention_config", None)
    # the name the user gave, before AttentionConfig erased a MiniMax alias (CUTLASS_MSA...)
    backend = getattr(attention, REQUESTED, None) or getattr(attention, "backend", None)
    if kv_cache_dtype is None:
        kv_cache_dtype = getattr(getattr(vllm_config, "cache_config", None), "cache_dtype", None) or "auto"
    extra: dict[str, str] = {}
    rules = _rules()
    if "mega_attn" in rules.extra_inputs:
        extra["mega_attn"] = _mega_attn(vllm_config, model, platform)
    capability = _capability(platform)
    if "flashinfer_sm120" in rules.extra_inputs:
        extra["flashinfer_sm120"] = _flashinfer_sm120(vllm_config, model, platform, capability)
    pcp = getattr(getattr(vllm_config, "parallel_config", None), "prefill_context_parallel_size", 1)
    if pcp is None:
        pcp = 1
    if type(pcp) is not int:  # a string "2" would compare as TypeError deep in the query
        raise SelectionError(
            f"dsv4sel: parallel_config.prefill_context_parallel_size is {pcp!r} ({type(pcp).__name__}); "
            "it must be an int (vLLM's --prefill-context-parallel-size)")
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
    if module_name not in HOST_MODULES:
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) names the vLLM class {cls_path}, which is "
            f"not in one of vLLM's DeepSeek-V4 attention modules ({', '.join(sorted(HOST_MODULES))}); "
            "dsv4sel imports no other module", rule=selection.rule, query=selection.query, path=selection.path)
    cls = getattr(importlib.import_module(module_name), attr, None)
    if not isinstance(cls, type):
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) names {cls_path}, which vllm "
            f"{vllm.__version__} does not have as a class", rule=selection.rule, query=selection.query,
            path=selection.path)
    return cls


def _path_text(selection) -> str:
    """Every rule that decided, in order (a pack's default rule, then the table rule)."""
    refs = tuple(selection.path) or (selection.rule,)
    return ", then ".join(f"{r.id} ({r.location})" for r in refs)


def decision_line(selection, cls: type, query: dict) -> str:
    """The one log line of a decision: backend, vLLM class, cache dtype (with its rewrite), the
    whole path of deciding rules with ``file:line`` and the ``dsv4sel explain`` command."""
    kv = query["kv_cache_dtype"]
    rewrites = ", ".join(f"{k} {kv if k == 'cache_dtype' else ''} -> {v}".replace("  ", " ")
                         for k, v in sorted(selection.rewrites.items()))
    return (f"dsv4sel: {query['model']} attention {selection.backend} -> {cls.__module__}.{cls.__qualname__}, "
            f"kv cache {selection.cache_dtype} ({selection.layout}, {selection.bytes_per_token} B/token, "
            f"block {selection.block_size})"
            f"{'; rewrites ' + rewrites if rewrites else ''}; decided by {_path_text(selection)}; "
            f"`{_explain_hint(query)}` shows why")


def _log_decision(selection, cls: type, query: dict) -> None:
    _flush_startup()
    _say_once(logging.INFO, decision_line(selection, cls, query))
    for message in selection.messages:
        _say_once(logging.WARNING if message.level == "warning" else logging.INFO, f"dsv4sel: {message}")


def model_of(vllm_config: Any) -> str | None:
    """The rules' model for the config's architecture (vLLM's own registry says which package
    serves it), or None when it is not DeepSeek-V4 / V4.1."""
    model_config = getattr(vllm_config, "model_config", None)
    if model_config is None:
        return None
    from vllm.model_executor.models.registry import ModelRegistry

    for arch in getattr(model_config, "architectures", None) or ():
        registered = ModelRegistry.models.get(arch)
        family = MODEL_PACKAGES.get(getattr(registered, "module_name", None))
        if family is not None:
            return family
    return None


def decide_config(vllm_config: Any):
    """The decision taken when vLLM validates its configuration (``VllmConfig.__post_init__``
    calls the platform's ``check_and_update_config``): before the model, any layer or any weight.
    Returns the Selection (None for a model that is not DeepSeek-V4); a rejection raises
    :class:`SelectionError` with the config untouched. It changes nothing: the resolver applies
    the rewrites when the layers are built, deciding the same input again (memoized)."""
    _flush_startup()
    model = model_of(vllm_config)
    if model is None:
        arch = getattr(getattr(vllm_config, "model_config", None), "architecture", None)
        if arch is not None:
            _say_once(logging.INFO, f"dsv4sel: {arch} is not a DeepSeek-V4 model; dsv4sel decides nothing for it")
        return None
    query = query_of(vllm_config, model)
    selection = _rules().select(**query)
    cls = host_class(selection)
    fixed = HARDCODED.get((model, query["platform"]))
    if fixed is not None and f"{cls.__module__}:{cls.__qualname__}" != fixed:
        raise SelectionError(
            f"vLLM 0.33 builds {fixed.replace(':', '.')} for {model} on {query['platform']} whatever is "
            f"selected, but {selection.rule.id} ({selection.rule.location}) names {cls.__qualname__}; "
            "the rules for this platform must name vLLM's class", rule=selection.rule, query=selection.query,
            path=selection.path)
    _log_decision(selection, cls, query)
    return selection


# ------------------------------------------------------------------ the replacements
def _make_post_init(original: Callable) -> Callable:
    def __post_init__(self) -> None:
        # vLLM erases CUTLASS_MSA / TRITON_MSA to None here; keep the name the user gave so an
        # explicit backend is decided, never silently replaced by the default
        backend = getattr(self, "backend", None)
        object.__setattr__(self, REQUESTED, getattr(backend, "name", backend))
        original(self)

    __post_init__.__wrapped_vllm__ = original
    return __post_init__


def _make_config_hook(original: Callable) -> classmethod:
    def check_and_update_config(cls, vllm_config) -> None:
        original(vllm_config)
        decide_config(vllm_config)

    check_and_update_config.__wrapped_vllm__ = original
    return classmethod(check_and_update_config)


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


def _layers_of_caller() -> list:
    """The attention layers whose ``__init__`` frames are on the stack, innermost first (vLLM's
    mega-attention layer builds a FlashMLA-V4.1 layer inside its own ``__init__``)."""
    frame, found = sys._getframe(1), []
    while frame is not None:
        layer = frame.f_locals.get("self") if frame.f_code.co_name == "__init__" else None
        if layer is not None and hasattr(layer, "_uses_fp8_ds_mla_layout") and not any(layer is x for x in found):
            found.append(layer)
        frame = frame.f_back
    return found


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
        building = _layers_of_caller()
        if building and not any(isinstance(layer, cls) for layer in building):
            layer = building[-1]
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
