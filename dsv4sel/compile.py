"""Stage 3, compile: validated rule files -> a :class:`Program`.

A Program holds the vocabulary (the finite decision space), the default-backend
decision table and one decision table per backend, with every rule's
conditions expanded to sets of vocabulary values. ``Program.resolve`` answers a
point of the space by walking the chain default table -> backend table
(-> another backend's table for ``use:``). ``Program.to_table`` evaluates every
point once and returns plain data for the evaluator and its cache.

Semantic problems (unknown vocabulary values, impl classes outside the
allow-list, dangling ``use:`` targets, bad templates, ...) are collected with
their ``file:line:column``; :func:`compile_files` raises one RuleError listing
all of them.
"""

from __future__ import annotations

import difflib
import string
from array import array
from dataclasses import dataclass, field
from typing import Any, Iterator

from .errors import Problem, RuleError
from . import hosts as hosts_mod
from .load import LoadedFile
from .values import RuleRef

DEFAULT_TABLE = "<default>"
BUILTIN_INPUTS = ("model", "platform", "capability", "kv_cache_dtype")
REQUIRED_SELECT_FIELDS = ("impl", "layout", "cache_dtype", "torch_dtype", "bytes_per_token", "block_size")
FAMILY_SUFFIX = ".x"
COMPILED_FORMAT = 2  # 2: select outcomes end with their host classes


@dataclass(frozen=True)
class InputDecl:
    """One declared input of the decision: its values and where they were declared.

    ``scoped`` is set when the values depend on another input (``by``), e.g. the
    capability values of each platform; ``values`` is then their union.
    """

    name: str
    values: tuple[str, ...]
    by: str | None = None
    scoped: tuple[tuple[str, tuple[str, ...]], ...] | None = None
    default: str | None = None
    fallback: str | None = None
    probe: str | None = None

    def values_for(self, point: dict[str, str]) -> tuple[str, ...]:
        if self.scoped is None:
            return self.values
        return dict(self.scoped).get(point[self.by], ())


@dataclass(frozen=True)
class Outcome:
    """What a rule decides: ``select`` (fields), ``use`` (target backend) or ``reject`` (reason)."""

    kind: str
    fields: tuple[tuple[str, Any], ...] = ()
    target: str | None = None
    reason: str | None = None
    messages: tuple[tuple[str, str], ...] = ()

    def field(self, name: str) -> Any:
        return dict(self.fields).get(name)


@dataclass(frozen=True)
class Rule:
    """A compiled rule: ``conditions`` maps each constrained input to the set of
    values it accepts; inputs not named accept anything."""

    ref: RuleRef
    table: str
    index: int
    conditions: tuple[tuple[str, frozenset[str]], ...]
    outcome: Outcome

    def matches(self, point: dict[str, str]) -> bool:
        return all(point[name] in allowed for name, allowed in self.conditions)

    def first_failing(self, point: dict[str, str]) -> str | None:
        """The first input whose value this rule does not accept (for "why not")."""
        for name, allowed in self.conditions:
            if point[name] not in allowed:
                return name
        return None


@dataclass
class Table:
    """A decision table: the default-backend decision or the table of some backends."""

    name: str
    backends: tuple[str, ...]
    hit_policy: str
    file: str
    line: int
    rules: list[Rule] = field(default_factory=list)

    def matching(self, point: dict[str, str]) -> list[Rule]:
        return [rule for rule in self.rules if rule.matches(point)]

    def decide(self, point: dict[str, str]) -> Rule | None:
        """The rule that decides ``point`` under this table's hit policy. Under
        ``unique`` an overlap is a verification finding; evaluation then takes
        the first matching rule so that it stays deterministic."""
        for rule in self.rules:
            if rule.matches(point):
                return rule
        return None


