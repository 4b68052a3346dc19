"""Host translations: a serving engine's own inputs in the shipped rules' words, declared as data.

A translation file (``kind: host-translation``, schema ``dsv4sel/schema/translation.schema.json``)
states, for one host (its distribution name) and its versions:

- ``space``: every input of the host's decision space and its values (an input given per
  platform holds only on those platforms);
- ``refuse``: host inputs refused before the rules are asked (first row whose ``when`` holds),
  each with its fix id and reason;
- ``backend``, ``kv_cache_dtype``, ``extra``: the dsv4sel query an unrefused input means (a row
  gives a value, a map, or ``from``: the input's own value, for a host that uses the rules' words);
- ``settings``: the settings every selection must give the host (optional), in display order;
- ``unbuildable``: the refusal of a selection whose rule names the host no class for the
  translation's ``versions`` (or not the ``settings``);
- ``kv_layout_env`` (optional): the refusal of a host layout variable that asks for another record
  than the decided one (``accepts``: the values that leave the decision in force).

:func:`load` reads a file through the guarded YAML loader and the schema, then checks every name
against the space; every problem is a :class:`~dsv4sel.errors.Problem` at ``file:line:column``
(:class:`~dsv4sel.errors.RuleError` holds them all). :meth:`Translation.decide` decides one input
and returns a :class:`HostDecision` or raises :class:`~dsv4sel.errors.SelectionError` whose
``origin`` is the ``file:line`` of the deciding row (or rule). Nothing here names a host.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from typing import Any

from .errors import Problem, RuleError, SelectionError
from .record import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .dsv4.selection import Selection

SCHEMA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "schema", "translation.schema.json")
#: the dsv4sel query keywords a translation fills (the rest of its extra inputs go to ``extra``)
QUERY_KEYS = ("platform", "capability", "model")


class HostDecision(Frozen):
    """What the host must be told (``settings``), the class it then builds, and the dsv4sel
    selection that decided (its rule is ``selection.rule``)."""

    __slots__ = ("cls", "settings", "selection")  # noqa: RUF023  field order is the constructor's
    cls: str
    settings: dict[str, Any]
    selection: Selection


class From(Frozen):
    """A row's value that is the host input's own value (``from: INPUT``)."""

    __slots__ = ("input",)
    input: str


class Row(Frozen):
    """One row of a translation table: its condition, its payload and its ``file:line``."""

    __slots__ = ("when", "value", "where")  # noqa: RUF023  field order is the constructor's
    when: dict[str, tuple[str, ...]]
    value: Any
    where: str


def holds(when: dict[str, tuple[str, ...]], point: dict) -> bool:
    """Whether ``point`` meets ``when`` (input -> values; values all "!x": any value but those)."""
    for name, wants in when.items():
        excluded, values = _condition(wants)
        try:
            found = point.get(name) in values
        except TypeError:  # an unhashable value is none of the strings a condition names
            found = False
        if found is excluded:
            return False
    return True


@functools.lru_cache(maxsize=None)
def _condition(wants: tuple[str, ...]) -> tuple[bool, frozenset[str]]:
    """``(excluded, values)`` of one input's condition: the values it names, and whether they are
    the ones it excludes (all written "!x"). Remembered: a translation has a few dozen, asked for
    every input a host decides."""
    if all(w.startswith("!") for w in wants):
        return True, frozenset(w[1:] for w in wants)
    return False, frozenset(wants)


class Translation:
    """A loaded, checked translation file (see the module docstring)."""

    def __init__(self, file: str, data: dict, rows: dict[str, tuple[Row, ...]], where: dict[str, str]):
        self.file = file
        self.host: str = data["host"]
        #: how messages name the host ("SGLang")
        self.host_label: str = data["name"]
        self.versions: str = data["versions"]
        self.space: dict[str, Any] = data["space"]
        self.refuse = rows["refuse"]
        self.backend = rows["backend"]
        self.kv_cache_dtype = rows["kv_cache_dtype"]
        self.extra = {name: rows["extra." + name] for name in data["extra"]}
        self.unbuildable: dict[str, str] = data["unbuildable"]
        #: the settings every selection must give the host, in display order (may be empty)
        self.settings: tuple[str, ...] = tuple(data.get("settings", ()))
        self.kv_layout_env: dict[str, Any] | None = data.get("kv_layout_env")
        #: ``file:line`` of the top-level sections (``unbuildable``, ``kv_layout_env``)
        self.where = where

    def points(self) -> Iterator[dict[str, str]]:
        """Every input of the host space, in a fixed order (platform-scoped inputs per platform)."""
        import itertools

        names = list(self.space)
        for platform in self.space["platform"]:
            axes = []
            for name in names:
                v = self.space[name]
                if name == "platform":
                    axes.append([platform])
                elif isinstance(v, dict):
                    axes.append(v.get(platform, [None]))
                else:
                    axes.append(v)
            for combo in itertools.product(*axes):
                yield {k: val for k, val in zip(names, combo) if val is not None}

    def _refusal(self, point: dict, text: str, fix: str, origin: str) -> SelectionError:
        tag = f" [dsv4sel {self.host_label} fix {fix}]" if fix != "-" else ""
        return SelectionError(f"DeepSeek-V4 attention in {self.host_label}: {text}{tag}", origin=origin)

    def query(self, point: dict, used: list[str] | None = None) -> dict[str, Any]:
        """The keywords of :func:`dsv4sel.select` an unrefused input means (``used`` collects the
        ``file:line`` of each row that gave a part of it). StopIteration: no ``backend`` or
        ``kv_cache_dtype`` row holds; KeyError: the kv-cache map lacks the input's value."""
        hits = [next(r for r in self.backend if holds(r.when, point)),
                next(r for r in self.kv_cache_dtype if holds(r.when, point))]
        q: dict[str, Any] = {k: point[k] for k in QUERY_KEYS}
        q["backend"] = _value(hits[0], point)
        kv = hits[1].value
        q["kv_cache_dtype"] = point[kv.input] if isinstance(kv, From) else kv[point["kv_cache_dtype"]]
        extra = {}
        for name, rows in self.extra.items():
            hit = next((r for r in rows if holds(r.when, point)), None)
            if hit is not None:
                extra[name] = _value(hit, point)
                hits.append(hit)
        q["extra"] = extra
        if used is not None:
            used.extend(r.where for r in hits)
        return q

    def check_point(self, point: dict) -> None:
        """Raise one SelectionError naming the first input of ``point`` whose value is outside the
        host space (with the valid values and the nearest one); a point inside it passes."""
        platform = point.get("platform")
        for name, declared in self.space.items():
            valid = declared.get(platform, ()) if isinstance(declared, dict) else declared
            if not valid and name not in point:
                continue
            value = point.get(name)
            if value not in valid:
                from .engine.suggest import close_matches
                from .engine.text import escape

                near = close_matches(str(value), list(valid))
                raise SelectionError(
                    f"DeepSeek-V4 attention in {self.host_label}: {name} {escape(repr(value))} is not one dsv4sel "
                    f"decides for{' on ' + str(platform) if isinstance(declared, dict) else ''}"
                    f"{'; did you mean ' + repr(near[0]) + '?' if near else ''} (it decides "
                    f"{', '.join(map(str, valid)) or 'none there'}; {self.file})", origin=self.file)

    def refuse_point(self, point: dict) -> None:
        """Raise the refusal of the first ``refuse`` row that holds at ``point``, if one does."""
        for row in self.refuse:
            if holds(row.when, point):
                raise self._refusal(point, row.value["reason"].format(**point), row.value["fix"], row.where)

    def decide(self, point: dict, rules, used: list[str] | None = None, role: str | None = None) -> HostDecision:
        """Decide one host input with ``rules`` (a RuleSet, or anything with its ``select``); raises
        SelectionError (``origin``: the ``file:line`` of the row or rule that refused). ``used``:
        see :meth:`query`. ``role``: the process's role under disaggregation, given to rules that
        declare it (:mod:`dsv4sel.dsv4.roles`)."""
        from .dsv4.roles import with_role

        self.refuse_point(point)
        query = with_role(self.query(point, used), getattr(rules, "plain_inputs", ()), role)
        sel = rules.select(**query)  # its SelectionError's origin is the deciding rule
        return self.build(point, sel)

    def entry(self, sel: Selection) -> tuple[str, dict[str, Any]] | None:
        """``(class, settings)`` of ``sel``'s host entry for this translation's release range
        (the entry whose versions share a release with it), or None."""
        from .engine.hosts import described, overlap

        for host, cls, versions, settings in described(sel.hosts, sel.host_settings):
            if host == self.host and overlap(versions, self.versions) is not None:
                return cls, settings
        return None

    def build(self, point: dict, sel: Selection) -> HostDecision:
        """What the host builds for ``sel``, or the translation's refusal of it."""
        entry = self.entry(sel)
        fields = {**point, "backend": sel.backend, "layout": sel.layout, "location": sel.rule.location}
        if entry is None or any(k not in entry[1] for k in self.settings):
            u = self.unbuildable
            raise self._refusal(point, u["reason"].format(**fields), u["fix"], self.where["unbuildable"])
        built, settings = entry
        env, rule = self.kv_layout_env, point.get("kv_layout_env", "unset")
        if env is not None and rule not in env["accepts"] and rule != settings["kv_layout"]:
            raise self._refusal(point, env["reason"].format(**{**fields, "layout": settings["kv_layout"]}),
                                env["fix"], self.where["kv_layout_env"])
        ordered = {**{k: settings[k] for k in self.settings}, **settings}
        return HostDecision(built, ordered, sel)


