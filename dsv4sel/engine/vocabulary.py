"""Compiler stage ``merge_vocabulary``: every ``kind: vocabulary`` file -> the declared inputs.

Packs add values to the inputs earlier files declared; this stage merges
their declarations in load order and then checks each merged input as a
whole (scoping, defaults, aliases, probes). Each check records its problem,
with its code, where the offending text was written (:meth:`~dsv4sel.engine.compilation.Compilation.error`
of :mod:`dsv4sel.engine.compile`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .compilation import Compilation
from .model import InputDecl
from .profile import SELECTOR
from .suggest import did_you_mean

if TYPE_CHECKING:
    from .load import LoadedFile

#: One input as the merge sees it: its values, scoping, attributes and where each was written.
Slot = dict[str, Any]


def merge_vocabulary(ctx: Compilation) -> None:
    """Set ``ctx.inputs``: the merged inputs, the profile's built-in ones first."""
    ctx.inputs = {}
    if ctx.files and not any(f.data.get("kind") == "vocabulary" for f in ctx.files):
        # a pack loaded alone: one problem with the fix, not one per input and condition
        ctx.error(ctx.files[0], (), "DSV306", "no `kind: vocabulary` file among the rule files, so no input is "
                  "declared: load a pack on top of the default rules (`--rules DIR` without "
                  "--only-rules; in Python `dsv4sel.load_rules(extra=[DIR])`), or "
                  "give it a vocabulary of its own")
        return
    merged: dict[str, Slot] = {}
    for f in ctx.files:
        if f.data.get("kind") == "vocabulary":
            for name, decl in f.data["inputs"].items():
                _merge_input(ctx, merged, f, name, decl)
    ctx.inputs = _declare_inputs(ctx, merged)


def _new_slot(decl: dict) -> Slot:
    return {"values": [], "scoped": None, "by": decl.get("by"), "default": None, "fallback": None,
            "probe": None, "aliases": {}, "at": {}}


def _merge_input(ctx: Compilation, merged: dict[str, Slot], f: LoadedFile, name: str, decl: dict) -> None:
    """Merge one file's declaration of input ``name`` into ``merged``."""
    path: tuple = ("inputs", name)
    if name == SELECTOR:
        ctx.error(f, path, "DSV305", "`backend` is not declared in the vocabulary: "
                  "the backend names are the tables' `backends:`", key=True)
        return
    slot = merged.setdefault(name, _new_slot(decl))
    if slot["by"] != decl.get("by"):
        ctx.error(f, path + ("by",), "DSV305", f"input {name!r} is scoped by {slot['by']!r} elsewhere")
        return
    values = decl["values"]
    merged_values = _merge_scoped if decl.get("by") else _merge_unscoped
    if not merged_values(ctx, slot, f, name, path, decl):
        return
    _merge_attributes(ctx, slot, f, name, path, decl)
    _merge_aliases(ctx, slot, f, name, path, decl)
    # problems with values, parents and defaults are reported where they were written
    for parent in (values if isinstance(values, dict) else ()):
        slot["at"].setdefault(("parent", str(parent)), (f, path + ("values", parent)))
    slot.setdefault("origin", (f, path))


def _merge_scoped(ctx: Compilation, slot: Slot, f: LoadedFile, name: str, path: tuple, decl: dict) -> bool:
    """Merge the values of an input scoped ``by:`` another, listed per parent value."""
    values = decl["values"]
    if not isinstance(values, dict):
        ctx.error(f, path + ("values",), "DSV305", f"input {name!r} has `by:`, so `values` must map "
                  f"each {decl['by']} value to a list")
        return False
    scoped = slot["scoped"] = slot["scoped"] or {}
    if any(str(v) not in scoped.get(str(p), ()) for p, vs in values.items() for v in vs):
        ctx.grew(f, path + ("values",))
    for parent, vals in values.items():
        bucket = scoped.setdefault(str(parent), [])
        bucket.extend(str(v) for v in vals if str(v) not in bucket)
        for v in vals:
            if str(v) not in slot["values"]:
                slot["values"].append(str(v))
    return True


def _merge_unscoped(ctx: Compilation, slot: Slot, f: LoadedFile, name: str, path: tuple, decl: dict) -> bool:
    values = decl["values"]
    if isinstance(values, dict):
        ctx.error(f, path + ("values",), "DSV305", f"input {name!r} lists values per "
                  "parent value; add `by: <input>`")
        return False
    if any(str(v) not in slot["values"] for v in values):
        ctx.grew(f, path + ("values",))
    slot["values"].extend(str(v) for v in values if str(v) not in slot["values"])
    return True


def _merge_attributes(ctx: Compilation, slot: Slot, f: LoadedFile, name: str, path: tuple, decl: dict) -> None:
    for attr in ("default", "fallback", "probe"):
        if attr in decl:
            if slot[attr] not in (None, str(decl[attr])):
                ctx.error(f, path + (attr,), "DSV305", f"{name}.{attr} is {slot[attr]!r} in another file")
            slot[attr] = str(decl[attr])
            slot["at"][attr] = (f, path + (attr,))