@dataclass(frozen=True)
class Resolution:
    """The result of resolving one point: ``kind`` is select, reject or gap.

    ``path`` lists the rules consulted in order (the default rule first when
    the query named no backend). For a gap, ``table`` names the table in which
    no rule matched.
    """

    kind: str
    backend: str | None
    path: tuple[Rule, ...]
    table: str
    fields: tuple[tuple[str, Any], ...] = ()
    reason: str = ""
    messages: tuple[tuple[str, str], ...] = ()


@dataclass
class Program:
    """The compiled rules: vocabulary plus tables. Immutable once built."""

    inputs: dict[str, InputDecl]
    default_table: Table
    tables: dict[str, Table]
    backends: tuple[str, ...]
    rules: list[Rule]
    allowed_impl_modules: tuple[str, ...]
    sources: tuple[str, ...]

    @property
    def input_order(self) -> tuple[str, ...]:
        return tuple(self.inputs)

    def points(self) -> Iterator[dict[str, str]]:
        """Every point of the decision space except the backend, in vocabulary order."""
        names = list(self.inputs)

        def walk(i: int, point: dict[str, str]) -> Iterator[dict[str, str]]:
            if i == len(names):
                yield dict(point)
                return
            decl = self.inputs[names[i]]
            for value in decl.values_for(point):
                point[decl.name] = value
                yield from walk(i + 1, point)
            point.pop(decl.name, None)

        yield from walk(0, {})

    def space_size(self) -> int:
        return sum(1 for _ in self.points()) * (len(self.backends) + 1)

    def table_for(self, backend: str | None) -> Table:
        return self.default_table if backend is None else self.tables[backend]

    def resolve(self, backend: str | None, point: dict[str, str]) -> Resolution:
        """Decide ``point`` with ``backend`` requested (None = platform default)."""
        path: list[Rule] = []
        messages: list[tuple[str, str]] = []
        current = backend
        table = self.table_for(current)
        while True:
            rule = table.decide(point)
            if rule is None:
                return Resolution("gap", current, tuple(path), table.name)
            path.append(rule)
            values = dict(point, backend=current or "")
            outcome = rule.outcome
            messages.extend((lvl, render(text, values)) for lvl, text in outcome.messages)
            if outcome.kind == "use":
                current = outcome.target
                table = self.tables[current]
                continue
            if outcome.kind == "reject":
                return Resolution("reject", current, tuple(path), table.name,
                                  reason=render(outcome.reason, values), messages=tuple(messages))
            fields = tuple((k, render(v, values) if isinstance(v, str) else v) for k, v in outcome.fields)
            return Resolution("select", current, tuple(path), table.name, fields=fields,
                              messages=tuple(messages))

    def to_table(self) -> dict[str, Any]:
        """Evaluate every point and return plain data (dicts, tuples, str, int)
        that :class:`dsv4sel.ruleset.RuleSet` loads, from memory or from marshal."""
        rule_index = {id(rule): i for i, rule in enumerate(self.rules)}
        outcomes: list[tuple] = []
        outcome_ids: dict[tuple, int] = {}
        layout = DenseLayout.for_program(self)
        ids = [0] * layout.size
        for point in self.points():
            for backend in (None, *self.backends):
                res = self.resolve(backend, point)
                path = tuple(rule_index[id(r)] for r in res.path)
                if res.kind == "select":
                    f = dict(res.fields)
                    rewrites = tuple(sorted((k, v) for k, v in f.get("rewrites", {}).items()
                                            if not (k == "cache_dtype" and v == point["kv_cache_dtype"])))
                    item = ("select", res.backend, f["impl"], f["layout"], f["cache_dtype"],
                            f["torch_dtype"], f["bytes_per_token"], f["block_size"], rewrites,
                            res.messages, path, f.get("hosts", ()))
                elif res.kind == "reject":
                    item = ("reject", res.backend, res.reason, path, res.messages)
                else:
                    item = ("gap", res.backend, res.table, path)
                oid = outcome_ids.get(item)
                if oid is None:
                    oid = outcome_ids[item] = len(outcomes)
                    outcomes.append(item)
                ids[layout.index(point, backend)] = oid
        typecode = "H" if len(outcomes) < 1 << 16 else "I"
        table = {**layout.as_data(), "typecode": typecode, "ids": array(typecode, ids).tobytes()}
        return {
            "format": COMPILED_FORMAT,
            "inputs": [(d.name, d.values, d.by, d.scoped, d.default, d.fallback, d.probe)
                       for d in self.inputs.values()],
            "backends": self.backends,
            "selectable": tuple(b for b in self.backends
                                if any(o[0] == "select" and o[1] == b for o in outcomes)),
            "rules": [(r.ref.id, r.ref.file, r.ref.line, r.ref.pack, r.table) for r in self.rules],
            "outcomes": outcomes,
            "table": table,
            "allowed": self.allowed_impl_modules,
            "sources": self.sources,
        }


