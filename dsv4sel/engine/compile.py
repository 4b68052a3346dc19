"""Stage 3, compile: validated rule files -> a :class:`~dsv4sel.engine.model.Program`.

The compiler runs named stages in order (:data:`STAGES`, as OPA's compiler
does), each over one :class:`Compilation` that holds what the stages before
it found:

1. ``merge_vocabulary`` (:mod:`dsv4sel.engine.vocabulary`): the declared inputs, i.e.
   the finite decision space;
2. ``declare_tables``: the default-backend decision table and one table per backend,
   each rule's conditions expanded to sets of vocabulary values and its outcome checked;
3. ``order_defaults``: the default decision's rules, overrides first;
4. ``link_uses``: every ``use:`` names a backend with a table;
5. ``check_cycles``: no input goes round a loop of ``use:`` rules.

A stage records each semantic problem (unknown vocabulary values, impl classes
outside the allow-list, dangling ``use:`` targets, bad templates, ...) with its
code (:mod:`dsv4sel.engine.codes`) where it finds it, at the ``file:line:column``
of the offending text; :func:`compile_files` raises one RuleError listing all
of them. Lowering the program to the evaluator's array is the next stage
(:mod:`dsv4sel.engine.lower`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ..errors import RuleError
from .clauses import rule_conditions, rule_outcome
from .codes import CODES
from .compilation import Compilation
from .load import LoadedFile
from .model import DEFAULT_TABLE, HitPolicy, Program, Rule, Table, request_table_name
from .profile import Profile
from .suggest import did_you_mean
from .values import RuleRef
from .vocabulary import merge_vocabulary


def declare_tables(ctx: Compilation) -> None:
    """The default decision's table and one table per backend, with their rules (in ``ctx.rules``)."""
    for f in ctx.files:
        kind = f.data.get("kind")
        if kind not in ("default", "backend"):
            continue
        first = ctx.copies.setdefault(f.source, f)
        if first is not f:  # one problem for a whole copied file, not one per backend and rule id
            ctx.error(f, ("kind",), "DSV313", f"this file is a copy of {first.file}: the same pack is loaded twice "
                      "(installed, and named with --rules or DSV4SEL_RULES_PATH?); drop one of them", key=True)
            continue
        table = _default_table(ctx, f) if kind == "default" else _backend_table(ctx, f)
        pack = ctx.packs.get(f.file, "dsv4sel")
        defaults = f.data.get("defaults") or {}
        for i, raw in enumerate(f.data["rules"]):
            _declare_rule(ctx, f, ("rules", i), raw, table, kind, pack, defaults)
        if kind == "backend" and "requested_by_name" in f.data:
            _declare_request_table(ctx, f, table, pack)


def _default_table(ctx: Compilation, f: LoadedFile) -> Table:
    """The one default-decision table: every `kind: default` file adds its rules to it."""
    if ctx.default_table is None:
        ctx.default_table = Table(DEFAULT_TABLE, (), HitPolicy(f.data["hit_policy"]), f.file, f.where(("rules",), key=True)[0])
    elif ctx.default_table.hit_policy != f.data["hit_policy"]:
        ctx.error(f, ("hit_policy",), "DSV309", f"the default decision's hit policy is "
                  f"{ctx.default_table.hit_policy!r} in {ctx.default_table.file}")
    return ctx.default_table


def _backend_table(ctx: Compilation, f: LoadedFile) -> Table:
    names = tuple(f.data["backends"])
    for i, name in enumerate(names):
        if name in ctx.declared_in:
            ctx.error(f, ("backends", i), "DSV308", f"backend {name} already has a table in "
                      f"{ctx.declared_in[name].file}; a pack adds backends, it cannot replace "
                      "another's table")
        ctx.declared_in.setdefault(name, f)
    table = Table(names[0] if len(names) == 1 else "|".join(names), names,
                  HitPolicy(f.data["hit_policy"]), f.file, f.where(("backends",), key=True)[0])
    if any(name not in ctx.tables for name in names):
        ctx.grew(f, ("backends",))
    for name in names:
        if name not in ctx.tables:
            ctx.tables[name] = table
            ctx.backend_order.append(name)
    return table


