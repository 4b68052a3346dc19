"""dsv4sel as a vLLM plugin: vLLM's DeepSeek-V4 / V4.1 attention selection, decided by the rules.

Installed with ``pip install 'dsv4sel[vllm]'``; vLLM runs :func:`register` in every engine and
worker process (entry point ``dsv4sel`` in the group ``vllm.general_plugins``): with
``VLLM_PLUGINS`` unset it loads every installed plugin, so installed means active.

One package serves every vLLM release of the host registry (:mod:`dsv4sel.dsv4.host_registry`):
:func:`install` reads the installed vLLM's version and wires that release's folder (``v0_33/``,
``v0_34/``: the functions replaced, the modules a class may come from, the classes vLLM
hard-codes, the helpers read; :func:`release`); the config is read into a point of the release's
host translation (``vllm-0.3x.yaml`` in that folder, proven complete by ``dsv4sel check``), which
gives the rules' query. What follows holds for every release.

The decision is taken when vLLM validates its configuration: the current platform's
``check_and_update_config`` (which ``VllmConfig.__post_init__`` calls) is wrapped, and for a
DeepSeek-V4 / V4.1 architecture the rules decide there, on every platform, before the model, any
layer or any weight; a rejection raises :class:`dsv4sel.SelectionError` (with suggestions) and the
decision is logged once, with the path of deciding rules and the ``dsv4sel explain`` command.
``AttentionConfig.__post_init__`` is wrapped to keep the backend name the user gave (vLLM erases
the MiniMax aliases ``CUTLASS_MSA`` / ``TRITON_MSA``), so an explicit backend is always decided.
``AttentionBackendEnum[NAME]`` (its metaclass's ``__getitem__``) is wrapped so that a backend name
the rules select but vLLM lacks (a rule pack's) is accepted by vLLM and reaches the rules
(:mod:`.backend_names`); a rule may name dsv4sel's pack layer as its vLLM class, vLLM's own layer
with the rule's impl as its sparse decode (:mod:`.pack_layer`).

vLLM then builds the layer through module globals looked up at call time (nothing imports
them by name), and those are replaced too, deciding the same input again (memoized):

* ``_select_dsv4_attn_cls(vllm_config)`` in ``deepseek_v4/nvidia/model.py``,
  ``deepseek_v41/nvidia/model.py`` and ``deepseek_v41/amd/model.py`` returns the vLLM layer class
  the deciding rule names for the installed release (``hosts: vllm``), imported only from the
  release's ``HOST_MODULES``;
* ``_resolve_dsv4_kv_cache_dtype(layout_flag, kv_cache_dtype, cache_config, ...)`` in
  ``deepseek_v4/attention.py`` and ``deepseek_v41/attention.py`` applies the rewrites to
  ``cache_config`` all or nothing and returns the Selection's cache dtype and torch dtype; it
  refuses a layer whose class or layout flag is not the one the rules name.

The KV wire contract of the worker's decision (the last Selection the resolver applied) is
carried where vLLM's processes meet, patched when vLLM imports those modules (the release's
``LATER``, :mod:`.later`): NIXL's compatibility hash between prefill and decode
(:mod:`.handshake`), and the engine core's start-up, which refuses ranks of one instance that
decided different contracts, or KV-cache specs, with one message naming the ranks, the fields,
the values and the rules (:mod:`.ranks`).

AMD, CPU and XPU DeepSeek-V4.0 hard-code their layer class (the release's ``HARDCODED``): the config-time
decision checks that the rules name exactly it.

Loading never stops vLLM for what the plugin does not decide: with no platform, a vLLM version
it is not written for (:data:`SUPPORTED`, the registry's releases) or a broken vLLM it patches nothing and logs one line,
unless the user named it in ``VLLM_PLUGINS``; then that is one :class:`PluginError`. Every
target is looked up and checked before the first one is replaced, so it never half-patches.
"""

from __future__ import annotations

import inspect
import logging
import os
import types
from typing import Any

from ..dsv4.host_registry import HOSTS

# the plugin's parts, one job each; their public names are this package's API
from .decision import decide_config, decision_line, host_class
from .reading import _platform, decide, host_point, model_of, query_of
from .state import _lock, _logged, _say_once, _startup, _state, logger
from .targets import HOST, REQUESTED, SUPPORTED, release
from .wrappers import _make_config_hook, _make_post_init, _make_resolve, _make_select
from . import later  # the handshake and start-up checks of vLLM's modules imported later (NIXL, engine core)
from . import backend_names  # issue 33: a pack's backend name through --attention-backend