def _names_problems(loaded, data: dict) -> list[Problem]:
    """Every ``when`` input and value, and every kv-cache map key, must be in the space."""
    space = data["space"]

    def values_of(name):
        v = space[name]
        return set(v) if isinstance(v, list) else {x for vals in v.values() for x in vals}
    problems = []

    def check_when(path, when):
        for name, want in when.items():
            if name not in space:
                problems.append(loaded.problem(path + ("when", name), "DSV601",
                                               f"`when` names {name!r}, which the translation's space does not "
                                               f"declare (it has {', '.join(space)})", key=True))
                continue
            for i, w in enumerate(want if isinstance(want, list) else [want]):
                if w.lstrip("!") not in values_of(name):
                    at = path + ("when", name) + ((i,) if isinstance(want, list) else ())
                    problems.append(loaded.problem(at, "DSV601", f"{name} value {w.lstrip('!')!r} is not in the "
                                                                 f"translation's space ({', '.join(sorted(values_of(name)))})"))
    def check_from(path, row):
        if "from" in row and row["from"] not in space:
            problems.append(loaded.problem(path + ("from",), "DSV601",
                                           f"`from` names {row['from']!r}, which the translation's space does not "
                                           f"declare (it has {', '.join(space)})"))
    for section in ("refuse", "backend", "kv_cache_dtype"):
        for i, row in enumerate(data[section]):
            check_when((section, i), row["when"])
            check_from((section, i), row)
    for name, rows in data["extra"].items():
        for i, row in enumerate(rows):
            check_when(("extra", name, i), row["when"])
            check_from(("extra", name, i), row)
    for i, row in enumerate(data["kv_cache_dtype"]):
        for key in row.get("map", ()):
            if key not in values_of("kv_cache_dtype"):
                problems.append(loaded.problem(("kv_cache_dtype", i, "map", key), "DSV601",
                                               f"kv_cache_dtype {key!r} is not in the translation's space", key=True))
    return problems


