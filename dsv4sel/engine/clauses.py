"""A rule's two clauses, as the ``declare_tables`` stage compiles them: its
``when:`` conditions (each expanded to the set of vocabulary values it accepts)
and its outcome (``select``, ``use`` or ``reject``, with the fields a select
takes from the file's ``defaults:``). Every check records its coded problem
where the offending text was written (:meth:`Compilation.error`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from . import families
from . import hosts as hosts_mod
from .compilation import Compilation
from .model import InputDecl, Outcome
from .profile import SELECTOR
from .suggest import did_you_mean

if TYPE_CHECKING:
    from .load import LoadedFile

#: The outcome kinds a rule may have; exactly one is given.
OUTCOME_KINDS = ("select", "use", "reject")


# conditions -----------------------------------------------------------------

def rule_conditions(ctx: Compilation, f: LoadedFile, path: tuple, raw: dict) -> tuple:
    """``(input, accepted values)`` of each condition of rule ``raw``, in vocabulary order."""
    conditions = []
    for name, condition in (raw.get("when") or {}).items():
        if name == SELECTOR:
            ctx.error(f, path + ("when", name), "DSV309", "rules do not test `backend`: each table "
                      "decides for the backends it declares", key=True)
            continue
        if name not in ctx.inputs:
            if ctx.inputs:  # with no vocabulary at all, that is reported once
                ctx.error(f, path + ("when", name), "DSV302", f"unknown input {name!r}; declared: "
                          + ", ".join(ctx.inputs) + did_you_mean(name, ctx.inputs), key=True)
            continue
        conditions.append((name, expand(ctx, f, path + ("when", name), ctx.inputs[name], condition)))
    order = {n: k for k, n in enumerate(ctx.inputs)}
    conditions.sort(key=lambda c: order[c[0]])
    return tuple(conditions)


def expand(ctx: Compilation, f: LoadedFile, path: tuple, decl: InputDecl, condition: Any) -> frozenset[str]:
    """The values of ``decl`` that ``condition`` accepts: a value, a family, a list of
    them, or ``{not: ...}`` of those."""
    negate = isinstance(condition, dict)
    written = condition["not"] if negate else condition
    listed = isinstance(written, list)
    base = path + (("not",) if negate else ())
    chosen: set[str] = set()
    for i, item in enumerate(written if listed else [written]):
        chosen |= _item_values(ctx, f, base + ((i,) if listed else ()), decl, str(item))
    if negate:
        return frozenset(v for v in decl.values if v not in chosen)
    return frozenset(chosen)


def _item_values(ctx: Compilation, f: LoadedFile, path: tuple, decl: InputDecl, item: str) -> set[str]:
    if item in decl.values:
        return {item}
    if families.is_family(item):
        family = set(families.members(item, decl.values))
        if not family:
            ctx.error(f, path, "DSV303", f"family {item!r} matches no declared value of {decl.name!r}")
        return family
    ctx.error(f, path, "DSV301", f"{item!r} is not a declared value of {decl.name!r}"
              + (_spelled(ctx, decl, item) or did_you_mean(item, decl.values)))
    return set()


def _spelled(ctx: Compilation, decl: InputDecl, item: str) -> str:
    """The hint for a value that spells a declared one another way (a query's spelling,
    an alias): rules write the declared value itself, so the hint names it."""
    spell = dict(ctx.profile.spellings).get(decl.name)
    value = spell(item) if spell else None
    if value not in decl.values:
        value = {alias.lower(): v for alias, v in decl.aliases}.get(item.lower())
    if value not in decl.values or value == item:
        return ""
    return f"; rules write the declared value: {value!r} (queries accept {item!r} as a spelling of it)"


# outcomes -------------------------------------------------------------------

def rule_outcome(ctx: Compilation, f: LoadedFile, path: tuple, raw: dict, defaults: dict,
                 table_kind: str) -> Outcome | None:
    """The outcome of rule ``raw`` in a table of ``table_kind`` (``default`` or
    ``backend``); None when it is malformed (the problem is recorded)."""
    kinds = [k for k in OUTCOME_KINDS if k in raw]
    if len(kinds) != 1:
        ctx.error(f, path, "DSV309", f"rule {raw.get('id', '?')!r} needs exactly one of select, use, reject"
                  + (f" (found {', '.join(kinds)})" if kinds else ""))
        return None
    kind = kinds[0]
    if "messages" in raw and kind == "reject":
        ctx.error(f, path + ("messages",), "DSV309", "a reject rule has no messages; put the text in `reason`",
                  key=True)
    messages = _messages(ctx, f, path + ("messages",), raw.get("messages"))
    if kind == "reject":
        reason = raw["reject"]["reason"]
        ctx.check_template(f, path + ("reject", "reason"), reason)
        return Outcome("reject", reason=reason)
    if kind == "use":
        return Outcome("use", target=raw["use"], messages=messages)
    if table_kind == "default":
        ctx.error(f, path + ("select",), "DSV309", "the default-backend decision only picks a backend: "
                  "use `use: BACKEND` (the backend's own table decides the rest)", key=True)
        return None
    return _select_outcome(ctx, f, path, raw, defaults, messages)


def _messages(ctx: Compilation, f: LoadedFile, path: tuple, items: list | None) -> tuple[tuple[str, str], ...]:
    out = []
    for i, item in enumerate(items or ()):
        (level, text), = item.items()
        ctx.check_template(f, path + (i, level), text)
        out.append((level, text))
    return tuple(out)


def _written_at(path: tuple, raw: dict, name: str) -> tuple:
    """Where select field ``name`` of rule ``raw`` is written: the rule's ``select:``, or
    the file's ``defaults:`` it inherits it from."""
    return path + ("select", name) if name in raw["select"] else ("defaults", name)


