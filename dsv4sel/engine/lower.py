"""Stage 4, lower: a :class:`~dsv4sel.engine.model.Program` -> the compiled form.

:func:`to_table` produces the plain data (dicts, tuples, str, int, bytes)
that :class:`~dsv4sel.engine.ruleset.CompiledRules` loads, from memory or from the
marshal cache; the array's format is :mod:`dsv4sel.engine.artifact`'s. See
``docs/compiled-form.md`` for how it is built and what it costs.
"""

from __future__ import annotations

from typing import Any

from . import artifact
from ..errors import Problem, RuleError
from .flow import Flow
from .model import Program, render, template_fields
from .ruleset import COMPILED_FORMAT, MAX_ROWS
from .space import Space

#: The most bytes of text (messages, reasons, string fields) the distinct
#: outcome rows of a compiled form may hold together; it is what every
#: start reads. The shipped rules hold about 0.2 MB.
MAX_TEXT_BYTES = 4 << 20
#: The most bytes of text the compiler may render in all, rows that turn out
#: identical included: a message is rendered once per region its
#: placeholders split the space into, so this bounds the compile time.
MAX_RENDERED_BYTES = 64 << 20


def _too_large(program: Program, message: str, code: str) -> RuleError:
    """One RuleError at the pack declaration that last grew the space (a
    pack's file, not the shipped rules'), or at the default decision's file
    when no pack grew it."""
    if program.growth:
        file, line, column = program.growth[-1]
    else:
        file, line, column = program.default_table.file, program.default_table.line, 1
    return RuleError([Problem(file, line, column, message, code=code)])


def to_table(program: Program) -> dict[str, Any]:
    """The compiled form of ``program`` that :class:`~dsv4sel.engine.ruleset.CompiledRules` loads, as plain
    data (dicts, tuples, str, int, bytes) for memory or marshal.

    Built from the same exact machinery as ``dsv4sel check``: the chain
    of tables is walked cube by cube (:class:`dsv4sel.engine.flow.Flow`), each
    deciding rule's win regions are split only by the inputs its texts
    name (``{kv_cache_dtype}``...), and each region is painted into the
    array at once (:func:`dsv4sel.engine.artifact.paint`). The cost grows with
    the number of regions, not of points. Raises RuleError when the space
    is larger than the compiled form holds."""
    space = Space(program.inputs)
    layout = artifact.Layout.for_space(space, program.backends)
    if layout.size > artifact.MAX_INPUTS:
        raise _too_large(program, (
            f"the decision space has {layout.points:,} points x {len(layout.backends)} backend choices "
            f"= {layout.size:,} inputs; the compiled form holds at most {artifact.MAX_INPUTS:,}. "
            "Declare fewer input values, or split the vocabulary into rule sets loaded separately"), "DSV314")
    profile = program.profile
    painter = _Painter(program, layout)
    flow = Flow(program, space, needs=lambda rule: True)
    # the backends a query may name and get: a backend whose table serves only the inputs a
    # default rule routes there (`requested_by_name:`) is not one of them
    selectable: set[str] = set()
    for backend_index, backend in enumerate(layout.backends):
        for event in flow.walk(backend):
            painter.paint_event(event, space, backend_index, backend)
            if backend is not None and _selects_named(event, backend):
                selectable.add(backend)
    ids, outcomes = painter.ids, painter.outcomes
    table = {**layout.as_data(), "typecode": ids.typecode, "ids": ids.tobytes()}
    return {
        "format": COMPILED_FORMAT,
        "key": profile.key,
        "fields": profile.field_names,
        "inputs": [(d.name, d.values, d.by, d.scoped, d.default, d.fallback, d.probe, d.aliases)
                   for d in program.inputs.values()],
        "backends": program.backends,
        "selectable": tuple(b for b in program.backends if b in selectable),
        "rules": [(r.ref.id, r.ref.file, r.ref.line, r.ref.pack, r.table) for r in program.rules],
        "outcomes": [artifact.stored(o) for o in outcomes],
        "table": table,
        "allowed": program.allowed_impl_modules,
        "sources": program.sources,
        "descriptions": tuple(program.descriptions.get(r.ref) for r in program.rules),
    }

