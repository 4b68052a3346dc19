"""Stage 2, validate: check each loaded file against the JSON Schema.

jsonschema works on plain data and knows no line numbers; every error's
``absolute_path`` is mapped back to the YAML node it came from. All errors of
all files are reported, not just the first.
"""

from __future__ import annotations

import json
from functools import lru_cache

from ..errors import Problem
from .load import LoadedFile


@lru_cache(maxsize=4)
def validator(schema_path: str):
    """A jsonschema validator for the schema at ``schema_path``, with the rule
    files' strict integers and ECMA ``$``; built once per schema."""
    try:
        import jsonschema
    except ImportError as exc:
        from .hints import dependency_error

        raise dependency_error(exc, "jsonschema", "jsonschema") from exc

    with open(schema_path, encoding="utf-8") as fh:
        schema = json.load(fh)
    base = jsonschema.validators.validator_for(schema)
    base.check_schema(schema)
    cls = jsonschema.validators.extend(
        base,
        # JSON Schema counts 584.0 as an integer; a rule file's integer fields
        # must hold integers, or 584.0 would reach the Selection as a float
        type_checker=base.TYPE_CHECKER.redefine(
            "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool)),
        validators={"pattern": _ecma_pattern},
    )
    return cls(schema)


def _ecma_pattern(validator, pattern: str, instance, schema):
    """``pattern`` with ECMA-262 semantics for ``$``, as the schema's other
    readers (editors, check-jsonschema) apply it: the end of the string.
    Python's ``$`` also matches before a final newline, so ``"NAME\\n"``
    would pass ``^[A-Z]+$``."""
    import re

    from jsonschema.exceptions import ValidationError

    if not validator.is_type(instance, "string"):
        return
    anchored = pattern[:-1] + r"\Z" if pattern.endswith("$") and not pattern.endswith("\\$") else pattern
    if re.search(anchored, instance) is None:
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _wants_string(error) -> bool:
    """Whether ``error`` is a ``type`` error where the schema allows a string."""
    if error.validator != "type":
        return False
    allowed = error.validator_value
    return "string" in (allowed if isinstance(allowed, list) else [allowed])


def _describe(error) -> tuple[tuple, str, str, bool]:
    """Return (path, code, message, point_at_key) for one jsonschema error, choosing
    the most specific sub-error of oneOf/anyOf and pointing at offending keys. The
    code follows the failing keyword (jsonschema's ``error.validator``): ``DSV202``
    is the type error where a string belongs, which the caller confirms is an
    unquoted YAML scalar (else it is reported as ``DSV201``)."""
    from jsonschema.exceptions import best_match

    if error.context:
        error = best_match(error.context)
    path = tuple(error.absolute_path)
    label = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        # YAML keys may be integers or booleans (`1: a`) beside strings: ordered by their text
        extra = sorted((k for k in error.instance if k not in allowed), key=lambda k: (not isinstance(k, str), str(k)))
        if extra:
            from .suggest import close_matches

            close = close_matches(extra[0], sorted(allowed))
            hint = (f"; did you mean {close[0]!r}? Allowed" if close else "; allowed") + (
                f": {', '.join(sorted(allowed))}" if allowed else ": none")
            return path + (extra[0],), "DSV203", f"{label}: unknown field {extra[0]!r}{hint}", True
    if error.validator == "required":
        return path, "DSV204", f"{label}: {error.message}", False
    return path, "DSV202" if _wants_string(error) else "DSV201", f"{label}: {error.message}", False


def schema_errors(loaded: LoadedFile, schema_path: str):
    """``(path, code, message, at_key)`` for every violation of the schema at
    ``schema_path`` in ``loaded``, in document order."""
    for error in validator(schema_path).iter_errors(loaded.data):
        yield _describe(error)


def _guess_kind(data: dict) -> str:
    """The kind a rule file without ``kind:`` most likely is, from its keys."""
    if "backends" in data or "defaults" in data:
        return "backend"
    return "vocabulary" if "inputs" in data else "default"


def validate_file(loaded: LoadedFile, schema_path: str) -> list[Problem]:
    """Every violation of the rule schema at ``schema_path`` in ``loaded``, in document order."""
    from .hints import quote_hint

    if isinstance(loaded.data, dict) and loaded.data.get("kind") == "tests":
        return [loaded.problem(("kind",), "DSV501", "a `kind: tests` file among the rule files: `dsv4sel test PATH` runs "
                               "test files; keep them out of the directories given as rules")]
    if isinstance(loaded.data, dict) and "kind" not in loaded.data:
        # one problem, not one per branch of the schema's kinds that the file fails
        return [loaded.problem((), "DSV204", "the file has no `kind:`; a rule file starts with `kind: "
                               f"{_guess_kind(loaded.data)}`" + (" (or vocabulary, default)" if "backends" in loaded.data
                                                                  else " (vocabulary, default or backend)"))]
    problems = []
    for path, code, message, at_key in schema_errors(loaded, schema_path):
        if code == "DSV202":  # a string belongs here: a YAML number or boolean gets the hint to quote it
            hint = quote_hint(loaded, path)
            message, code = message + hint, ("DSV202" if hint else "DSV201")
        problems.append(loaded.problem(path, code, message, key=at_key))
    problems.sort(key=lambda p: (p.line, p.column))
    return problems