def load(path: str, display: str | None = None) -> Translation:
    """Read, validate and check the translation file at ``path``; raises RuleError with every
    problem at ``file:line:column``."""
    from .engine.load import load_file
    from .engine.validate import schema_errors

    display = display or path
    loaded, problems = load_file(path, display)
    if loaded is None or problems:
        raise RuleError(problems)
    schema = [loaded.problem(p, code, message, key=at_key) for p, code, message, at_key in schema_errors(loaded, SCHEMA)]
    if schema:
        raise RuleError(sorted(schema, key=lambda p: (p.line, p.column or 0)))
    data = loaded.data
    names = _names_problems(loaded, data)
    if names:
        raise RuleError(names)

    def at(path):
        line, _ = loaded.where(path)
        return f"{display}:{line}"
    rows: dict[str, tuple[Row, ...]] = {}
    for section, payload in (("refuse", None), ("backend", "backend"), ("kv_cache_dtype", "map")):
        rows[section] = tuple(
            Row(_norm(r["when"]), r if payload is None else _payload(r, payload), at((section, i)))
            for i, r in enumerate(data[section]))
    for name, extra_rows in data["extra"].items():
        rows["extra." + name] = tuple(Row(_norm(r["when"]), _payload(r, "value"), at(("extra", name, i)))
                                      for i, r in enumerate(extra_rows))
    where = {k: at((k,)) for k in ("unbuildable", "kv_layout_env") if k in data}
    return Translation(display, data, rows, where)


def _norm(when: dict) -> dict[str, tuple[str, ...]]:
    return {k: tuple(v) if isinstance(v, list) else (v,) for k, v in when.items()}


def _payload(row: dict, key: str) -> Any:
    return From(row["from"]) if "from" in row else row[key]


def _value(row: Row, point: dict) -> Any:
    return point[row.value.input] if isinstance(row.value, From) else row.value