class _Painter:
    """Paints the array one flow event at a time, each distinct outcome row stored once,
    within the compiled form's bounds on rows and text."""

    def __init__(self, program: Program, layout: artifact.Layout):
        self.profile = program.profile
        self.layout = layout
        self.select_row = artifact.select_row_type(self.profile.field_names)
        self.rule_index = {id(rule): i for i, rule in enumerate(program.rules)}
        self.outcomes: list[artifact.Row] = []
        self.outcome_ids: dict[tuple, int] = {}
        self.ids = artifact.new_array(layout, "H")
        self.stored_budget = MAX_TEXT_BYTES
        self.rendered_budget = MAX_RENDERED_BYTES

    def paint_event(self, event, space: Space, backend_index: int, backend: str | None) -> None:
        if event.kind == "gap":
            path = tuple(self.rule_index[id(r)] for r in event.path)
            self.store(artifact.GapRow(("gap", event.label, event.table.name, path)), event.box, backend_index,
                       event.path[-1] if event.path else None)
        elif event.kind == "decide":
            rules = (*event.path, event.rule)
            labels = _labels(backend, rules)
            path = tuple(self.rule_index[id(r)] for r in rules)
            for region in event.scan.regions.get(event.position, ()):
                for values, box in space.split_by(region, _template_inputs(rules, self.profile)):
                    row = self.rendered(_row(rules, labels, path, values, self.profile, self.select_row),
                                        event.rule)
                    self.store(row, box, backend_index, event.rule)
        elif event.kind in ("dangling", "cycle"):  # pragma: no cover - the builder refuses both
            raise AssertionError(f"a {event.kind} use chain reached the compiled form")

    def store(self, item: artifact.Row, box, backend_index: int, rule) -> None:
        oid = self.outcome_ids.get(item)
        if oid is None:
            if len(self.outcomes) >= MAX_ROWS:
                raise _bound(rule, f"the rules decide more than {MAX_ROWS:,} distinct outcomes (each rendering "
                             "of a rule's texts is one)")
            self.stored_budget -= _text_bytes(item)
            if self.stored_budget < 0:
                raise _bound(rule, f"the distinct outcomes hold more than {MAX_TEXT_BYTES:,} bytes of rendered "
                             "text (messages, reasons, fields)")
            oid = self.outcome_ids[item] = len(self.outcomes)
            self.outcomes.append(item)
        artifact.paint(self.ids, self.layout, box, backend_index, oid)

    def rendered(self, item: artifact.Row, rule) -> artifact.Row:
        self.rendered_budget -= _text_bytes(item)
        if self.rendered_budget < 0:
            raise _bound(rule, f"rendering the rules' texts once per region their placeholders split the space "
                         f"into takes more than {MAX_RENDERED_BYTES:,} bytes")
        return item


def _bound(rule, what: str) -> RuleError:
    """The RuleError for a compiled form past one of its bounds, at the rule whose outcome crossed it."""
    file, line = (rule.ref.file, rule.ref.line) if rule is not None else ("<rules>", 1)
    return RuleError([Problem(file, line, 1, (
        f"{what}: the compiled form holds at most that, and every start would read it. Shorten the "
        "messages (an alias repeated in a message list repeats its text), or name fewer inputs in "
        "{placeholders}: each input named splits the rule's outcome once per value"), code="DSV316")])


def _text_bytes(item: tuple) -> int:
    """The bytes of text a rendered outcome row holds (strings, and the texts of its messages)."""
    total = 0
    for value in item:
        if value.__class__ is str:
            total += len(value)
        elif value.__class__ is tuple:
            for part in value:
                if part.__class__ is tuple:
                    total += sum(len(x) for x in part if x.__class__ is str)
    return total


def _selects_named(event, backend: str) -> bool:
    """Whether flow ``event`` of a query naming ``backend`` selects ``backend`` itself."""
    return (event.kind == "decide" and event.rule.outcome.kind == "select"
            and _labels(backend, (*event.path, event.rule))[-1] == backend)


def _labels(backend: str | None, rules: tuple) -> tuple:
    """The backend whose table each rule of a chain belongs to."""
    labels, current = [], backend
    for rule in rules:
        labels.append(current)
        if rule.outcome.kind == "use":
            current = rule.outcome.target
    return tuple(labels)

def _template_inputs(rules: tuple, profile) -> tuple[str, ...]:
    """The inputs a chain's rendered texts depend on: its ``{placeholders}``,
    and the input a rewritten field restates (``Profile.restates``), since a
    rewrite to that input's own value changes nothing and is dropped."""
    names: dict[str, None] = {}
    for rule in rules:
        outcome = rule.outcome
        texts = [text for _, text in outcome.messages]
        if outcome.kind == "reject":
            texts.append(outcome.reason)
        elif outcome.kind == "select":
            for key, value in outcome.fields:
                if isinstance(value, str):
                    texts.append(value)
                elif key == "rewrites":
                    names.update(dict.fromkeys(i for f, i in profile.restates if f in value))
        for text in texts:
            names.update(dict.fromkeys(template_fields(text)))
    names.pop("backend", None)
    return tuple(names)

def _row(rules: tuple, labels: tuple, path: tuple, values: dict[str, str], profile,
         select_row: type[artifact.SelectRow]) -> artifact.Row:
    """The outcome row of a chain, rendered with ``values`` (see ``Program.resolve``)."""
    messages: list[tuple[str, str]] = []
    for rule, label in zip(rules, labels):
        point = dict(values, backend=label or "")
        messages.extend((level, render(text, point)) for level, text in rule.outcome.messages)
    last, label = rules[-1], labels[-1]
    point = dict(values, backend=label or "")
    if last.outcome.kind == "reject":
        return artifact.RejectRow(("reject", label, render(last.outcome.reason, point), path, tuple(messages)))
    f: dict[str, Any] = {k: render(v, point) if isinstance(v, str) else v for k, v in last.outcome.fields}
    restated = dict(profile.restates)
    rewrites = tuple(sorted((k, v) for k, v in f.get("rewrites", {}).items()
                            if not (k in restated and v == values.get(restated[k]))))
    return select_row(("select", label, *(f[name] for name in profile.field_names), rewrites, tuple(messages),
                       path, tuple(f.get("hosts", ())), tuple(f.get("host_settings", ()))))
