"""The per-host stage of ``dsv4sel check``: each shipped host translation over its host's space.

A host translation (:mod:`dsv4sel.translation`) maps a serving engine's own inputs onto the rules.
This stage takes every input of each translation's ``space`` through it and the rules under
check, and proves that each is decided exactly once: refused by one translation row or rule, or
selected by one rule whose ``hosts`` entry gives the host a class (and the settings the translation
requires) for the translation's release. Otherwise it
reports, located in the translation file:

* ``host-gap`` (DSV602, error): inputs the translation maps to no decision: no ``backend`` or
  ``kv_cache_dtype`` row holds, the kv-cache map lacks the value, or the query names something
  the rules do not declare (the rules would call the query invalid, not decide it);
* ``host-dead`` (DSV603, warning): a translation row that decides no input of the space.

The space is enumerated input by input (it is the host's, a few tens of thousands of inputs);
rejections are taken without their suggestions, which only a user's error needs.
"""
from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ..translation import holds
from .findings import ERROR, WARNING, Finding



@dataclass(frozen=True)
class HostCoverage:
    """How one translation decided its host's space: inputs, selected, refused."""

    host: str
    file: str
    inputs: int
    selected: int
    refused: int

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "file": self.file, "inputs": self.inputs, "selected": self.selected,
                "refused": self.refused}


def shipped_translations() -> list:
    """The translations of every host release in the host registry, loaded and checked."""
    from ..dsv4.host_registry import HOSTS
    from ..translation import load

    return [load(release.translation_path, release.display) for host in HOSTS.values() for release in host.releases]


class Outcomes:
    """The rules' outcome per query, without the suggestions a rejection would compute."""

    def __init__(self, rules):
        self.rules, self.memo = rules, {}

    def select(self, **q):
        key = (q["platform"], q["capability"], q["backend"], q["kv_cache_dtype"], q["model"],
               tuple(sorted(q["extra"].items())))
        hit = self.memo.get(key)
        if hit is None:
            query, notes = self.rules.normalize(**q)
            hit = self.memo[key] = self.rules.outcome(query, notes)
        if hit.__class__.__name__ == "Rejection":
            hit.suggestions = hit.suggestions or ()  # this memo's own Rejection: no suggestions wanted
            raise hit.error()
        return hit


def check_translation(translation, rules) -> tuple[HostCoverage, list[Finding]]:
    """Every input of ``translation``'s space through it and ``rules``.

    The walk is grouped, so that a host space of half a million inputs costs a second, not a
    minute: the translation's rows look at a few inputs only (those their ``when`` names, a
    kv-cache map's input and the layout variable); for each combination of those, which rows
    fire is fixed, and every other input passes into the query unchanged or not at all. So each
    combination is decided once as rows, and its remaining inputs are counted by a compiled-table
    lookup per input; every outcome row is then checked once (a selection through the
    translation's ``build`` with a real query). An input whose query the table does not hold
    goes the slow way (``select``), whose error names what the rules cannot read."""
    walk = _Walk(translation, rules)
    for partial, free in walk.partials():
        walk.decide_group(partial, free)
    findings = list(_gap_findings(translation, walk.gaps)) + list(_dead_findings(translation, walk.used))
    return HostCoverage(translation.host, translation.file, walk.inputs, walk.selected, walk.refused), findings


#: a group of fewer inputs than this is decided input by input (grouping would cost more)
_GROUPED = 16


