"""Rule tests as data: ``kind: tests`` files of expected decisions (``dsv4sel test``).

A test file lists ``cases``; each has a ``query`` (the keyword arguments of
:func:`dsv4sel.select`, pack inputs included) and an ``expect``: a subset of
the Selection's fields (``backend``, ``impl``, ``layout``, ``cache_dtype``,
``torch_dtype``, ``bytes_per_token``, ``block_size``, ``rewrites``, ``rule``
as the deciding rule's id), or ``reject: true`` with an optional
``reason_contains`` (and ``rule``)::

    kind: tests
    cases:
      - name: hopper-auto
        query: {platform: cuda, capability: "9.0", kv_cache_dtype: auto}
        expect: {backend: FLASHMLA_SPARSE_DSV4, layout: fp8_ds_mla, rewrites: {cache_dtype: fp8_ds_mla}}
      - query: {platform: cuda, capability: "9.0", kv_cache_dtype: bfloat16}
        expect: {reject: true, reason_contains: fp8_ds_mla}

Files are loaded like rule files (safe YAML, duplicate keys refused, every
node located) and validated against ``schema/tests.schema.json``.
:func:`run_tests` runs every case and reports, besides the failures, which
rules of the rule set no case reached (rule coverage): a :class:`TestReport`
value, rendered by :mod:`dsv4sel.cli.render.test`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, cast

from ..dsv4.profile import PROFILE
from ..errors import InvalidQuery, Problem, SelectionError
from ..engine.locations import location
from ..engine.values import RuleRef

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schema", "tests.schema.json")
TEST_SUFFIXES = (".yaml", ".yml")
#: what a case may expect of a selection: the backend, the profile's select fields, rewrites and rule
SELECTION_KEYS = ("backend", *PROFILE.field_names, "rewrites", "rule")


class TestFileError(ValueError):
    """Test files that cannot be used (unreadable, invalid YAML, not matching
    the schema); ``problems`` locates each one."""

    def __init__(self, problems):
        self.problems = tuple(problems)
        count = len(self.problems)
        super().__init__(f"{count} problem{'s' if count != 1 else ''} in the test files:\n"
                         + "\n".join(f"  {p}" for p in self.problems))


@dataclass(frozen=True)
class Case:
    """One expected decision, located at its ``file:line:column``."""

    file: str
    line: int
    column: int
    index: int
    name: str
    query: tuple[tuple[str, Any], ...]
    expect: tuple[tuple[str, Any], ...]
    #: expect key -> (line, column) of that key
    marks: tuple[tuple[str, tuple[int, int]], ...] = ()

    def where(self, key: str | None = None) -> tuple[int, int]:
        return dict(self.marks).get(key, (self.line, self.column)) if key else (self.line, self.column)


@dataclass(frozen=True)
class Failure:
    """One expectation a case did not meet."""

    field: str  # an expect key, or "outcome" (a selection where a rejection was expected, or back)
    expected: Any
    got: Any
    message: str
    line: int
    column: int


@dataclass(frozen=True)
class CaseResult:
    case: Case
    failures: tuple[Failure, ...]
    outcome: dict[str, Any]
    reached: tuple[RuleRef, ...] = ()

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass(frozen=True)
class RuleHits:
    rule: RuleRef
    cases: int
    in_scope: bool


@dataclass(frozen=True)
class TestReport:
    files: tuple[str, ...]
    results: tuple[CaseResult, ...]
    rules: tuple[RuleHits, ...]
    scope: str = "all rules"

    @property
    def ok(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failed(self) -> tuple[CaseResult, ...]:
        return tuple(r for r in self.results if not r.passed)

    @property
    def unreached(self) -> tuple[RuleRef, ...]:
        return tuple(h.rule for h in self.rules if h.in_scope and not h.cases)

    @property
    def scoped(self) -> tuple[RuleHits, ...]:
        return tuple(h for h in self.rules if h.in_scope)

    def to_dict(self) -> dict[str, Any]:
        scoped = self.scoped
        return {
            "version": 1,
            "ok": self.ok,
            "files": list(self.files),
            "summary": {"cases": len(self.results), "passed": len(self.results) - len(self.failed),
                        "failed": len(self.failed)},
            "cases": [{
                "file": r.case.file, "line": r.case.line, "column": r.case.column, "name": r.case.name,
                "status": "pass" if r.passed else "fail",
                "query": dict(r.case.query), "expect": dict(r.case.expect), "outcome": r.outcome,
                "failures": [{"field": f.field, "expected": f.expected, "got": f.got, "message": f.message,
                              "line": f.line, "column": f.column} for f in r.failures],
            } for r in self.results],
            "coverage": {
                "scope": self.scope,
                "rules": len(scoped),
                "reached": sum(1 for h in scoped if h.cases),
                "unreached": [{"id": r.id, "file": r.file, "line": r.line, "location": r.location,
                               "pack": r.pack} for r in self.unreached],
                "by_rule": [{"id": h.rule.id, "file": h.rule.file, "line": h.rule.line, "pack": h.rule.pack,
                             "cases": h.cases, "in_scope": h.in_scope} for h in self.rules],
            },
        }


# ------------------------------------------------------------------ loading

def _display(path: str) -> str:
    """A test file's name in messages, control characters (a newline too) escaped:
    a file name is as untrusted as the file."""
    from ..engine.text import escape

    rel = os.path.relpath(path)
    return escape(path if rel.startswith("..") else rel)


def find_test_files(paths) -> tuple[list[str], list[Problem]]:
    """The test files named by ``paths``: files as given, directories searched
    recursively for ``*.yaml``/``*.yml`` files whose ``kind`` is ``tests``.
    Returns (files, problems): a missing path, or a directory without test
    files, is a problem."""
    files: list[str] = []
    problems: list[Problem] = []
    for path in paths:
        path = os.fsdecode(path)
        if os.path.isdir(path):
            found = []
            for root, dirs, names in os.walk(path):
                dirs[:] = sorted(d for d in dirs if not d.startswith("."))
                for n in sorted(names):
                    if n.endswith(TEST_SUFFIXES) and not n.startswith(".") and _looks_like_tests(
                            os.path.join(root, n)):
                        found.append(os.path.join(root, n))
            if not found:
                problems.append(Problem(_display(path), 1, 1, "no test files (YAML files with `kind: tests`) "
                                        "in this directory", code="DSV502"))
            files.extend(found)
        elif os.path.exists(path):
            files.append(path)
        else:
            problems.append(Problem(_display(path), 1, 1, "no such file or directory", code="DSV101"))
    return list(dict.fromkeys(files)), problems


def _looks_like_tests(path: str) -> bool:
    """A quick look for a top-level ``kind: tests`` line (directories mix rule and test files)."""
    from ..engine.load import read_rule_file  # the guarded reader: a FIFO or /dev/zero is refused

    try:
        text = read_rule_file(path)
    except (OSError, ValueError):  # UnicodeDecodeError too
        return True  # let the loader report it
    return any(line.split("#")[0].strip().replace("'", "").replace('"', "") == "kind: tests"
               for line in text.splitlines())


def _mixed_expect(data, path: tuple) -> str | None:
    """The message for an ``expect`` that mixes ``reject: true`` with selection fields."""
    if len(path) < 3 or path[0] != "cases" or path[2] != "expect":
        return None
    try:
        expect = data["cases"][path[1]]["expect"]
    except (KeyError, IndexError, TypeError):
        return None
    if not isinstance(expect, dict) or "reject" not in expect:
        return None
    fields = [k for k in expect if k in SELECTION_KEYS and k != "rule"]
    if not fields:
        return None
    return (f"$.cases[{path[1]}].expect: `reject: true` cannot be combined with selection fields "
            f"({', '.join(fields)}): a case expects either a selection or a rejection (with `reason_contains`, "
            "`rule`)")


def load_cases(paths) -> tuple[list[Case], tuple[str, ...]]:
    """Load and validate the test files named by ``paths``; return their cases
    and the files' display names. Raises :class:`TestFileError` listing every
    problem (all files are read before it is raised)."""
    from ..engine.hints import quote_hint
    from ..engine.load import load_file
    from ..engine.validate import schema_errors

    files, problems = find_test_files(paths)
    cases: list[Case] = []
    displays = []
    for path in files:
        display = _display(path)
        displays.append(display)
        loaded, found = load_file(path, display)
        problems.extend(found)
        if loaded is None or found:
            continue
        if isinstance(loaded.data, dict) and loaded.data.get("kind") != "tests":
            kind = loaded.data.get("kind")
            problems.append(loaded.problem(("kind",), "DSV501", f"not a test file: kind is {kind!r}, and `dsv4sel test` "
                                           "runs `kind: tests` files (rule files go to --rules)"))
            continue
        schema = []
        for path_, code, message, at_key in schema_errors(loaded, SCHEMA_PATH):
            mixed = _mixed_expect(loaded.data, path_)
            if mixed:
                path_, code, message, at_key = path_[:3], "DSV201", mixed, False
            if "'string'" in message:
                hint = quote_hint(loaded, path_)
                message, code = message + hint, ("DSV202" if hint else code)
            schema.append(loaded.problem(path_, code, message, key=at_key))
        if schema:
            problems.extend(sorted(dict.fromkeys(schema), key=lambda p: (p.line, p.column)))
            continue
        for i, raw in enumerate(loaded.data["cases"]):
            line, column = loaded.where(("cases", i))
            marks = tuple((key, loaded.where(("cases", i, "expect", key), key=True)) for key in raw["expect"])
            cases.append(Case(display, line, column, i, str(raw.get("name") or f"#{i + 1}"),
                              tuple(raw["query"].items()), tuple(raw["expect"].items()), marks))
    if problems:
        raise TestFileError(problems)
    return cases, tuple(displays)


# ------------------------------------------------------------------ running

def _selection_value(selection, key: str) -> Any:
    if key == "rule":
        return selection.rule.id
    if key == "rewrites":
        return dict(selection.rewrites)
    return selection.fields()[key]


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}" if value else "{} (none)"
    return str(value)


def _describe_selection(sel) -> str:
    return f"{sel.backend} with {sel.layout}, {sel.bytes_per_token} B/token (rule {sel.rule.id}, {location(sel.rule)})"


def run_case(rules, case: Case) -> CaseResult:
    """Run one case against ``rules`` (a RuleSet) through :func:`dsv4sel.select`."""
    from .. import select

    try:
        selection = select(rules=rules, **dict(case.query))
    except SelectionError as exc:
        return _rejected_case(case, exc)
    return _selected_case(case, selection)


def _rejected_case(case: Case, exc: SelectionError) -> CaseResult:
    """The result of a case whose query was rejected (or invalid)."""
    rule = exc.rule
    # the rule set raises with its own RuleRefs; errors.py, below the engine, types them structurally
    reached = cast("tuple[RuleRef, ...]", exc.path)
    outcome = {"status": "rejected", "message": str(exc),
               "rule": None if rule is None else {"id": rule.id, "location": rule.location}}
    if rule is not None:
        by = f" by rule {rule.id} ({location(rule)})"
    else:  # an input outside the vocabulary, or one no rule decides (a gap, not the query's fault)
        by = " (an invalid query)" if isinstance(exc, InvalidQuery) else " (no rule decides it: a gap)"
    reason = exc.reason
    if rule is not None and reason.endswith(f" [rule {rule.id} at {rule.location}]"):
        reason = reason[: -len(f" [rule {rule.id} at {rule.location}]")]
    got = f"a rejection{by}: {reason}"
    return CaseResult(case, tuple(_rejection_failures(case, exc, got)), outcome, reached)


def _rejection_failures(case: Case, exc: SelectionError, got: str) -> list[Failure]:
    """What a rejection (described by ``got``) does not do that the case expects."""
    expect = dict(case.expect)
    rule = exc.rule
    failures = []
    if not expect.get("reject"):
        line, column = case.where("backend" if "backend" in expect else None)
        wanted = ", ".join(f"{k} {_show(v)}" for k, v in expect.items())
        failures.append(Failure("outcome", "selection", "rejection",
                                f"expected a selection ({wanted}), got {got}", line, column))
        return failures
    text = expect.get("reason_contains")
    if text is not None and text not in str(exc):
        line, column = case.where("reason_contains")
        failures.append(Failure("reason_contains", text, str(exc),
                                f"expected the reason to contain {text!r}, got {got}", line, column))
    want_rule = expect.get("rule")
    if want_rule is not None and (rule is None or rule.id != want_rule):
        line, column = case.where("rule")
        failures.append(Failure("rule", want_rule, None if rule is None else rule.id,
                                f"expected rule {want_rule}, got {got}", line, column))
    return failures


def _selected_case(case: Case, selection) -> CaseResult:
    """The result of a case whose query selected ``selection``."""
    expect = dict(case.expect)
    outcome = {"status": "selected", **selection.as_dict()}
    failures = []
    if expect.get("reject"):
        line, column = case.where("reject")
        failures.append(Failure("outcome", "rejection", "selection",
                                f"expected a rejection, got a selection: {_describe_selection(selection)}",
                                line, column))
    else:
        for key in SELECTION_KEYS:
            if key not in expect:
                continue
            want, have = expect[key], _selection_value(selection, key)
            if want != have:
                line, column = case.where(key)
                rest = "" if key in ("backend", "rule") else f" from {_describe_selection(selection)}"
                if key == "rule":
                    rest = f" ({location(selection.rule)})"
                failures.append(Failure(key, want, have, f"expected {key} {_show(want)}, got {_show(have)}{rest}",
                                        line, column))
    return CaseResult(case, tuple(failures), outcome, tuple(selection.path))


def run_tests(rules, cases, *, files: tuple[str, ...] = (), scope: set[str] | None = None,
              scope_label: str = "all rules") -> TestReport:
    """Run ``cases`` against ``rules``; ``scope`` (rule file display names)
    limits which rules the coverage figures speak about (None: all)."""
    results = tuple(run_case(rules, case) for case in cases)
    hits: dict[RuleRef, int] = {}
    for result in results:
        for ref in dict.fromkeys(result.reached):
            hits[ref] = hits.get(ref, 0) + 1
    table = tuple(RuleHits(ref, hits.get(ref, 0), scope is None or ref.file in scope) for ref in rules.rules)
    return TestReport(tuple(files), results, table, scope_label)