def _declare_rule(ctx: Compilation, f: LoadedFile, path: tuple, raw: dict, table: Table, kind: str, pack: str,
                  defaults: dict) -> None:
    line, _ = f.where(path)
    ref = RuleRef(raw["id"], f.file, line, pack)
    if raw.get("description"):
        ctx.descriptions[ref] = " ".join(str(raw["description"]).split())
    if raw["id"] in ctx.seen_ids:
        other = ctx.seen_ids[raw["id"]].ref
        ctx.error(f, path + ("id",), "DSV307", f"rule id {raw['id']!r} is already used at {other.location}")
    conditions = rule_conditions(ctx, f, path, raw)
    outcome = rule_outcome(ctx, f, path, raw, defaults, kind)
    if outcome is None:
        return
    if raw.get("override") and kind != "default":
        ctx.error(f, path + ("override",), "DSV309", "`override` applies to default-backend rules only; "
                  "a backend's table is owned by the file that declares it", key=True)
    rule = Rule(ref, table.name, len(table.rules), conditions, outcome, _acknowledged(ctx, f, path, raw))
    ctx.seen_ids.setdefault(raw["id"], rule)
    if kind == "default":
        ctx.default_entries.append((bool(raw.get("override")), ctx.pack_rank.setdefault(pack, len(ctx.pack_rank)),
                                    len(ctx.default_entries), rule))
    else:
        table.rules.append(rule)
    ctx.rules.append(rule)


def _declare_request_table(ctx: Compilation, f: LoadedFile, table: Table, pack: str) -> None:
    """The one-rule table a query naming one of ``table``'s backends meets first: it rejects with
    the file's ``requested_by_name:`` reason. A default rule's ``use:`` still reaches ``table``,
    so a backend the host builds by default but refuses by name is stated as such."""
    gate = Table(request_table_name(table.backends), table.backends, HitPolicy.FIRST, f.file,
                 f.where(("requested_by_name",), key=True)[0])
    path = ("requested_by_name",)
    raw = f.data["requested_by_name"]
    _declare_rule(ctx, f, path, raw, gate, "backend", pack, {})
    for name in table.backends:
        if ctx.tables.get(name) is table:  # a backend already declared elsewhere has its DSV308
            ctx.request_tables[name] = gate


#: The kinds of verifier findings a rule's ``acknowledge:`` may turn into warnings: those of its
#: own selected fields (layout, consistency, rewrite fixpoint, host class), found per rule.
ACKNOWLEDGEABLE = ("layout", "consistency", "fixpoint", "host")


def _acknowledged(ctx: Compilation, f: LoadedFile, path: tuple, raw: dict) -> tuple[tuple[str, str], ...]:
    """The rule's ``acknowledge:`` as ``(code, reason)`` pairs. Only the findings of a rule's
    own selection may be acknowledged (:data:`ACKNOWLEDGEABLE`); any other code is a problem."""
    written = raw.get("acknowledge") or {}
    allowed = [code for code, (kind, _) in CODES.items() if kind in ACKNOWLEDGEABLE]
    for code in written:
        if code not in allowed:
            ctx.error(f, path + ("acknowledge", code), "DSV309", f"{code} cannot be acknowledged: only the "
                      "findings of a rule's own selection can (" + ", ".join(allowed) + ")", key=True)
    return tuple(sorted(written.items()))


def order_defaults(ctx: Compilation) -> None:
    """The default decision's rules in the order they are tried: overrides first, the
    latest pack's first; then every other rule in load order."""
    entries = sorted(ctx.default_entries, key=lambda e: (0, -e[1], e[2]) if e[0] else (1, 0, e[2]))
    if ctx.default_table is None:
        if ctx.files and ctx.inputs:
            ctx.error(ctx.files[0], (), "DSV306", "no `kind: default` file: the default-backend decision is missing")
        ctx.default_table = Table(DEFAULT_TABLE, (), HitPolicy.FIRST, "<none>", 1)
        return
    table = ctx.default_table
    table.rules = [replace(r, index=i) for i, (*_, r) in enumerate(entries)]
    index_of = {id(r): i for i, (*_, r) in enumerate(entries)}
    ctx.rules = [table.rules[index_of[id(r)]] if id(r) in index_of else r for r in ctx.rules]


def link_uses(ctx: Compilation) -> None:
    """Every ``use: BACKEND`` names a backend that has a table."""
    for rule in ctx.rules:
        target = rule.outcome.target
        if rule.outcome.kind == "use" and target not in ctx.tables:
            f = ctx.file_of(rule.ref.file)
            index = rule.index if rule.table != DEFAULT_TABLE else _file_index(f, rule.ref.id)
            ctx.error(f, ("rules", index, "use"), "DSV311", f"`use: {target}` names a backend without a table"
                      + did_you_mean(str(target), ctx.tables))


def assemble(ctx: Compilation) -> None:
    """The :class:`Program` of what the stages before found."""
    assert ctx.default_table is not None  # order_defaults always sets one
    ctx.program = Program(ctx.inputs, ctx.default_table, ctx.tables, tuple(ctx.backend_order), ctx.rules,
                          ctx.allowed, tuple(f.file for f in ctx.files), ctx.profile, ctx.descriptions,
                          tuple(ctx.growth), ctx.request_tables)