class DenseLayout:
    """Where each (point, backend) of the space lives in the flat outcome array.

    Inputs scoped by another input (capability by platform) and their parents
    form *blocks*, one per combination that exists; every other input and the
    backend vary uniformly inside a block, so an index is a block base plus a
    mixed-radix offset. The evaluator stores the array as raw bytes: loading
    it costs one marshal object instead of one tuple per point.
    """

    def __init__(self, key_inputs, block_inputs, dense_inputs, dense_values, blocks):
        self.key_inputs = tuple(key_inputs)
        self.block_inputs = tuple(block_inputs)
        self.dense_inputs = tuple(dense_inputs)
        self.dense_values = tuple(tuple(v) for v in dense_values)
        self.blocks = dict(blocks)
        self.block_size = 1
        for values in self.dense_values:
            self.block_size *= len(values)
        self.size = self.block_size * len(self.blocks)
        self._positions = [{v: i for i, v in enumerate(values)} for values in self.dense_values]

    @classmethod
    def for_program(cls, program: "Program") -> "DenseLayout":
        names = list(program.inputs)
        extras = [n for n in names if n not in BUILTIN_INPUTS]
        key_inputs = ["model", "platform", "capability", "backend", "kv_cache_dtype", *extras]
        scoped = {d.name for d in program.inputs.values() if d.by} | {
            d.by for d in program.inputs.values() if d.by}
        block_inputs = [n for n in key_inputs if n in scoped]
        dense_inputs = [n for n in key_inputs if n not in scoped]
        dense_values = [(None, *program.backends) if n == "backend" else program.inputs[n].values
                        for n in dense_inputs]
        blocks: dict[tuple, int] = {}
        for point in program.points():
            key = tuple(point[n] for n in block_inputs)
            if key not in blocks:
                blocks[key] = len(blocks)
        layout = cls(key_inputs, block_inputs, dense_inputs, dense_values, {})
        layout.blocks = {key: i * layout.block_size for key, i in blocks.items()}
        layout.size = layout.block_size * len(blocks)
        return layout

    def index(self, point: dict[str, str], backend: str | None) -> int:
        offset = self.blocks[tuple(point[n] for n in self.block_inputs)]
        stride = self.block_size
        for name, positions in zip(self.dense_inputs, self._positions):
            stride //= len(positions)
            offset += positions[backend if name == "backend" else point[name]] * stride
        return offset

    def as_data(self) -> dict[str, Any]:
        return {"key_inputs": self.key_inputs, "block_inputs": self.block_inputs,
                "dense_inputs": self.dense_inputs, "dense_values": self.dense_values,
                "blocks": self.blocks}


# ---------------------------------------------------------------- templates

_FORMATTER = string.Formatter()


def template_fields(text: str) -> list[str]:
    """The ``{name}`` placeholders of ``text``; raises ValueError on bad syntax."""
    names = []
    for _, name, spec, conversion in _FORMATTER.parse(text):
        if name is None:
            continue
        if spec or conversion or not name.isidentifier():
            raise ValueError(f"placeholder {{{name}}} must be a plain input name")
        names.append(name)
    return names


def render(text: str, values: dict[str, str]) -> str:
    if "{" not in text:
        return text
    return text.format_map({k: ("<none>" if v in ("", None) else v) for k, v in values.items()})


