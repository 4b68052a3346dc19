"""The per-host stage of ``dsv4sel check``: each shipped host translation over its host's space.

A host translation (:mod:`dsv4sel.translation`) maps a serving engine's own inputs onto the rules.
This stage takes every input of each translation's ``space`` through it and the rules under
check, and proves that each is decided exactly once: refused by one translation row or rule, or
selected by one rule whose ``hosts`` entry gives the host a class and settings. Otherwise it
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
import glob
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .findings import ERROR, WARNING, Finding

#: where the shipped translations live: one YAML file per host, next to its plugin
SHIPPED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "*_plugin", "*.yaml")


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
    """The translations shipped with dsv4sel's plugins, loaded and checked."""
    from ..translation import load

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [load(path, os.path.relpath(path, os.path.dirname(root))) for path in sorted(glob.glob(SHIPPED))]


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
    """Every input of ``translation``'s space through it and ``rules``."""
    from ..errors import InvalidQuery, SelectionError

    outcomes = Outcomes(rules)
    used: collections.Counter = collections.Counter()
    gaps: dict[tuple[str, str], list] = {}
    selected = refused = inputs = 0
    for point in translation.points():
        inputs += 1
        rows: list[str] = []
        try:
            decision = translation.decide(point, outcomes, used=rows)
        except InvalidQuery as exc:
            gaps.setdefault(("query", str(exc).split("\n")[0]), []).append(point)
        except SelectionError as exc:
            refused += 1
            used[getattr(exc, "origin", None)] += 1
        except (StopIteration, KeyError) as exc:
            gaps.setdefault(("map", type(exc).__name__ + (f" {exc}" if str(exc) else "")), []).append(point)
        else:
            selected += 1
            used[decision.selection.rule.location] += 1
        for where in rows:
            used[where] += 1
    findings = list(_gap_findings(translation, gaps)) + list(_dead_findings(translation, used))
    return HostCoverage(translation.host, translation.file, inputs, selected, refused), findings


def _line(where: str) -> tuple[str, int]:
    file, _, line = where.rpartition(":")
    return file, int(line)


def _gap_findings(translation, gaps) -> Iterator[Finding]:
    from .findings import Input

    for (what, detail), points in gaps.items():
        first = points[0]
        why = (f"the rules cannot read the query it maps to ({detail})" if what == "query"
               else f"no translation row maps it ({detail})")
        yield Finding(ERROR, "host-gap",
                      f"{len(points)} {translation.host_label} input{'s' if len(points) > 1 else ''} of the host "
                      f"space {'are' if len(points) > 1 else 'is'} not decided: {why}; e.g. "
                      + " ".join(f"{k}={v}" for k, v in first.items()),
                      translation.file, 1, None, counterexample=Input(tuple(first.items())), count=len(points))


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
