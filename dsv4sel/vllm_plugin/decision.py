"""One decision of the plugin: the vLLM class the deciding rule names, the config-time check, and the
one log line with the rules' path and the ``dsv4sel explain`` command."""

from __future__ import annotations

import logging
from typing import Any

from ..errors import SelectionError
from .reading import _rules, model_of, query_of
from .state import _flush_startup, _say_once
from .targets import HOST, release


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
    """Import the vLLM layer class the deciding rule names for the installed vLLM release."""
    import importlib

    import vllm

    if not selection.host_releases(HOST):
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) selects {selection.backend} but names "
            "no vLLM layer class (hosts: vllm); vLLM cannot build it", rule=selection.rule,
            query=selection.query, path=selection.path)
    named = selection.host_class(HOST, vllm.__version__)
    if named is None:
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) names a vLLM class for vllm "
            f"{' or '.join(selection.host_releases(HOST))}, not for vllm {vllm.__version__}",
            rule=selection.rule, query=selection.query, path=selection.path)
    cls_path, _versions = named
    module_name, _, attr = cls_path.partition(":")
    host_modules = release().HOST_MODULES
    if module_name not in host_modules:
        # issue 33: dsv4sel's pack layer, or a pack's own layer from a module the process allows
        from . import pack_layer

        own = pack_layer.layer_for(selection) if cls_path == pack_layer.PACK_LAYER else pack_layer.own_layer(
            selection, cls_path)
        if own is not None:
            return own
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) names the vLLM class {cls_path}, which is "
            f"not in one of vLLM's DeepSeek-V4 attention modules ({', '.join(sorted(host_modules))}) nor in a "
            f"module this process allows (--allow-impl-module / DSV4SEL_ALLOW_IMPL_MODULES="
            f"{module_name.partition('.')[0]}); dsv4sel imports no other module", rule=selection.rule,
            query=selection.query, path=selection.path)
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # noqa: BLE001 - a missing or exiting layer module (SystemExit too) is one error
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise SelectionError(
            f"rule {selection.rule.id} ({selection.rule.location}) names {cls_path}, but vllm {vllm.__version__} "
            f"cannot import {module_name} ({type(exc).__name__}: {str(exc).strip()[:200] or 'no message'}); "
            "reinstall vLLM or choose another --attention-backend", rule=selection.rule,
            query=selection.query, path=selection.path) from None
    cls = getattr(module, attr, None)
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
    import vllm

    kv = query["kv_cache_dtype"]
    # a release may build another block size than the rule's (its hosts: vllm entry's settings)
    block = selection.settings_for(HOST, vllm.__version__).get("block_size", selection.block_size)
    rewrites = ", ".join(f"{k} {kv if k == 'cache_dtype' else ''} -> {v}".replace("  ", " ")
                         for k, v in sorted(selection.rewrites.items()))
    return (f"dsv4sel: {query['model']} attention {selection.backend} -> {cls.__module__}.{cls.__qualname__}, "
            f"kv cache {selection.cache_dtype} ({selection.layout}, {selection.bytes_per_token} B/token, "
            f"block {block})"
            f"{'; rewrites ' + rewrites if rewrites else ''}; decided by {_path_text(selection)}; "
            f"`{_explain_hint(query)}` shows why")


def _log_decision(selection, cls: type, query: dict) -> None:
    _flush_startup()
    _say_once(logging.INFO, decision_line(selection, cls, query))
    for message in selection.messages:
        _say_once(logging.WARNING if message.level == "warning" else logging.INFO, f"dsv4sel: {message}")


def _refuse_dsv4_name_elsewhere(vllm_config: Any, arch: Any) -> None:
    """A backend name only the rules know (registered by :mod:`.backend_names`) named for a model
    that is not DeepSeek-V4: vLLM has no layer of that name, so it is refused here, as vLLM refuses
    an unknown name, instead of failing when vLLM looks its class up."""
    from .backend_names import registered_here

    backend = getattr(getattr(vllm_config, "attention_config", None), "backend", None)
    if getattr(vllm_config, "model_config", None) is not None and registered_here(backend):
        raise SelectionError(
            f"--attention-backend {getattr(backend, 'name', backend)} is a DeepSeek-V4 attention backend of dsv4sel's rules, "
            f"which vLLM itself does not have; {arch or 'this model'} is not a DeepSeek-V4 model, so no "
            "layer of that name exists for it. Name one of vLLM's backends, or none")


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
        _refuse_dsv4_name_elsewhere(vllm_config, arch)  # issue 33
        if arch is not None:
            _say_once(logging.INFO, f"dsv4sel: {arch} is not a DeepSeek-V4 model; dsv4sel decides nothing for it")
        return None
    query = query_of(vllm_config, model)
    selection = _rules().select(**query)
    cls = host_class(selection)
    fixed = release().HARDCODED.get((model, query["platform"]))
    if fixed is not None and f"{cls.__module__}:{cls.__qualname__}" != fixed:
        import vllm

        raise SelectionError(
            f"vLLM {vllm.__version__} builds {fixed.replace(':', '.')} for {model} on {query['platform']} whatever is "
            f"selected, but {selection.rule.id} ({selection.rule.location}) names {cls.__qualname__}; "
            "the rules for this platform must name vLLM's class", rule=selection.rule, query=selection.query,
            path=selection.path)
    _log_decision(selection, cls, query)
    return selection

