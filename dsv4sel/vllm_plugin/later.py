"""Targets the plugin patches when vLLM imports their module, never importing it itself.

Some of what the plugin replaces lives in modules vLLM imports only where it needs them: the NIXL
connector's worker (NIXL is an optional dependency, and its module pulls in much of vLLM's model
code) and the engine core (imported by the engine-core process, not by the workers). Importing
them when the plugin loads would cost every vLLM process that time and could fail where vLLM
itself never would, so a release folder lists them in ``LATER``:
``(module, attribute path, expected parameters, what dsv4sel puts there)``.

:func:`watch` patches at once the targets whose module is already imported, and puts a finder
first on ``sys.meta_path`` that patches the others right after vLLM's import of their module has
run it, before anything reads the module. All targets of one module are looked up and checked
(the same ``expect`` as the plugin's other targets) before the first is replaced; a missing or
changed one is a :class:`~dsv4sel.vllm_plugin.PluginError` there and then: at :func:`watch` for an
imported module (before ``install()`` patches anything), else raised by vLLM's import of that
module. A module vLLM never imports (no NIXL connector configured, NIXL not installed) is never
touched. :func:`forget` removes the finder and puts vLLM's own functions back.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import handshake, ranks
from .wrappers import _keep_original

#: what dsv4sel puts in a target's place, by the name a release folder's ``LATER`` gives
WRAPPERS: dict[str, Callable[[Callable], Callable]] = {
    "nixl_hash": handshake.make_nixl_hash,
    "rank_contracts": ranks.make_initialize_kv_caches,
    "rank_specs": ranks.make_global_kv_cache_groups,
}
Expect = Callable[[str, Any, tuple, str], None]
#: ``finder``: the waiting finder (None: nothing waits); ``patched``: (owner, attribute, original)
_later: dict[str, Any] = {"finder": None, "patched": []}


def _resolve(module: ModuleType, path: str) -> tuple[Any, str]:
    """The object holding the last name of ``path`` (the module, or a class in it) and that name."""
    owner: Any = module
    *classes, attr = path.split(".")
    for name in classes:
        owner = getattr(owner, name, None)
    return owner, attr


def _patch(module: ModuleType, targets: list[tuple], version: str, expect: Expect) -> None:
    """Check every target of ``module``, then replace them all."""
    found = []
    for _, path, params, kind in targets:
        owner, attr = _resolve(module, path)
        original: Any = None if owner is None else getattr(owner, attr, None)
        expect(f"{module.__name__}.{path}", original, params, version)
        raw = vars(owner).get(attr, original) if isinstance(owner, type) else original
        found.append((owner, attr, raw, WRAPPERS[kind](original)))
    for owner, attr, raw, wrapper in found:
        _keep_original(wrapper, raw)
        setattr(owner, attr, wrapper)
        # a module run again (importlib.reload) holds vLLM's functions anew: forget the older ones
        _later["patched"] = [p for p in _later["patched"] if (p[0], p[1]) != (owner, attr)] + [(owner, attr, raw)]


class _ThenPatch(importlib.abc.Loader):
    """A module's own loader, then the patch, before the importer gets the module."""

    def __init__(self, loader: Any, then: Callable[[ModuleType], None], waiting: dict):
        self._loader, self._then, self._waiting = loader, then, waiting

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        try:
            self._loader.exec_module(module)
        except BaseException:
            self._waiting[module.__name__] = self._then  # vLLM's import failed: patch a later one
            raise
        self._then(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader...: the module's loader
        return getattr(self._loader, name)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: hands a waiting module's spec, found by the other finders, a loader
    that patches it after running it."""

    def __init__(self, waiting: dict[str, Callable[[ModuleType], None]]):
        self.waiting = waiting

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.waiting:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = None if finder is self or find is None else find(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ThenPatch(spec.loader, self.waiting.pop(fullname), self.waiting)
        return spec


def watch(targets: tuple, version: str, expect: Expect) -> None:
    """Patch ``targets`` (a release folder's ``LATER``) now where vLLM imported their module, else
    when it does (see the module docstring)."""
    by_module: dict[str, list[tuple]] = {}
    for target in targets:
        by_module.setdefault(target[0], []).append(target)
    imported = {name: sys.modules[name] for name in by_module if sys.modules.get(name) is not None}
    for name, module in imported.items():  # every check first: PluginError with nothing replaced
        for _, path, params, _kind in by_module[name]:
            owner, attr = _resolve(module, path)
            expect(f"{name}.{path}", None if owner is None else getattr(owner, attr, None), params, version)
    for name, module in imported.items():
        _patch(module, by_module[name], version, expect)
    waiting = {name: _then_patch(group, version, expect) for name, group in by_module.items() if name not in imported}
    if waiting:
        finder = _Finder(waiting)
        sys.meta_path.insert(0, finder)
        _later["finder"] = finder


def _then_patch(group: list[tuple], version: str, expect: Expect) -> Callable[[ModuleType], None]:
    return lambda module: _patch(module, group, version, expect)


def patched() -> list[tuple[Any, str]]:
    """``(owner, attribute)`` of the targets replaced so far."""
    return [(owner, attr) for owner, attr, _ in _later["patched"]]


def forget() -> None:
    """Stop waiting and put vLLM's own functions back."""
    finder = _later["finder"]
    if finder is not None and finder in sys.meta_path:
        sys.meta_path.remove(finder)
    for owner, attr, original in reversed(_later["patched"]):
        setattr(owner, attr, original)
    _later["finder"], _later["patched"] = None, []