def check_cycles(ctx: Compilation) -> None:
    """No input goes round a loop of backend tables' ``use:`` rules."""
    program = ctx.program
    assert program is not None
    edges: dict[str, set[str]] = {}
    for rule in program.rules:
        if rule.outcome.kind == "use" and rule.table != DEFAULT_TABLE:
            for b in program.tables[rule.table.split("|")[0]].backends:
                edges.setdefault(b, set()).add(str(rule.outcome.target))
    step = _use_step(program)
    for start in edges:
        looping = _loop_from(program, edges, start, step)
        if looping is not None:
            ctx.error(ctx.file_of(program.tables[start].file), ("backends",), "DSV312",
                      "`use:` chain loops: " + " -> ".join(looping))
            return


def _use_step(program: Program) -> Callable[[str, dict[str, str]], str | None]:
    """``step(backend, point)``: the backend ``point`` goes on to by ``backend``'s table's deciding
    rule (its ``use:`` target), or None. Remembered per table and the values of the inputs that
    table tests, so that the loop search asks each table once per distinct input it tells apart."""
    tested = {name: tuple(sorted({n for rule in table.rules for n, _ in rule.conditions}))
              for name, table in program.tables.items()}
    memo: dict[tuple, str | None] = {}

    def step(backend: str, point: dict[str, str]) -> str | None:
        key = (backend, *(point[n] for n in tested[backend]))
        if key not in memo:
            rule = program.tables[backend].decide(point)
            memo[key] = str(rule.outcome.target) if rule is not None and rule.outcome.kind == "use" else None
        return memo[key]
    return step


def _loop_from(program: Program, edges: dict[str, set[str]], start: str,
               step: Callable[[str, dict[str, str]], str | None]) -> tuple[str, ...] | None:
    """The backends an input visits round a loop of ``use:`` edges back to ``start``, or None."""
    stack: list[tuple[str, tuple[str, ...]]] = [(start, (start,))]
    seen: set[str] = set()
    while stack:
        node, trail = stack.pop()
        for nxt in edges.get(node, ()):
            if nxt == start:
                # The tables' use: graph has a loop; it is an error only if some
                # input actually goes round it (V4.0 -> V4.1 alias and V4.1 ->
                # V4.0 rules between the same tables never meet at one point).
                looping = _looping_input(program, trail, step)
                if looping is None:
                    continue
                return looping
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, trail + (nxt,)))
    return None


def _looping_input(program: Program, backends: tuple[str, ...],
                   step: Callable[[str, dict[str, str]], str | None]) -> tuple[str, ...] | None:
    """The backends an input visits round a loop, starting at one of
    ``backends``, or None when no input loops. Only the inputs that the tables an input can reach
    from there test are walked: those tables decide every other input alike."""
    reach, todo = set(backends), list(backends)
    while todo:  # the tables an input starting at `backends` can reach through `use:` rules
        for rule in program.tables[todo.pop()].rules:
            target = str(rule.outcome.target) if rule.outcome.kind == "use" else None
            if target is not None and target not in reach:
                reach.add(target)
                todo.append(target)
    tested = {name for backend in reach for rule in program.tables[backend].rules for name, _ in rule.conditions}
    for point in program.points(tested):
        for backend in backends:
            current: str | None = backend
            visited = [backend]
            while True:
                current = step(str(current), point)
                if current is None:
                    break
                if current in visited:
                    return tuple(visited) + (current,)
                visited.append(current)
    return None


def _file_index(f: LoadedFile, rule_id: str) -> int:
    for i, raw in enumerate(f.data.get("rules", [])):
        if raw.get("id") == rule_id:
            return i
    return 0


#: The compiler's stages, in order; each reads what the ones before it left in the Compilation.
STAGES: tuple[Callable[[Compilation], None], ...] = (
    merge_vocabulary, declare_tables, order_defaults, link_uses, assemble, check_cycles)


def compile_files(files: list[LoadedFile], *, allowed_impl_modules: tuple[str, ...], profile: Profile,
                  packs: dict[str, str] | None = None) -> Program:
    """Build a Program of ``profile``'s domain from loaded, schema-valid files;
    raise RuleError listing every semantic problem."""
    ctx = Compilation(files, allowed_impl_modules, packs or {}, profile)
    for stage in STAGES:
        stage(ctx)
    if ctx.problems:
        # one problem once: an impl named in `defaults:` is checked for every select rule of the file
        unique = dict.fromkeys(ctx.problems)
        raise RuleError(sorted(unique, key=lambda p: (p.file, p.line, p.column)))
    assert ctx.program is not None
    return ctx.program