def _merge_aliases(ctx: Compilation, slot: Slot, f: LoadedFile, name: str, path: tuple, decl: dict) -> None:
    for alias, value in (decl.get("aliases") or {}).items():
        if slot["aliases"].get(str(alias), str(value)) != str(value):
            ctx.error(f, path + ("aliases", alias), "DSV305", f"alias {alias!r} of {name} means "
                      f"{slot['aliases'][str(alias)]!r} in another file", key=True)
            continue
        slot["aliases"][str(alias)] = str(value)
        slot["at"]["aliases", str(alias)] = (f, path + ("aliases", alias))


def _declare_inputs(ctx: Compilation, merged: dict[str, Slot]) -> dict[str, InputDecl]:
    """The merged inputs as declarations, each checked whole; the built-in ones first."""
    where = ctx.files[0] if ctx.files else None
    builtin = ctx.profile.builtin_inputs
    for name in builtin:
        if name not in merged and where is not None:
            ctx.error(where, (), "DSV305", f"the vocabulary does not declare the input {name!r} "
                      "(add it to a `kind: vocabulary` file)")
    ordered = [n for n in builtin if n in merged] + [n for n in merged if n not in builtin]
    out: dict[str, InputDecl] = {}
    for name in ordered:
        decl = _declare_input(ctx, merged, ordered, name)
        if decl is not None:
            out[name] = decl
    return out


def _declare_input(ctx: Compilation, merged: dict[str, Slot], ordered: list[str], name: str) -> InputDecl | None:
    slot = merged[name]
    f, path = slot["origin"]
    by = slot["by"]
    scoped = None
    if by:
        scoped = _scope(ctx, merged, ordered, name)
        if scoped is None:
            return None
    _check_named_values(ctx, name, slot)
    if name not in ctx.profile.normalized and slot["default"] is None:
        ctx.error(f, path, "DSV305", f"input {name!r} needs a `default:` so that callers who do not "
                  "pass it still get a decision", key=True)
    _check_host_input(ctx, name, slot)
    if slot["probe"] is not None:
        pf, ppath = slot["at"]["probe"]
        ctx.check_impl(pf, ppath, slot["probe"])
    return InputDecl(name, tuple(slot["values"]), by, scoped, slot["default"], slot["fallback"],
                     slot["probe"], tuple(slot["aliases"].items()))


def _check_host_input(ctx: Compilation, name: str, slot: Slot) -> None:
    """An input the hosts fill (:attr:`Profile.host_inputs`) is declared with exactly the values
    they send and their default: a value a host sends but the rules lack would refuse a running
    engine's input, one the rules add no host would ever send."""
    fixed = {n: (values, default) for n, values, default in ctx.profile.host_inputs}.get(name)
    if fixed is None:
        return
    values, default = fixed
    if slot["by"] is None and set(slot["values"]) == set(values) and slot["default"] == default:
        return
    f, path = slot["origin"]
    ctx.error(f, path, "DSV305", f"input {name!r} is filled by the serving engines' plugins, which send "
              f"{', '.join(values)}: declare it with `values: [{', '.join(values)}]` and `default: {default}` "
              "(no `by:`)", key=True)


def _scope(ctx: Compilation, merged: dict[str, Slot], ordered: list[str], name: str) -> tuple | None:
    """The values of scoped input ``name`` per value of its parent; None when the parent
    cannot scope it (the input is then left out)."""
    slot = merged[name]
    f, path = slot["origin"]
    by = slot["by"]
    if by not in merged or merged[by]["by"]:
        ctx.error(f, path + ("by",), "DSV305", f"{name!r} is scoped by {by!r}, which is not an unscoped input")
        return None
    for p in (p for p in slot["scoped"] if p not in merged[by]["values"]):
        pf, ppath = slot["at"].get(("parent", p), (f, path + ("values", p)))
        ctx.error(pf, ppath, "DSV301", f"{p!r} is not a value of {by!r}"
                  + did_you_mean(p, merged[by]["values"]), key=True)
    scoped = tuple((p, tuple(slot["scoped"].get(p, ()))) for p in merged[by]["values"])
    if ordered.index(by) > ordered.index(name):
        ctx.error(f, path + ("by",), "DSV305", f"{name!r} must be declared after {by!r}")
    return scoped


def _check_named_values(ctx: Compilation, name: str, slot: Slot) -> None:
    """The default, the fallback and every alias name one of the input's values."""
    for attr in ("default", "fallback"):
        value = slot[attr]
        if value is not None and value not in slot["values"]:
            af, apath = slot["at"][attr]
            ctx.error(af, apath, "DSV301", f"{attr} {value!r} is not one of the values of {name!r}"
                      + did_you_mean(value, slot["values"]))
    for alias, value in slot["aliases"].items():
        if value not in slot["values"]:
            af, apath = slot["at"]["aliases", alias]
            ctx.error(af, apath, "DSV301", f"alias {alias!r} names {value!r}, which is not one of the "
                      f"values of {name!r}" + did_you_mean(value, slot["values"]))