class _Walk:
    """The state of one grouped walk (see :func:`check_translation`)."""

    def __init__(self, translation, rules) -> None:
        self.t, self.rules, self.outcomes = translation, rules, Outcomes(rules)
        self.used: collections.Counter = collections.Counter()
        #: (what, detail) -> [the first input, how many]
        self.gaps: dict[tuple[str, str], list] = {}
        self.selected = self.refused = self.inputs = 0
        self.row_verdict: dict[tuple, tuple[bool, str | None]] = {}
        rows = [*translation.refuse, *translation.backend, *translation.kv_cache_dtype,
                *(r for rs in translation.extra.values() for r in rs)]
        looked = {name for r in rows for name in r.when} | {"platform", "kv_layout_env"}
        if any(not _is_from(r.value) for r in translation.kv_cache_dtype):
            looked.add("kv_cache_dtype")  # a map row reads the input's value
        self.looked = [n for n in translation.space if n in looked]
        self.free = [n for n in translation.space if n not in looked]

    def partials(self):
        """``(partial point over the looked-at inputs, [(name, values)] of the free ones)``."""
        import itertools

        space = self.t.space
        for platform in space["platform"]:
            def axis(name, platform=platform):
                v = space[name]
                return [platform] if name == "platform" else (v.get(platform, [None]) if isinstance(v, dict) else v)
            free = [(n, axis(n)) for n in self.free]
            for combo in itertools.product(*(axis(n) for n in self.looked)):
                yield {k: v for k, v in zip(self.looked, combo) if v is not None}, free

    def decide_group(self, partial: dict, free: list) -> None:
        """Decide every input of one group: ``partial`` (the looked-at inputs) with each
        combination of the ``free`` inputs."""
        count = math.prod(len(values) for _, values in free)
        if count < _GROUPED:
            for point in _points(partial, free):
                self._one(point)
            return
        self.inputs += count
        if self._refused_group(partial, count):
            return
        sample = {**partial, **{n: values[0] for n, values in free if values[0] is not None}}
        if not self._rows_of_group(sample, count):
            return
        key, vary, ignored = self._template(partial, free)
        counts, keys, outside = self.rules.tally(key, **vary)
        if outside:  # queries outside the compiled space: the slow way says why, input by input
            for point in _points(partial, free):
                if self.rules.index(self._key(self.t.query(point))) is None:
                    self._slow(point)
        for idx, n in counts.items():
            self._count_row(idx, n * ignored, sample, keys[idx])

    def _refused_group(self, partial: dict, count: int) -> bool:
        """Whether a ``refuse`` row takes the whole group (counted)."""
        for row in self.t.refuse:
            if holds(row.when, partial):
                self.refused += count
                self.used[row.where] += count
                return True
        return False

    def _rows_of_group(self, sample: dict, count: int) -> bool:
        """Count the translation rows that fire for the group; False (a gap) when none maps it."""
        rows_used: list[str] = []
        try:
            self.t.query(sample, rows_used)
        except (StopIteration, KeyError) as exc:
            self._gap("map", type(exc).__name__ + (f" {exc}" if str(exc) else ""), sample, count)
            return False
        for where in rows_used:
            self.used[where] += count
        return True

    def _template(self, partial: dict, free: list) -> tuple[tuple, dict[str, tuple], int]:
        """The group's lookup key (a constant per key input, None where a free input passes
        through), the free inputs varied at those positions, and how many combinations of the
        free inputs the query drops (each outcome counts that many times). An input the query
        leaves out takes its default, as select() gives it."""
        sources = self._sources(partial, free)
        axes = dict(free)
        key, vary = [], {}
        for name in self.rules.key_inputs:
            is_free, value = sources[name] if name in sources else (False, self.rules.default_of(name))
            key.append(None if is_free else value)
            if is_free:
                vary[name] = tuple(axes[value])
        passed = {sources[n][1] for n in vary}
        ignored = math.prod(len(values) for n, values in free if n not in passed)
        return tuple(key), vary, ignored

    def _sources(self, partial: dict, free: list) -> dict[str, tuple[bool, Any]]:
        """Per query input: ``(True, free input name)`` when it passes a free input through, else
        ``(False, value)``; found by asking the translation at two points of the group."""
        names = [n for n, _ in free]
        sample = {**partial, **{n: values[0] for n, values in free if values[0] is not None}}
        base = self._flat(self.t.query(sample))
        out: dict[str, tuple[bool, Any]] = {k: (False, v) for k, v in base.items()}
        for from_row in self._from_rows(sample):
            if from_row[1] in names:
                out[from_row[0]] = (True, from_row[1])
        return out

    def _from_rows(self, point: dict) -> list[tuple[str, str]]:
        """``(query input, host input)`` for each row firing at ``point`` that passes a value through."""
        out = []
        hit = next(r for r in self.t.backend if holds(r.when, point))
        if _is_from(hit.value):
            out.append(("backend", hit.value.input))
        hit = next(r for r in self.t.kv_cache_dtype if holds(r.when, point))
        if _is_from(hit.value):
            out.append(("kv_cache_dtype", hit.value.input))
        for name, rows in self.t.extra.items():
            hit = next((r for r in rows if holds(r.when, point)), None)
            if hit is not None and _is_from(hit.value):
                out.append((name, hit.value.input))
        for key in ("platform", "capability", "model"):  # the query keywords a point gives as they are
            out.append((key, key))
        return out

    @staticmethod
    def _flat(q: dict) -> dict[str, Any]:
        return {**q["extra"], **{k: v for k, v in q.items() if k != "extra"}}

    def _key(self, q: dict) -> tuple:
        flat = self._flat(q)
        return tuple(flat.get(n) for n in self.rules.key_inputs)

    def _count_row(self, idx: int, n: int, sample: dict, key: tuple) -> None:
        layout_env = sample.get("kv_layout_env")
        verdict = self.row_verdict.get((idx, layout_env))
        if verdict is None:  # decided the full way once per outcome row (and layout variable)
            verdict = self.row_verdict[(idx, layout_env)] = self._verdict(sample, key)
        selected, origin = verdict
        if selected:
            self.selected += n
        else:
            self.refused += n
        self.used[origin] += n

    def _verdict(self, sample: dict, key: tuple) -> tuple[bool, str | None]:
        """Whether the outcome at ``key`` is built (the translation's ``build``), and the
        ``file:line`` of what decided it; ``sample`` fills the refusal texts' other fields."""
        from ..errors import SelectionError

        flat = dict(zip(self.rules.key_inputs, key))
        q = {k: flat.pop(k) for k in ("platform", "capability", "model", "backend", "kv_cache_dtype")}
        try:
            decision = self.t.build(sample, self.outcomes.select(**q, extra=flat))
        except SelectionError as exc:
            return False, getattr(exc, "origin", None)
        return True, decision.selection.rule.location

    def _one(self, point: dict) -> None:
        """One input the full way, as a user's would be decided."""
        from ..errors import InvalidQuery, SelectionError

        self.inputs += 1
        rows: list[str] = []
        try:
            decision = self.t.decide(point, self.outcomes, used=rows)
        except InvalidQuery as exc:
            self._gap("query", str(exc).split("\n")[0], point, 1)
        except SelectionError as exc:
            self.refused += 1
            self.used[getattr(exc, "origin", None)] += 1
        except (StopIteration, KeyError) as exc:
            self._gap("map", type(exc).__name__ + (f" {exc}" if str(exc) else ""), point, 1)
        else:
            self.selected += 1
            self.used[decision.selection.rule.location] += 1
        for where in rows:
            self.used[where] += 1

    def _slow(self, point: dict) -> None:
        from ..errors import InvalidQuery, SelectionError

        try:
            self.t.decide(point, self.outcomes)
        except InvalidQuery as exc:
            self._gap("query", str(exc).split("\n")[0], point, 1)
        except SelectionError:
            self.refused += 1
        else:
            self.selected += 1

    def _gap(self, what: str, detail: str, point: dict, count: int) -> None:
        self.gaps.setdefault((what, detail), [point, 0])[1] += count