__all__ = [
    "HOST",
    "REQUESTED",
    "SUPPORTED",
    "PluginError",
    "decide",
    "decide_config",
    "decision_line",
    "host_class",
    "host_point",
    "install",
    "logger",
    "model_of",
    "query_of",
    "register",
    "release",
    "requested",
    "uninstall",
]


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
        version, platform, found, wired = plan
        later.watch(wired.LATER, version, _expect)  # checks what is imported before anything is replaced
        _state["release"] = wired
        for owner, attr, _original, wrapper in found:
            setattr(owner, attr, wrapper)  # setattr on a module or class does not fail
        patched = [(owner, attr, original) for owner, attr, original, _ in found]
        _state["patched"] = patched
        _startup(f"dsv4sel: DeepSeek-V4 attention selection of vllm {version} is decided by dsv4sel "
                 f"({len(found)} functions replaced on {platform}; decided when vLLM validates its config)")
        return [(_name(o), a) for o, a, _ in patched]


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else repr(exc)[:300]


def _name(owner: Any) -> str:
    return owner.__name__ if isinstance(owner, types.ModuleType) else f"{owner.__module__}.{owner.__qualname__}"


def _plan() -> tuple[str, str, list[tuple[Any, str, Any, Any]], types.ModuleType] | None:
    """``(version, platform, [(owner, attribute, original, wrapper)], release folder)`` or None (no
    platform). Looks every target up and checks its signature before anything is replaced."""
    import importlib

    import vllm

    version = getattr(vllm, "__version__", None)
    if not isinstance(version, str):
        raise PluginError(f"dsv4sel's vLLM plugin cannot tell this vLLM's version (vllm.__version__ is "
                          f"{type(version).__name__}); it patched nothing")
    try:
        found_release = HOSTS[HOST].release_for(version)
    except (TypeError, ValueError):
        found_release = None
    if found_release is None:
        raise PluginError(
            f"dsv4sel's vLLM plugin is written for vllm {SUPPORTED} and this is vllm {version}; it patched "
            f"nothing. Install a vLLM in that range or a dsv4sel release written for vllm {version}")
    wired = importlib.import_module(found_release.package)
    platform = _platform()
    targets = wired.TARGETS.get(platform)
    if targets is None:
        _startup(f"dsv4sel: vLLM found no platform dsv4sel decides for ({platform}); DeepSeek-V4 "
                 "attention selection stays vLLM's own, nothing was patched")
        return None
    found: list[tuple[Any, str, Any, Any]] = []
    for module_name, attr, model, params in targets:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:
            raise PluginError(f"dsv4sel's vLLM plugin cannot import {module_name} on vllm {version} "
                              f"({type(exc).__name__}: {_one_line(exc)}); it patched nothing") from exc
        original: Any = getattr(module, attr, None)
        _expect(f"{module_name}.{attr}", original, params, version)
        wrapper = (_make_select(model, original) if attr == "_select_dsv4_attn_cls"
                   else _make_resolve(model, original))
        found.append((module, attr, original, wrapper))
    from vllm.config import AttentionConfig
    from vllm.platforms import current_platform

    post_init: Any = AttentionConfig.__dict__.get("__post_init__")
    _expect("vllm.config.AttentionConfig.__post_init__", post_init, ("self",), version)
    found.append((AttentionConfig, "__post_init__", post_init, _make_post_init(post_init)))
    found.append(_backend_names_target(version))
    platform_cls = type(current_platform)
    hook: Any = getattr(platform_cls, "check_and_update_config", None)
    _expect(f"{platform_cls.__qualname__}.check_and_update_config", hook, ("vllm_config",), version)
    raw = inspect.getattr_static(platform_cls, "check_and_update_config")
    found.append((platform_cls, "check_and_update_config", raw, _make_config_hook(hook)))
    return version, platform, found, wired


def _backend_names_target(version: str) -> tuple[Any, str, Any, Any]:
    """``AttentionBackendEnum[NAME]`` (its metaclass's ``__getitem__``), where vLLM turns every
    ``--attention-backend`` into a member: a backend the rules select is registered there
    (:mod:`.backend_names`)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from .reading import _rules

    meta = type(AttentionBackendEnum)
    getitem: Any = meta.__dict__.get("__getitem__")
    _expect(f"{meta.__module__}.{meta.__qualname__}.__getitem__", getitem, ("cls", "name"), version)
    return meta, "__getitem__", getitem, backend_names.make_getitem(getitem, _rules, _platform)


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
        later.forget()
        backend_names.forget()
        _state["patched"] = None
        _state["rules"] = None
        _state["release"] = None
        _state["selection"] = None
        _logged.clear()


