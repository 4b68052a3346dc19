"""The compiled program, as data: inputs, outcomes, rules, tables, hit policies.

:mod:`dsv4sel.engine.compile` builds a :class:`Program` from loaded rule files;
:mod:`dsv4sel.engine.lower` turns it into the compiled array the evaluator reads;
:mod:`dsv4sel.check.verifier` checks it. ``Program.resolve`` decides one point by
walking the tables rule by rule: the specification the compiled array is
tested against (``tests/engine/test_compiled_form.py``).
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field
from dataclasses import field as dataclass_field  # Outcome has a method named field
from enum import Enum
from typing import Any, Iterable, Iterator, Literal

from .profile import Profile
from .values import RuleRef

DEFAULT_TABLE = "<default>"


def request_table_name(backends: tuple[str, ...]) -> str:
    """The name of the table a query naming one of ``backends`` meets first (``requested_by_name:``)."""
    return "|".join(backends) + " (named)"


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
    #: other spellings of values: (alias, value) pairs, e.g. ("H100", "9.0")
    aliases: tuple[tuple[str, str], ...] = ()

    def values_for(self, point: dict[str, str]) -> tuple[str, ...]:
        if self.scoped is None:
            return self.values
        return dict(self.scoped).get(point[str(self.by)], ())


@dataclass(frozen=True)
class Outcome:
    """What a rule decides: ``select`` (fields), ``use`` (target backend) or ``reject`` (reason)."""

    kind: Literal["select", "use", "reject"]
    fields: tuple[tuple[str, Any], ...] = ()
    target: str | None = None
    reason: str | None = None
    messages: tuple[tuple[str, str], ...] = ()
    #: select fields taken from the file's ``defaults:``, each with where it is written there
    #: (``(field, (file, line, column))``), so that a problem of such a field is reported once,
    #: at ``defaults:``, not at every rule that inherits it. Not part of the outcome's identity.
    inherited: tuple[tuple[str, tuple[str, int, int]], ...] = dataclass_field(default=(), compare=False)

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
    #: ``(code, reason)``: verifier findings of this rule reported as warnings naming the reason
    #: (the rule's ``acknowledge:``)
    acknowledged: tuple[tuple[str, str], ...] = ()

    def matches(self, point: dict[str, str]) -> bool:
        return all(point[name] in allowed for name, allowed in self.conditions)


class HitPolicy(str, Enum):
    """A table's DMN hit policy, with what it means for evaluation and for
    ``dsv4sel check``. A ``str`` enum: it compares equal to its YAML spelling."""

    #: at most one rule may match any input; an overlap is an error
    UNIQUE = "unique"
    #: rules are tried in file order and the first match wins
    FIRST = "first"

    def decide(self, rules, point: dict[str, str]):
        """The rule that decides ``point``. Under ``unique`` an overlap is a
        finding of ``check``; evaluation then takes the first matching rule,
        so that it stays deterministic either way."""
        for rule in rules:
            if rule.matches(point):
                return rule
        return None

    @property
    def overlap_is_error(self) -> bool:
        """Whether two rules matching one input is a finding (under ``first`` it is how the table works)."""
        return self is HitPolicy.UNIQUE

    @property
    def can_shadow(self) -> bool:
        """Whether an earlier rule can take every input of a later one."""
        return self is HitPolicy.FIRST

    @property
    def redundancy_is_error(self) -> bool:
        """Whether two overlapping rules with the same outcome are an error
        (``unique``) or only worth a warning (``first``)."""
        return self is HitPolicy.UNIQUE


@dataclass
class Table:
    """A decision table: the default-backend decision or the table of some backends."""

    name: str
    backends: tuple[str, ...]
    hit_policy: HitPolicy
    file: str
    line: int
    rules: list[Rule] = field(default_factory=list)

    def __post_init__(self):
        self.hit_policy = HitPolicy(self.hit_policy)  # the YAML spelling is accepted too

    def matching(self, point: dict[str, str]) -> list[Rule]:
        return [rule for rule in self.rules if rule.matches(point)]

    def decide(self, point: dict[str, str]) -> Rule | None:
        """The rule that decides ``point`` under this table's hit policy."""
        return self.hit_policy.decide(self.rules, point)


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
    #: what the inputs and select fields mean (the domain the rules were compiled for)
    profile: Profile
    #: rule -> its `description:` (rules without one are absent)
    descriptions: dict[RuleRef, str] = field(default_factory=dict)
    #: ``(file, line, column)`` of each pack declaration that grew the space (new
    #: values, new backends), in load order: where a too-large space is reported
    growth: tuple[tuple[str, int, int], ...] = ()
    #: backend -> the table consulted when a query names it (a backend file's
    #: ``requested_by_name:``, one reject rule); its own table then decides only
    #: the inputs a ``use:`` routes there
    request_tables: dict[str, Table] = field(default_factory=dict)

    def points(self, only: Iterable[str] | None = None) -> Iterator[dict[str, str]]:
        """Every point of the decision space except the backend, in vocabulary order; with
        ``only``, every point of those inputs (and the inputs their values are scoped by), which
        is every distinct input of anything that reads no other input."""
        names = list(self.inputs)
        if only is not None:
            wanted = set(only)
            for name in reversed(names):  # a scoping input comes before the inputs it scopes
                decl = self.inputs[name]
                if name in wanted and decl.by is not None:
                    wanted.add(decl.by)
            names = [n for n in names if n in wanted]

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

    def table_for(self, backend: str | None) -> Table:
        """The table that decides a query requesting ``backend`` (None: the platform default)."""
        if backend is None:
            return self.default_table
        return self.request_tables.get(backend) or self.tables[backend]

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
                current = str(outcome.target)
                table = self.tables[current]
                continue
            if outcome.kind == "reject":
                return Resolution("reject", current, tuple(path), table.name,
                                  reason=render(str(outcome.reason), values), messages=tuple(messages))
            fields = tuple((k, render(v, values) if isinstance(v, str) else v) for k, v in outcome.fields)
            return Resolution("select", current, tuple(path), table.name, fields=fields,
                              messages=tuple(messages))


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
