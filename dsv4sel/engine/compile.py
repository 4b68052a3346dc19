"""Stage 3, compile: validated rule files -> a :class:`~dsv4sel.engine.model.Program`.

The builder merges the vocabulary (the finite decision space), declares the
default-backend decision table and one table per backend, and expands every
rule's conditions to sets of vocabulary values; the result is the data of
:mod:`dsv4sel.engine.model`. Lowering it to the evaluator's array is the next
stage (:mod:`dsv4sel.engine.lower`).

Semantic problems (unknown vocabulary values, impl classes outside the
allow-list, dangling ``use:`` targets, bad templates, ...) are collected with
their ``file:line:column`` and code; :func:`compile_files` raises one
RuleError listing all of them.
"""

from __future__ import annotations

from typing import Any

from . import families
from . import hosts as hosts_mod
from ..errors import ImplLoadError, Problem, RuleError
from .load import LoadedFile
from .model import DEFAULT_TABLE, InputDecl, Outcome, Program, Rule, Table, render, template_fields  # noqa: F401
from .profile import Profile
from .suggest import did_you_mean
from .values import RuleRef, check_impl_allowed

# ------------------------------------------------------------------ builder

class _Builder:
    def __init__(self, files: list[LoadedFile], allowed: tuple[str, ...], packs: dict[str, str], profile: Profile):
        self.files = files
        self.profile = profile
        self.allowed = allowed
        self.packs = packs
        self.problems: list[Problem] = []
        self.descriptions: dict[RuleRef, str] = {}
        #: (file, line, column) of each declaration by a pack (not the shipped
        #: rules) that grew the space: new input values or backends, load order
        self.growth: list[tuple[str, int, int]] = []

    def grew(self, f: LoadedFile, path: tuple) -> None:
        if self.packs.get(f.file, "dsv4sel") != "dsv4sel":
            line, column = f.where(path)
            self.growth.append((f.file, line, column))

    def error(self, f: LoadedFile, path: tuple, code: str, message: str, *, key: bool = False) -> None:
        """Record problem ``code`` (:mod:`dsv4sel.engine.codes`) at ``path`` of ``f``."""
        self.problems.append(f.problem(path, code, message, key=key))

    # vocabulary ------------------------------------------------------------
    def vocabulary(self) -> dict[str, InputDecl]:
        merged: dict[str, dict[str, Any]] = {}
        if self.files and not any(f.data.get("kind") == "vocabulary" for f in self.files):
            # a pack loaded alone: one problem with the fix, not one per input and condition
            self.error(self.files[0], (), "DSV306", "no `kind: vocabulary` file among the rule files, so no input is "
                       "declared: load a pack on top of the default rules (`--rules DIR` without "
                       "--only-rules; in Python `load_rules([*dsv4sel.engine.sources.default_packs(), DIR])`), or "
                       "give it a vocabulary of its own")
            return {}
        for f in self.files:
            if f.data.get("kind") != "vocabulary":
                continue
            for name, decl in f.data["inputs"].items():
                path = ("inputs", name)
                if name == "backend":
                    self.error(f, path, "DSV305", "`backend` is not declared in the vocabulary: "
                               "the backend names are the tables' `backends:`", key=True)
                    continue
                slot = merged.setdefault(name, {"values": [], "scoped": None, "by": decl.get("by"),
                                                "default": None, "fallback": None, "probe": None,
                                                "aliases": {}, "at": {}})
                if slot["by"] != decl.get("by"):
                    self.error(f, path + ("by",), "DSV305", f"input {name!r} is scoped by {slot['by']!r} elsewhere")
                    continue
                values = decl["values"]
                if decl.get("by"):
                    if not isinstance(values, dict):
                        self.error(f, path + ("values",), "DSV305", f"input {name!r} has `by:`, so `values` must map "
                                   f"each {decl['by']} value to a list")
                        continue
                    scoped = slot["scoped"] = slot["scoped"] or {}
                    if any(str(v) not in scoped.get(str(p), ()) for p, vs in values.items() for v in vs):
                        self.grew(f, path + ("values",))
                    for parent, vals in values.items():
                        bucket = scoped.setdefault(str(parent), [])
                        bucket.extend(str(v) for v in vals if str(v) not in bucket)
                        for v in vals:
                            if str(v) not in slot["values"]:
                                slot["values"].append(str(v))
                else:
                    if isinstance(values, dict):
                        self.error(f, path + ("values",), "DSV305", f"input {name!r} lists values per "
                                   "parent value; add `by: <input>`")
                        continue
                    if any(str(v) not in slot["values"] for v in values):
                        self.grew(f, path + ("values",))
                    slot["values"].extend(str(v) for v in values if str(v) not in slot["values"])
                for attr in ("default", "fallback", "probe"):
                    if attr in decl:
                        if slot[attr] not in (None, str(decl[attr])):
                            self.error(f, path + (attr,), "DSV305", f"{name}.{attr} is {slot[attr]!r} in another file")
                        slot[attr] = str(decl[attr])
                        slot["at"][attr] = (f, path + (attr,))
                for alias, value in (decl.get("aliases") or {}).items():
                    if slot["aliases"].get(str(alias), str(value)) != str(value):
                        self.error(f, path + ("aliases", alias), "DSV305", f"alias {alias!r} of {name} means "
                                   f"{slot['aliases'][str(alias)]!r} in another file", key=True)
                        continue
                    slot["aliases"][str(alias)] = str(value)
                    slot["at"]["aliases", str(alias)] = (f, path + ("aliases", alias))
                # problems with values, parents and defaults are reported where they were written
                for parent in (values if isinstance(values, dict) else ()):
                    slot["at"].setdefault(("parent", str(parent)), (f, path + ("values", parent)))
                slot.setdefault("origin", (f, path))
        where = self.files[0] if self.files else None
        builtin = self.profile.builtin_inputs
        for name in builtin:
            if name not in merged and where is not None:
                self.error(where, (), "DSV305", f"the vocabulary does not declare the input {name!r} "
                           "(add it to a `kind: vocabulary` file)")
        ordered = [n for n in builtin if n in merged] + [n for n in merged if n not in builtin]
        out: dict[str, InputDecl] = {}
        for name in ordered:
            slot = merged[name]
            f, path = slot["origin"]
            by = slot["by"]
            scoped = None
            if by:
                if by not in merged or merged[by]["by"]:
                    self.error(f, path + ("by",), "DSV305", f"{name!r} is scoped by {by!r}, which is not an unscoped input")
                    continue
                unknown = [p for p in slot["scoped"] if p not in merged[by]["values"]]
                for p in unknown:
                    pf, ppath = slot["at"].get(("parent", p), (f, path + ("values", p)))
                    self.error(pf, ppath, "DSV301", f"{p!r} is not a value of {by!r}"
                               + did_you_mean(p, merged[by]["values"]), key=True)
                scoped = tuple((p, tuple(slot["scoped"].get(p, ()))) for p in merged[by]["values"])
                if ordered.index(by) > ordered.index(name):
                    self.error(f, path + ("by",), "DSV305", f"{name!r} must be declared after {by!r}")
            for attr in ("default", "fallback"):
                value = slot[attr]
                if value is not None and value not in slot["values"]:
                    af, apath = slot["at"][attr]
                    self.error(af, apath, "DSV301", f"{attr} {value!r} is not one of the values of {name!r}"
                               + did_you_mean(value, slot["values"]))
            for alias, value in slot["aliases"].items():
                if value not in slot["values"]:
                    af, apath = slot["at"]["aliases", alias]
                    self.error(af, apath, "DSV301", f"alias {alias!r} names {value!r}, which is not one of the "
                               f"values of {name!r}" + did_you_mean(value, slot["values"]))
            if name not in builtin and slot["default"] is None:
                self.error(f, path, "DSV305", f"input {name!r} needs a `default:` so that callers who do not "
                           "pass it still get a decision", key=True)
            if slot["probe"] is not None:
                pf, ppath = slot["at"]["probe"]
                self.check_impl(pf, ppath, slot["probe"])
            out[name] = InputDecl(name, tuple(slot["values"]), by, scoped, slot["default"], slot["fallback"],
                                  slot["probe"], tuple(slot["aliases"].items()))
        return out

    # conditions ------------------------------------------------------------
    def expand(self, f: LoadedFile, path: tuple, decl: InputDecl, condition: Any) -> frozenset[str]:
        negate = isinstance(condition, dict)
        items = condition["not"] if negate else condition
        items = items if isinstance(items, list) else [items]
        chosen: set[str] = set()
        for i, item in enumerate(items):
            item = str(item)
            item_path = path + (("not",) if negate else ()) + ((i,) if len(items) > 1 or isinstance(
                condition if not negate else condition["not"], list) else ())
            if item in decl.values:
                chosen.add(item)
            elif families.is_family(item):
                family = set(families.members(item, decl.values))
                if not family:
                    self.error(f, item_path, "DSV303", f"family {item!r} matches no declared value of {decl.name!r}")
                chosen |= family
            else:
                self.error(f, item_path, "DSV301", f"{item!r} is not a declared value of {decl.name!r}"
                           + (self.spelled(decl, item) or did_you_mean(item, decl.values)))
        if negate:
            return frozenset(v for v in decl.values if v not in chosen)
        return frozenset(chosen)

    def spelled(self, decl: InputDecl, item: str) -> str:
        """The hint for a value that spells a declared one another way (a query's spelling,
        an alias): rules write the declared value itself, so the hint names it."""
        spell = dict(self.profile.spellings).get(decl.name)
        value = spell(item) if spell else None
        if value not in decl.values:
            value = {alias.lower(): v for alias, v in decl.aliases}.get(item.lower())
        if value not in decl.values or value == item:
            return ""
        return f"; rules write the declared value: {value!r} (queries accept {item!r} as a spelling of it)"

    def check_impl(self, f: LoadedFile, path: tuple, impl: str) -> None:
        try:
            check_impl_allowed(impl, self.allowed)
        except ImplLoadError as exc:
            self.error(f, path, "DSV310", str(exc))

    def check_template(self, f: LoadedFile, path: tuple, text: str) -> None:
        try:
            names = template_fields(text)
        except ValueError as exc:
            self.error(f, path, "DSV304", f"bad template: {exc}")
            return
        allowed = set(self.inputs) | {"backend"}
        for name in names:
            if name not in allowed:
                self.error(f, path, "DSV304", f"unknown placeholder {{{name}}}; available: "
                           + ", ".join(sorted(allowed)) + did_you_mean(name, allowed))

    def messages(self, f: LoadedFile, path: tuple, items: list) -> tuple[tuple[str, str], ...]:
        out = []
        for i, item in enumerate(items or ()):
            (level, text), = item.items()
            self.check_template(f, path + (i, level), text)
            out.append((level, text))
        return tuple(out)

    def outcome(self, f: LoadedFile, path: tuple, raw: dict, defaults: dict, table_kind: str) -> Outcome | None:
        kinds = [k for k in ("select", "use", "reject") if k in raw]
        if len(kinds) != 1:
            self.error(f, path, "DSV309", f"rule {raw.get('id', '?')!r} needs exactly one of select, use, reject"
                       + (f" (found {', '.join(kinds)})" if kinds else ""))
            return None
        kind = kinds[0]
        if "messages" in raw and kind == "reject":
            self.error(f, path + ("messages",), "DSV309", "a reject rule has no messages; put the text in `reason`", key=True)
        messages = self.messages(f, path + ("messages",), raw.get("messages"))
        if kind == "reject":
            reason = raw["reject"]["reason"]
            self.check_template(f, path + ("reject", "reason"), reason)
            return Outcome("reject", reason=reason)
        if kind == "use":
            return Outcome("use", target=raw["use"], messages=messages)
        if table_kind == "default":
            self.error(f, path + ("select",), "DSV309", "the default-backend decision only picks a backend: "
                       "use `use: BACKEND` (the backend's own table decides the rest)", key=True)
            return None
        merged = {**defaults, **raw["select"]}
        missing = [k for k in self.profile.field_names if k not in merged]
        if missing:
            self.error(f, path + ("select",), "DSV309", "select is missing " + ", ".join(missing)
                       + " (set them here or in the file's `defaults:`)", key=True)
            return None
        self.check_impl(f, path + ("select", "impl") if "impl" in raw["select"] else ("defaults", "impl"),
                        merged["impl"])
        # every text field may name inputs, except the impl: the allow-list check above
        # already refuses a templated class path, and one problem gives one finding
        for name, kind in self.profile.select_fields:
            if kind is str and isinstance(merged[name], str) and name != "impl":
                where = path + ("select", name) if name in raw["select"] else ("defaults", name)
                self.check_template(f, where, merged[name])
        rewrites = merged.get("rewrites") or {}
        for k, v in rewrites.items():
            if isinstance(v, str):
                self.check_template(f, path + ("select", "rewrites", k), v)
        if "hosts" in merged:
            where = path + ("select", "hosts") if "hosts" in raw["select"] else ("defaults", "hosts")
            for host, message in hosts_mod.problems(merged["hosts"]):
                self.error(f, where + (host,), "DSV315", message)
            merged["host_settings"] = hosts_mod.compile_settings(merged["hosts"])
            merged["hosts"] = hosts_mod.compile_hosts(merged["hosts"])
        fields = tuple(sorted((k, v) for k, v in merged.items() if k != "rewrites")) + (("rewrites", dict(rewrites)),)
        inherited = tuple((k, (f.file, *f.where(("defaults", k)))) for k in sorted(defaults)
                          if k not in raw["select"] and k != "rewrites")
        return Outcome("select", fields=fields, messages=messages, inherited=inherited)

    # tables ----------------------------------------------------------------
    def build(self) -> Program:
        self.inputs = self.vocabulary()
        tables: dict[str, Table] = {}
        default_table: Table | None = None
        backend_order: list[str] = []
        declared_in: dict[str, LoadedFile] = {}
        all_rules: list[Rule] = []
        seen_ids: dict[str, Rule] = {}
        default_entries: list[tuple[bool, int, int, Rule]] = []
        pack_rank: dict[str, int] = {}
        copies: dict[str, LoadedFile] = {}
        for f in self.files:
            kind = f.data.get("kind")
            if kind not in ("default", "backend"):
                continue
            first = copies.setdefault(f.source, f)
            if first is not f:  # one problem for a whole copied file, not one per backend and rule id
                self.error(f, ("kind",), "DSV313", f"this file is a copy of {first.file}: the same pack is loaded twice "
                           "(installed, and named with --rules or DSV4SEL_RULES_PATH?); drop one of them", key=True)
                continue
            pack = self.packs.get(f.file, "dsv4sel")
            if kind == "default":
                if default_table is None:
                    default_table = Table(DEFAULT_TABLE, (), f.data["hit_policy"], f.file,
                                          f.where(("rules",), key=True)[0])
                elif default_table.hit_policy != f.data["hit_policy"]:
                    self.error(f, ("hit_policy",), "DSV309", f"the default decision's hit policy is "
                               f"{default_table.hit_policy!r} in {default_table.file}")
                table = default_table
            else:
                names = tuple(f.data["backends"])
                for i, name in enumerate(names):
                    if name in declared_in:
                        self.error(f, ("backends", i), "DSV308", f"backend {name} already has a table in "
                                   f"{declared_in[name].file}; a pack adds backends, it cannot replace "
                                   "another's table")
                    declared_in.setdefault(name, f)
                table = Table(names[0] if len(names) == 1 else "|".join(names), names,
                              f.data["hit_policy"], f.file, f.where(("backends",), key=True)[0])
                if any(name not in tables for name in names):
                    self.grew(f, ("backends",))
                for name in names:
                    if name not in tables:
                        tables[name] = table
                        backend_order.append(name)
            defaults = f.data.get("defaults") or {}
            for i, raw in enumerate(f.data["rules"]):
                path = ("rules", i)
                line, _ = f.where(path)
                ref = RuleRef(raw["id"], f.file, line, pack)
                if raw.get("description"):
                    self.descriptions[ref] = " ".join(str(raw["description"]).split())
                if raw["id"] in seen_ids:
                    other = seen_ids[raw["id"]].ref
                    self.error(f, path + ("id",), "DSV307", f"rule id {raw['id']!r} is already used at {other.location}")
                conditions = []
                for name, condition in (raw.get("when") or {}).items():
                    if name == "backend":
                        self.error(f, path + ("when", name), "DSV309", "rules do not test `backend`: each table "
                                   "decides for the backends it declares", key=True)
                        continue
                    if name not in self.inputs:
                        if not self.inputs:
                            continue  # no vocabulary at all: reported once
                        self.error(f, path + ("when", name), "DSV302", f"unknown input {name!r}; declared: "
                                   + ", ".join(self.inputs) + did_you_mean(name, self.inputs), key=True)
                        continue
                    conditions.append((name, self.expand(f, path + ("when", name), self.inputs[name], condition)))
                order = {n: k for k, n in enumerate(self.inputs)}
                conditions.sort(key=lambda c: order[c[0]])
                outcome = self.outcome(f, path, raw, defaults, kind)
                if outcome is None:
                    continue
                if raw.get("override") and kind != "default":
                    self.error(f, path + ("override",), "DSV309", "`override` applies to default-backend rules only; "
                               "a backend's table is owned by the file that declares it", key=True)
                rule = Rule(ref, table.name, len(table.rules), tuple(conditions), outcome)
                seen_ids.setdefault(raw["id"], rule)
                if kind == "default":
                    default_entries.append((bool(raw.get("override")), pack_rank.setdefault(pack, len(pack_rank)),
                                            len(default_entries), rule))
                else:
                    table.rules.append(rule)
                all_rules.append(rule)
        # overrides first, the latest pack's first; then every other rule in load order
        default_entries.sort(key=lambda e: (0, -e[1], e[2]) if e[0] else (1, 0, e[2]))
        if default_table is not None:
            default_table.rules = [
                Rule(r.ref, r.table, i, r.conditions, r.outcome) for i, (*_, r) in enumerate(default_entries)]
            index_of = {id(r): i for i, (*_, r) in enumerate(default_entries)}
            all_rules = [default_table.rules[index_of[id(r)]] if id(r) in index_of else r for r in all_rules]
        if default_table is None:
            where = self.files[0] if self.files and self.inputs else None
            if where is not None:
                self.error(where, (), "DSV306", "no `kind: default` file: the default-backend decision is missing")
            default_table = Table(DEFAULT_TABLE, (), "first", "<none>", 1)
        for rule in all_rules:
            target = rule.outcome.target
            if rule.outcome.kind == "use" and target not in tables:
                f = next(x for x in self.files if x.file == rule.ref.file)
                self.error(f, ("rules", rule.index, "use") if rule.table != DEFAULT_TABLE else
                           ("rules", _file_index(f, rule.ref.id), "use"), "DSV311",
                           f"`use: {target}` names a backend without a table"
                           + did_you_mean(target, tables))
        program = Program(self.inputs, default_table, tables, tuple(backend_order), all_rules,
                          self.allowed, tuple(f.file for f in self.files), self.profile, self.descriptions,
                          tuple(self.growth))
        self._check_cycles(program)
        return program

    def _check_cycles(self, program: Program) -> None:
        edges: dict[str, set[str]] = {}
        for rule in program.rules:
            if rule.outcome.kind == "use" and rule.table != DEFAULT_TABLE:
                for b in program.tables[rule.table.split("|")[0]].backends:
                    edges.setdefault(b, set()).add(rule.outcome.target)
        for start in edges:
            stack, seen = [(start, (start,))], set()
            while stack:
                node, trail = stack.pop()
                for nxt in edges.get(node, ()):
                    if nxt == start:
                        # The tables' use: graph has a loop; it is an error only if some
                        # input actually goes round it (V4.0 -> V4.1 alias and V4.1 ->
                        # V4.0 rules between the same tables never meet at one point).
                        looping = self._looping_input(program, trail)
                        if looping is None:
                            continue
                        table = program.tables[start]
                        f = next(x for x in self.files if x.file == table.file)
                        self.error(f, ("backends",), "DSV312", "`use:` chain loops: " + " -> ".join(looping))
                        return
                    if nxt not in seen:
                        seen.add(nxt)
                        stack.append((nxt, trail + (nxt,)))

    @staticmethod
    def _looping_input(program: Program, backends: tuple[str, ...]) -> tuple[str, ...] | None:
        """The backends an input visits round a loop, starting at one of
        ``backends``, or None when no input loops."""
        for point in program.points():
            for backend in backends:
                current, visited = backend, [backend]
                while True:
                    rule = program.tables[current].decide(point)
                    if rule is None or rule.outcome.kind != "use":
                        break
                    current = rule.outcome.target
                    if current in visited:
                        return tuple(visited) + (current,)
                    visited.append(current)
        return None


def _file_index(f: LoadedFile, rule_id: str) -> int:
    for i, raw in enumerate(f.data.get("rules", [])):
        if raw.get("id") == rule_id:
            return i
    return 0


def compile_files(files: list[LoadedFile], *, allowed_impl_modules: tuple[str, ...], profile: Profile,
                  packs: dict[str, str] | None = None) -> Program:
    """Build a Program of ``profile``'s domain from loaded, schema-valid files;
    raise RuleError listing every semantic problem."""
    builder = _Builder(files, allowed_impl_modules, packs or {}, profile)
    program = builder.build()
    if builder.problems:
        # one problem once: an impl named in `defaults:` is checked for every select rule of the file
        unique = dict.fromkeys(builder.problems)
        raise RuleError(sorted(unique, key=lambda p: (p.file, p.line, p.column)))
    return program
