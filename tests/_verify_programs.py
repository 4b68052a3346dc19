"""Random rule sets for the verifier's tests, and a brute-force reference.

A *spec* is plain data: a vocabulary, a default table and backend tables
with rules. :func:`build` turns it into a real
:class:`~dsv4sel.engine.compile.Program` (the verifier under test is the real
one); :func:`to_yaml_files` writes it as rule files for the real pipeline;
:class:`Reference` answers every question by visiting every input, the
slow and obvious way, independently of :mod:`dsv4sel.engine.space`/`scan`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import strategies as st

from dsv4sel.dsv4.profile import PROFILE
from dsv4sel.engine.model import DEFAULT_TABLE, InputDecl, Outcome, Program, Rule, Table, render
from dsv4sel.engine.values import RuleRef

IMPL = "dsv4sel.kernels.reference:DeepseekV4ReferenceSparseImpl"
BASE_FIELDS = {"impl": IMPL, "layout": "fp8_ds_mla", "cache_dtype": "fp8_ds_mla", "torch_dtype": "uint8",
               "bytes_per_token": 584, "block_size": 64}


@dataclass
class Spec:
    """``inputs``: [(name, values, by, {parent: values} or None)];
    ``tables``: [(backends, policy, rules)], the default table first with
    backends ``()``; a rule is (id, {input: values}, outcome) and an outcome
    ("select", {field overrides}), ("reject", reason) or ("use", backend)."""

    inputs: list
    tables: list = field(default_factory=list)

    def copy(self) -> "Spec":
        return Spec([(n, tuple(v), b, dict(s) if s else None) for n, v, b, s in self.inputs],
                    [(tuple(b), p, [(i, dict(c), o) for i, c, o in rules]) for b, p, rules in self.tables])


def _file(backends) -> str:
    return "rules/defaults.yaml" if not backends else f"rules/{backends[0].lower()}.yaml"


def build(spec: Spec) -> Program:
    inputs = {}
    for name, values, by, scoped in spec.inputs:
        inputs[name] = InputDecl(name, tuple(values), by,
                                 tuple((p, tuple(scoped.get(p, ()))) for p in dict((n, v) for n, v, _, _ in
                                                                                  spec.inputs)[by])
                                 if by else None, default=values[0])
    order = list(inputs)
    tables: dict[str, Table] = {}
    default = None
    backends: list[str] = []
    all_rules = []
    for names, policy, rules in spec.tables:
        file = _file(names)
        table = Table(DEFAULT_TABLE if not names else (names[0] if len(names) == 1 else "|".join(names)),
                      tuple(names), policy, file, 1)
        for position, (rule_id, conds, outcome) in enumerate(rules):
            kind = outcome[0]
            if kind == "select":
                merged = {**BASE_FIELDS, **{k: v for k, v in outcome[1].items() if k != "rewrites"}}
                fields = tuple(sorted(merged.items())) + (("rewrites", dict(outcome[1].get("rewrites", {}))),)
                out = Outcome("select", fields=fields)
            elif kind == "reject":
                out = Outcome("reject", reason=outcome[1])
            else:
                out = Outcome("use", target=outcome[1])
            conditions = tuple(sorted(((n, frozenset(v)) for n, v in conds.items()), key=lambda c: order.index(c[0])))
            rule = Rule(RuleRef(rule_id, file, 2 + 3 * position), table.name, position, conditions, out)
            table.rules.append(rule)
            all_rules.append(rule)
        if not names:
            default = table
        for name in names:
            tables[name] = table
            backends.append(name)
    return Program(inputs, default, tables, tuple(backends), all_rules, ("dsv4sel.kernels",),
                   tuple(dict.fromkeys(t.file for t in [default, *tables.values()])), PROFILE)


def to_yaml_files(spec: Spec) -> dict[str, str]:
    """The spec as rule files ``{file name: YAML text}`` (json is valid YAML)."""
    import json

    vocabulary = {}
    for name, values, by, scoped in spec.inputs:
        decl = {"values": dict(scoped) if by else list(values), "default": values[0]}
        if by:
            decl["by"] = by
        vocabulary[name] = decl
    files = {"vocabulary.yaml": json.dumps({"kind": "vocabulary", "inputs": vocabulary}, indent=1) + "\n"}
    for names, policy, rules in spec.tables:
        doc = {"kind": "backend", "backends": list(names)} if names else {"kind": "default"}
        doc["hit_policy"] = policy
        doc["rules"] = []
        for rule_id, conds, outcome in rules:
            raw = {"id": rule_id, "when": {n: list(v) if v else {"not": list(_all(spec, n))}
                                           for n, v in conds.items()}}
            if outcome[0] == "select":
                raw["select"] = {**BASE_FIELDS, **outcome[1]}
            elif outcome[0] == "reject":
                raw["reject"] = {"reason": outcome[1]}
            else:
                raw["use"] = outcome[1]
            doc["rules"].append(raw)
        files[_file(names).split("/", 1)[1]] = "\n".join(json.dumps(doc, indent=1).splitlines()) + "\n"
    return files


def _all(spec: Spec, name: str) -> tuple:
    return next(v for n, v, _, _ in spec.inputs if n == name)


# -------------------------------------------------------------- reference

class Reference:
    """Every answer by visiting every input of the built Program."""

    def __init__(self, program: Program):
        self.program = program
        names = list(program.inputs)
        self.points = []

        def walk(i, acc):
            if i == len(names):
                self.points.append(dict(acc))
                return
            decl = program.inputs[names[i]]
            for v in decl.values_for(acc):
                acc[names[i]] = v
                walk(i + 1, acc)
            acc.pop(names[i], None)

        walk(0, {})
        self.tables = {program.default_table.name: program.default_table}
        for t in program.tables.values():
            self.tables.setdefault(t.name, t)

    @staticmethod
    def matching(table, point):
        return [r for r in table.rules if all(point[n] in s for n, s in r.conditions)]

    def table_gaps(self) -> set[tuple]:
        return {(t.name, tuple(sorted(p.items()))) for t in self.tables.values() for p in self.points
                if not self.matching(t, p)}

    def pairs(self) -> dict[str, set]:
        """overlap / redundant pairs as the verifier defines them, by rule ids."""
        out = {"overlap": set(), "redundant": set()}
        for t in self.tables.values():
            seen = set()
            for p in self.points:
                hits = self.matching(t, p)
                for a, b in itertools.combinations(hits, 2):
                    seen.add((a.index, b.index))
            for i, j in seen:
                a, b = t.rules[i], t.rules[j]
                same = _key(a.outcome) == _key(b.outcome)
                if same:
                    out["redundant"].add((t.name, a.ref.id, b.ref.id))
                elif t.hit_policy == "unique":
                    out["overlap"].add((t.name, a.ref.id, b.ref.id))
        return out

    def shadowed_and_dead(self) -> tuple[set, set]:
        shadowed, dead = set(), set()
        for t in self.tables.values():
            won, matched = set(), set()
            for p in self.points:
                hits = self.matching(t, p)
                matched.update(r.ref.id for r in hits)
                if hits:
                    won.add(hits[0].ref.id)
            for r in t.rules:
                if r.ref.id not in matched:
                    dead.add(r.ref.id)
                elif r.ref.id not in won and t.hit_policy == "first":
                    shadowed.add(r.ref.id)
        return shadowed, dead

    def resolve(self, start, point):
        """(kind, final rule, label, table name) like Program.resolve, cycle-safe."""
        table = self.program.default_table if start is None else self.program.tables[start]
        label, seen = start, set()
        while True:
            if table.name in seen:
                return ("cycle", None, label, table.name)
            seen.add(table.name)
            hits = self.matching(table, point)
            if not hits:
                return ("gap", None, label, table.name)
            rule = hits[0]
            if rule.outcome.kind != "use":
                return (rule.outcome.kind, rule, label, table.name)
            if rule.outcome.target not in self.program.tables:
                return ("dangling", rule, label, table.name)
            label, table = rule.outcome.target, self.program.tables[rule.outcome.target]

    def input_gaps(self) -> set[tuple]:
        """(table, point items, start) of every undecided input."""
        out = set()
        for start in (None, *self.program.backends):
            for p in self.points:
                kind, _, _, table = self.resolve(start, p)
                if kind == "gap":
                    out.add((table, tuple(sorted(p.items())), start))
        return out

    def counts(self) -> dict:
        out = {}
        for start in (None, *self.program.backends):
            c = {"select": 0, "reject": 0, "undecided": 0}
            for p in self.points:
                kind = self.resolve(start, p)[0]
                c[kind if kind in ("select", "reject") else "undecided"] += 1
            out[start] = c
        return out

    def fixpoint_failures(self) -> set[str]:
        """Ids of select rules with a rewrite that is not a fixpoint somewhere."""
        bad = set()
        kvs = self.program.inputs["kv_cache_dtype"].values
        for start in (None, *self.program.backends):
            for p in self.points:
                kind, rule, label, _ = self.resolve(start, p)
                if kind != "select":
                    continue
                fields, rewrites = _render(rule, p, label)
                target = rewrites.get("cache_dtype")
                if target is None or target == p["kv_cache_dtype"]:
                    continue
                if target not in kvs:
                    bad.add(rule.ref.id)
                    continue
                q = dict(p, kv_cache_dtype=target)
                kind2, rule2, label2, _ = self.resolve(start, q)
                if kind2 != "select" or label2 != label:
                    bad.add(rule.ref.id)
                    continue
                fields2, rewrites2 = _render(rule2, q, label2)
                if fields2 != fields or rewrites2.get("cache_dtype", target) != target or any(
                        rewrites.get(k) != v for k, v in rewrites2.items() if k != "cache_dtype"):
                    bad.add(rule.ref.id)
        return bad


def _render(rule, point, label):
    values = dict(point, backend=label or "")
    f = dict(rule.outcome.fields)
    fields = {k: render(v, values) if isinstance(v, str) else v for k, v in f.items() if k != "rewrites"}
    rewrites = {k: render(v, values) if isinstance(v, str) else v for k, v in f["rewrites"].items()}
    return fields, rewrites


def _key(outcome):
    return (outcome.kind, repr(outcome.fields), outcome.target, outcome.reason, outcome.messages)


# ------------------------------------------------------------- strategies

@st.composite
def specs(draw, max_rules: int = 5, empty_tables: bool = True) -> Spec:
    """A random small rule set: 1-2 models, 1-3 platforms with scoped
    capabilities (dotted families, a shared ``unknown``), 2-4 kv dtypes,
    maybe an extra input; a default table and 1-3 backend tables with random
    hit policies, conditions and outcomes drawn from small pools (so that
    identical outcomes, dead and shadowed rules all occur). Rule files
    cannot hold an empty table: ``empty_tables=False`` for those."""
    models = ["m0", "m1"][: draw(st.integers(1, 2))]
    platforms = ["cuda", "rocm", "cpu"][: draw(st.integers(1, 3))]
    cap_pool = ["9.0", "10.0", "10.3", "12.0", "gfx942", "unknown"]
    scoped = {p: draw(st.lists(st.sampled_from(cap_pool), min_size=1, max_size=3, unique=True))
              for p in platforms}
    caps = list(dict.fromkeys(c for p in platforms for c in scoped[p]))
    kvs = ["auto", "fp8", "fp8_ds_mla", "float16"][: draw(st.integers(2, 4))]
    inputs = [("model", models, None, None), ("platform", platforms, None, None),
              ("capability", caps, "platform", scoped), ("kv_cache_dtype", kvs, None, None)]
    if draw(st.booleans()):
        inputs.append(("extra", ["off", "on"], None, None))
    domain = {n: v for n, v, _, _ in inputs}
    n_tables = draw(st.integers(1, 3))
    names = [[f"B{t}"] + ([f"B{t}X"] if draw(st.integers(0, 3)) == 0 else []) for t in range(n_tables)]
    counter = itertools.count()

    def condition():
        conds = {}
        for name, values in domain.items():
            if draw(st.integers(0, 2)) == 0:
                conds[name] = draw(st.lists(st.sampled_from(values), min_size=0 if draw(st.integers(0, 9)) == 0
                                            else 1, max_size=len(values), unique=True))
        return conds

    def rules(table_index):
        out = []
        least = 0 if table_index >= 0 and empty_tables else 1  # rule files need one rule
        for _ in range(draw(st.integers(least, max_rules))):
            rid = f"r{next(counter)}"
            choice = draw(st.integers(0, 9))
            later = [n for t in names[table_index + 1:] for n in t]
            if table_index < 0 and choice < 6:
                outcome = ("use", draw(st.sampled_from([n for t in names for n in t])))
            elif table_index >= 0 and choice == 0 and later:
                outcome = ("use", draw(st.sampled_from(later)))  # later tables only: no cycles
            elif choice < 4 or table_index < 0:
                outcome = ("reject", draw(st.sampled_from(["no {platform}", "unsupported"])))
            else:
                outcome = ("select", draw(st.sampled_from([
                    {}, {"block_size": 128},
                    {"cache_dtype": "{kv_cache_dtype}"},
                    {"rewrites": {"cache_dtype": "fp8_ds_mla"}},
                    {"rewrites": {"cache_dtype": "fp8"}},
                ])))
            out.append((rid, condition(), outcome))
        return out

    tables = [((), draw(st.sampled_from(["first", "unique"])), rules(-1))]
    for t, backend_names in enumerate(names):
        tables.append((tuple(backend_names), draw(st.sampled_from(["first", "unique"])), rules(t)))
    return Spec(inputs, tables)