def _points(partial: dict, free: list):
    """Every input of a group: ``partial`` with each combination of the ``free`` inputs."""
    names = [n for n, _ in free]
    for combo in itertools.product(*(values for _, values in free)):
        yield {**partial, **{n: c for n, c in zip(names, combo) if c is not None}}


def _is_from(value) -> bool:
    from ..translation import From

    return isinstance(value, From)


def _line(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line)


def _gap_findings(translation, gaps) -> Iterator[Finding]:
    from .findings import Input

    for (what, detail), (first, count) in gaps.items():
        why = (f"the rules cannot read the query it maps to ({detail})" if what == "query"
               else f"no translation row maps it ({detail})")
        yield Finding(ERROR, "host-gap",
                      f"{count} {translation.host_label} input{'s' if count > 1 else ''} of the host "
                      f"space {'are' if count > 1 else 'is'} not decided: {why}; e.g. "
                      + " ".join(f"{k}={v}" for k, v in first.items()),
                      translation.file, 1, None, counterexample=Input(tuple(first.items())), count=count)


def _dead_findings(translation, used) -> Iterator[Finding]:
    rows = [*translation.refuse, *translation.backend, *translation.kv_cache_dtype,
            *(r for rows in translation.extra.values() for r in rows)]
    for row in rows:
        if not used[row.where]:
            file, line = _line(row.where)
            yield Finding(WARNING, "host-dead",
                          f"this {translation.host_label} translation row decides no input of the host space "
                          "(earlier rows take all it matches, or it matches none); remove it or fix its `when`",
                          file, line, None)


def with_host_spaces(report, rules):
    """``report`` with this stage's findings and per-host coverage added (``Report.hosts``); a
    translation file that does not load is its problems, as findings."""
    import dataclasses

    from ..errors import RuleError
    from .verifier import _finding, _sorted

    try:
        translations = shipped_translations()
    except RuleError as exc:
        return dataclasses.replace(report, findings=_sorted([*report.findings, *map(_finding, exc.problems)]))
    found, hosts = list(report.findings), []
    for translation in translations:
        coverage, findings = check_translation(translation, rules)
        hosts.append(coverage)
        found.extend(findings)
    return dataclasses.replace(report, findings=_sorted(found), hosts=tuple(hosts))
