"""Checks on what a select rule selects: impl class, layout, sizes.

A select outcome names an impl class (``module:Class``), a KV-cache layout
id and the cache tensor's torch dtype and bytes per token. The layout ids
and their sizes are defined once, in :mod:`dsv4sel.kernels.layouts`
(``LAYOUTS[name].bytes_per_token`` and ``.torch_dtype_name``, readable
without importing torch); the rules must agree with them. Impl classes are
imported for real, but only from the rule set's allowed modules; an impl
class that declares ``supported_layouts`` must list the selected layout.

Host classes (``hosts:``) are imported only where their host is installed in
one of the versions the rule lists (:mod:`dsv4sel.engine.hosts`).

Field values may be templates (``cache_dtype: "{kv_cache_dtype}"``):
:func:`render_fields` renders them for one assignment of the inputs they
name. Results are memoized per rendered value: a 10,000-rule table that
names three impls imports three modules once each.
"""

from __future__ import annotations

import importlib
from typing import Any, Mapping

from ..errors import ImplLoadError
from ..engine.hosts import host_class_problem
from ..engine.model import render, template_fields
from ..engine.suggest import did_you_mean
from ..dsv4.profile import PROFILE
from ..engine.values import load_impl_class

#: the fields a selection is checked on: the profile's, and the host classes
SELECTION_FIELDS = (*PROFILE.field_names, "hosts")
LAYOUTS_MODULE = "dsv4sel.kernels.layouts"


def placeholders(rule) -> frozenset[str]:
    """The input names a select rule's fields and rewrites render."""
    names: set[str] = set()
    for _field, value in rule.outcome.fields:
        values = value.values() if isinstance(value, dict) else (value,)
        for v in values:
            if isinstance(v, str) and "{" in v:
                try:
                    names.update(template_fields(v))
                except ValueError:  # the compiler reports bad templates
                    pass
    return frozenset(names)


def needs_regions(rule) -> bool:
    """True when a select rule's result varies over the space (templates)
    or must be re-selected (rewrites): it is then checked per region."""
    if rule.outcome.kind != "select":
        return False
    return bool(rule.outcome.field("rewrites")) or bool(placeholders(rule))


def render_fields(rule, values: dict[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The rule's selection fields and rewrites rendered with ``values``
    (input name -> value, plus ``backend``)."""
    raw = dict(rule.outcome.fields)
    fields = {}
    for key in SELECTION_FIELDS:
        v = raw.get(key)
        fields[key] = render(v, values) if isinstance(v, str) else v
    rewrites = {k: render(v, values) if isinstance(v, str) else v
                for k, v in (raw.get("rewrites") or {}).items()}
    return fields, rewrites


class FieldChecker:
    """Checks rendered selection fields; memoized per distinct value.

    ``layouts`` overrides the layout table (name -> object with
    ``bytes_per_token`` and ``torch_dtype_name``); by default it is
    ``dsv4sel.kernels.layouts.LAYOUTS``, imported on first use.
    """

    def __init__(self, allowed_modules: tuple[str, ...], layouts: Mapping[str, Any] | None = None):
        self.allowed = allowed_modules
        self._layouts = layouts
        self._layout_error: str | None = None
        self._impl_memo: dict[str, str | None] = {}
        #: (host, class, versions) -> why that host class does not resolve, or None
        self._host_memo: dict[tuple[str, str, str], str | None] = {}
        self._fields_memo: dict[tuple, list[tuple[str, str]]] = {}
        self._classes: dict[str, type] = {}

    def layouts(self) -> Mapping[str, Any] | None:
        if self._layouts is None and self._layout_error is None:
            try:
                module = importlib.import_module(LAYOUTS_MODULE)
                self._layouts = dict(module.LAYOUTS)
            except MemoryError:  # the machine's, not the layouts' failure
                raise
            except Exception as exc:  # noqa: BLE001 - an import error of any kind is the finding
                self._layout_error = f"cannot read the layouts: import {LAYOUTS_MODULE} failed: {exc}"
        return self._layouts

    @property
    def layout_error(self) -> str | None:
        return self._layout_error

    def impl_problem(self, impl: Any) -> str | None:
        """Why ``impl`` does not resolve to a class, or None if it does."""
        if impl in self._impl_memo:
            return self._impl_memo[impl]
        problem = self._impl_problem(impl)
        self._impl_memo[impl] = problem
        return problem

    def _impl_problem(self, impl: Any) -> str | None:
        try:
            self._classes[impl] = load_impl_class(impl, self.allowed, PROFILE.impl_base)
        except ImplLoadError as exc:
            return str(exc)
        return None

    def _layout_unread(self, impl: str, layout: str) -> str | None:
        """Why the impl class cannot read ``layout``, if it declares the
        layouts it reads (``supported_layouts``, a class attribute: no
        instance, no torch)."""
        supported = getattr(self._classes.get(impl), "supported_layouts", None)
        if isinstance(supported, (set, frozenset)) and supported and layout not in supported:
            return (f"impl {impl.rpartition(':')[2]} does not read layout {layout!r}; it reads "
                    + ", ".join(sorted(supported)))
        return None

    def field_problems(self, fields: Mapping[str, Any]) -> list[tuple[str, str]]:
        """``(kind, message)`` for each problem of one rendered selection."""
        key = (fields["impl"], fields["layout"], fields["torch_dtype"], fields["bytes_per_token"],
               fields.get("hosts"))
        hit = self._fields_memo.get(key)
        if hit is None:
            hit = self._fields_memo[key] = self._field_problems(fields)
        return hit

    def _field_problems(self, fields: Mapping[str, Any]) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        problem = self.impl_problem(fields["impl"])
        if problem:
            out.append(("impl", problem))
        for host, cls, versions in fields.get("hosts") or ():
            hkey = (host, cls, versions)
            if hkey not in self._host_memo:
                self._host_memo[hkey] = host_class_problem(host, cls, versions)
            host_problem = self._host_memo[hkey]
            if host_problem:
                out.append(("host", host_problem))
        layouts = self.layouts()
        if layouts is None:
            return out  # reported once by the caller from layout_error
        name = fields["layout"]
        layout = layouts.get(name)
        if layout is None:
            out.append(("layout", f"layout {name!r} is not defined by {LAYOUTS_MODULE} (defined: "
                        + ", ".join(sorted(layouts)) + ")" + did_you_mean(name, layouts)))
            return out
        if fields["torch_dtype"] != layout.torch_dtype_name:
            out.append(("consistency", f"torch_dtype {fields['torch_dtype']!r} disagrees with layout "
                        f"{name}, whose cache tensor is {layout.torch_dtype_name}"))
        if fields["bytes_per_token"] != layout.bytes_per_token:
            out.append(("consistency", f"bytes_per_token {fields['bytes_per_token']!r} disagrees with "
                        f"layout {name}, which stores {layout.bytes_per_token} bytes per token"))
        unread = self._layout_unread(fields["impl"], name)
        if unread:
            out.append(("consistency", unread))
        return out