def _select_outcome(ctx: Compilation, f: LoadedFile, path: tuple, raw: dict, defaults: dict,
                    messages: tuple[tuple[str, str], ...]) -> Outcome | None:
    merged = {**defaults, **raw["select"]}
    missing = [k for k in ctx.profile.field_names if k not in merged]
    if missing:
        ctx.error(f, path + ("select",), "DSV309", "select is missing " + ", ".join(missing)
                  + " (set them here or in the file's `defaults:`)", key=True)
        return None
    ctx.check_impl(f, _written_at(path, raw, "impl"), merged["impl"])
    rewrites = merged.get("rewrites") or {}
    _check_select_templates(ctx, f, path, raw, merged, rewrites)
    if "hosts" in merged:
        where = _written_at(path, raw, "hosts")
        for host, message in hosts_mod.problems(merged["hosts"], dict(ctx.profile.host_classes), ctx.allowed,
                                                dict(ctx.profile.select_fields)):
            ctx.error(f, where + (host,), "DSV315", message)
        merged["host_settings"] = hosts_mod.compile_settings(merged["hosts"])
        merged["hosts"] = hosts_mod.compile_hosts(merged["hosts"])
    fields = tuple(sorted((k, v) for k, v in merged.items() if k != "rewrites")) + (("rewrites", dict(rewrites)),)
    inherited = tuple((k, (f.file, *f.where(("defaults", k)))) for k in sorted(defaults)
                      if k not in raw["select"] and k != "rewrites")
    return Outcome("select", fields=fields, messages=messages, inherited=inherited)


def _check_select_templates(ctx: Compilation, f: LoadedFile, path: tuple, raw: dict, merged: dict,
                            rewrites: dict) -> None:
    """Every text field and rewrite of a select names only declared inputs. The impl is
    left out: the allow-list check already refuses a templated class path, and one
    problem gives one finding."""
    for name, kind in ctx.profile.select_fields:
        if kind is str and isinstance(merged[name], str) and name != "impl":
            ctx.check_template(f, _written_at(path, raw, name), merged[name])
    for k, v in rewrites.items():
        if isinstance(v, str):
            ctx.check_template(f, path + ("select", "rewrites", k), v)