# ------------------------------------------------------------------ builder

def nearest(word: str, candidates) -> str:
    close = difflib.get_close_matches(str(word), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


class _Builder:
    def __init__(self, files: list[LoadedFile], allowed: tuple[str, ...], packs: dict[str, str]):
        self.files = files
        self.allowed = allowed
        self.packs = packs
        self.problems: list[Problem] = []

    def error(self, f: LoadedFile, path: tuple, message: str, *, key: bool = False) -> None:
        self.problems.append(f.problem(path, message, key=key))

    # vocabulary ------------------------------------------------------------
    def vocabulary(self) -> dict[str, InputDecl]:
        merged: dict[str, dict[str, Any]] = {}
        for f in self.files:
            if f.data.get("kind") != "vocabulary":
                continue
            for name, decl in f.data["inputs"].items():
                path = ("inputs", name)
                if name == "backend":
                    self.error(f, path, "`backend` is not declared in the vocabulary: "
                               "the backend names are the tables' `backends:`", key=True)
                    continue
                slot = merged.setdefault(name, {"values": [], "scoped": None, "by": decl.get("by"),
                                                "default": None, "fallback": None, "probe": None})
                if slot["by"] != decl.get("by"):
                    self.error(f, path + ("by",), f"input {name!r} is scoped by {slot['by']!r} elsewhere")
                    continue
                values = decl["values"]
                if decl.get("by"):
                    if not isinstance(values, dict):
                        self.error(f, path + ("values",), f"input {name!r} has `by:`, so `values` must map "
                                   f"each {decl['by']} value to a list")
                        continue
                    scoped = slot["scoped"] = slot["scoped"] or {}
                    for parent, vals in values.items():
                        bucket = scoped.setdefault(str(parent), [])
                        bucket.extend(str(v) for v in vals if str(v) not in bucket)
                        for v in vals:
                            if str(v) not in slot["values"]:
                                slot["values"].append(str(v))
                else:
                    if isinstance(values, dict):
                        self.error(f, path + ("values",), f"input {name!r} lists values per "
                                   "parent value; add `by: <input>`")
                        continue
                    slot["values"].extend(str(v) for v in values if str(v) not in slot["values"])
                for attr in ("default", "fallback", "probe"):
                    if attr in decl:
                        if slot[attr] not in (None, str(decl[attr])):
                            self.error(f, path + (attr,), f"{name}.{attr} is {slot[attr]!r} in another file")
                        slot[attr] = str(decl[attr])
                slot.setdefault("origin", (f, path))
        where = self.files[0] if self.files else None
        for name in BUILTIN_INPUTS:
            if name not in merged and where is not None:
                self.error(where, (), f"the vocabulary does not declare the input {name!r} "
                           "(add it to a `kind: vocabulary` file)")
        ordered = [n for n in BUILTIN_INPUTS if n in merged] + [n for n in merged if n not in BUILTIN_INPUTS]
        out: dict[str, InputDecl] = {}
        for name in ordered:
            slot = merged[name]
            f, path = slot["origin"]
            by = slot["by"]
            scoped = None
            if by:
                if by not in merged or merged[by]["by"]:
                    self.error(f, path + ("by",), f"{name!r} is scoped by {by!r}, which is not an unscoped input")
                    continue
                unknown = [p for p in slot["scoped"] if p not in merged[by]["values"]]
                for p in unknown:
                    self.error(f, path + ("values", p), f"{p!r} is not a value of {by!r}"
                               + nearest(p, merged[by]["values"]), key=True)
                scoped = tuple((p, tuple(slot["scoped"].get(p, ()))) for p in merged[by]["values"])
                if ordered.index(by) > ordered.index(name):
                    self.error(f, path + ("by",), f"{name!r} must be declared after {by!r}")
            for attr in ("default", "fallback"):
                value = slot[attr]
                if value is not None and value not in slot["values"]:
                    self.error(f, path + (attr,), f"{attr} {value!r} is not one of the values of {name!r}"
                               + nearest(value, slot["values"]))
            if name not in BUILTIN_INPUTS and slot["default"] is None:
                self.error(f, path, f"input {name!r} needs a `default:` so that callers who do not "
                           "pass it still get a decision", key=True)
            if slot["probe"] is not None:
                self.check_impl(f, path + ("probe",), slot["probe"])
            out[name] = InputDecl(name, tuple(slot["values"]), by, scoped, slot["default"], slot["fallback"],
                                  slot["probe"])
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
            elif item.endswith(FAMILY_SUFFIX) and len(item) > len(FAMILY_SUFFIX):
                prefix = item[: -len(FAMILY_SUFFIX)] + "."
                family = {v for v in decl.values if v.startswith(prefix)}
                if not family:
                    self.error(f, item_path, f"family {item!r} matches no declared value of {decl.name!r}")
                chosen |= family
            else:
                self.error(f, item_path, f"{item!r} is not a declared value of {decl.name!r}"
                           + nearest(item, decl.values))
        if negate:
            return frozenset(v for v in decl.values if v not in chosen)
        return frozenset(chosen)

    def check_impl(self, f: LoadedFile, path: tuple, impl: str) -> None:
        module = impl.partition(":")[0]
        if not any(module == p or module.startswith(p + ".") for p in self.allowed):
            self.error(f, path, f"impl {impl!r} is not in an allowed module ({', '.join(self.allowed)}); "
                       "impl classes are imported only from the allow-list")

    def check_template(self, f: LoadedFile, path: tuple, text: str) -> None:
        try:
            names = template_fields(text)
        except ValueError as exc:
            self.error(f, path, f"bad template: {exc}")
            return
        allowed = set(self.inputs) | {"backend"}
        for name in names:
            if name not in allowed:
                self.error(f, path, f"unknown placeholder {{{name}}}; available: "
                           + ", ".join(sorted(allowed)) + nearest(name, allowed))

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
            self.error(f, path, f"rule {raw.get('id', '?')!r} needs exactly one of select, use, reject"
                       + (f" (found {', '.join(kinds)})" if kinds else ""))
            return None
        kind = kinds[0]
        if "messages" in raw and kind == "reject":
            self.error(f, path + ("messages",), "a reject rule has no messages; put the text in `reason`", key=True)
        messages = self.messages(f, path + ("messages",), raw.get("messages"))
        if kind == "reject":
            reason = raw["reject"]["reason"]
            self.check_template(f, path + ("reject", "reason"), reason)
            return Outcome("reject", reason=reason)
        if kind == "use":
            return Outcome("use", target=raw["use"], messages=messages)
        if table_kind == "default":
            self.error(f, path + ("select",), "the default-backend decision only picks a backend: "
                       "use `use: BACKEND` (the backend's own table decides the rest)", key=True)
            return None
        merged = {**defaults, **raw["select"]}
        missing = [k for k in REQUIRED_SELECT_FIELDS if k not in merged]
        if missing:
            self.error(f, path + ("select",), "select is missing " + ", ".join(missing)
                       + " (set them here or in the file's `defaults:`)", key=True)
            return None
        self.check_impl(f, path + ("select", "impl") if "impl" in raw["select"] else ("defaults", "impl"),
                        merged["impl"])
        self.check_template(f, path + ("select", "cache_dtype"), str(merged["cache_dtype"]))
        rewrites = merged.get("rewrites") or {}
        for k, v in rewrites.items():
            if isinstance(v, str):
                self.check_template(f, path + ("select", "rewrites", k), v)
        if "hosts" in merged:
            where = path + ("select", "hosts") if "hosts" in raw["select"] else ("defaults", "hosts")
            for host, message in hosts_mod.problems(merged["hosts"]):
                self.error(f, where + (host,), message)
            merged["hosts"] = hosts_mod.compile_hosts(merged["hosts"])
        fields = tuple(sorted((k, v) for k, v in merged.items() if k != "rewrites")) + (("rewrites", dict(rewrites)),)
        return Outcome("select", fields=fields, messages=messages)

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
        for f in self.files:
            kind = f.data.get("kind")
            if kind not in ("default", "backend"):
                continue
            pack = self.packs.get(f.file, "dsv4sel")
            if kind == "default":
                if default_table is None:
                    default_table = Table(DEFAULT_TABLE, (), f.data["hit_policy"], f.file,
                                          f.where(("rules",), key=True)[0])
                elif default_table.hit_policy != f.data["hit_policy"]:
                    self.error(f, ("hit_policy",), f"the default decision's hit policy is "
                               f"{default_table.hit_policy!r} in {default_table.file}")
                table = default_table
            else:
                names = tuple(f.data["backends"])
                for i, name in enumerate(names):
                    if name in declared_in:
                        self.error(f, ("backends", i), f"backend {name} already has a table in "
                                   f"{declared_in[name].file}")
                    declared_in.setdefault(name, f)
                table = Table(names[0] if len(names) == 1 else "|".join(names), names,
                              f.data["hit_policy"], f.file, f.where(("backends",), key=True)[0])
                for name in names:
                    if name not in tables:
                        tables[name] = table
                        backend_order.append(name)
            defaults = f.data.get("defaults") or {}
            for i, raw in enumerate(f.data["rules"]):
                path = ("rules", i)
                line, _ = f.where(path)
                ref = RuleRef(raw["id"], f.file, line, pack)
                if raw["id"] in seen_ids:
                    other = seen_ids[raw["id"]].ref
                    self.error(f, path + ("id",), f"rule id {raw['id']!r} is already used at {other.location}")
                conditions = []
                for name, condition in (raw.get("when") or {}).items():
                    if name == "backend":
                        self.error(f, path + ("when", name), "rules do not test `backend`: each table "
                                   "decides for the backends it declares", key=True)
                        continue
                    if name not in self.inputs:
                        self.error(f, path + ("when", name), f"unknown input {name!r}; declared: "
                                   + ", ".join(self.inputs) + nearest(name, self.inputs), key=True)
                        continue
                    conditions.append((name, self.expand(f, path + ("when", name), self.inputs[name], condition)))
                order = {n: k for k, n in enumerate(self.inputs)}
                conditions.sort(key=lambda c: order[c[0]])
                outcome = self.outcome(f, path, raw, defaults, kind)
                if outcome is None:
                    continue
                if raw.get("override") and kind != "default":
                    self.error(f, path + ("override",), "`override` applies to default-backend rules only; "
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
            where = self.files[0] if self.files else None
            if where is not None:
                self.error(where, (), "no `kind: default` file: the default-backend decision is missing")
            default_table = Table(DEFAULT_TABLE, (), "first", "<none>", 1)
        for rule in all_rules:
            target = rule.outcome.target
            if rule.outcome.kind == "use" and target not in tables:
                f = next(x for x in self.files if x.file == rule.ref.file)
                self.error(f, ("rules", rule.index, "use") if rule.table != DEFAULT_TABLE else
                           ("rules", _file_index(f, rule.ref.id), "use"),
                           f"`use: {target}` names a backend without a table"
                           + nearest(target, tables))
        program = Program(self.inputs, default_table, tables, tuple(backend_order), all_rules,
                          self.allowed, tuple(f.file for f in self.files))
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
                        self.error(f, ("backends",), "`use:` chain loops: " + " -> ".join(looping))
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


def compile_files(files: list[LoadedFile], *, allowed_impl_modules: tuple[str, ...],
                  packs: dict[str, str] | None = None) -> Program:
    """Build a Program from loaded, schema-valid files; raise RuleError listing
    every semantic problem."""
    builder = _Builder(files, allowed_impl_modules, packs or {})
    program = builder.build()
    if builder.problems:
        raise RuleError(sorted(builder.problems, key=lambda p: (p.file, p.line, p.column)))
    return program
