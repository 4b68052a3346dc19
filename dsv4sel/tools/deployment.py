"""A deployment file (``dsv4sel fleet DEPLOYMENT.yaml``): the sides that exchange KV bytes.

::

    model: deepseek_v4_1            # default for every side; a side may override it
    sides:
      prefill: {engine: vllm, version: "0.33.0", platform: cuda, capability: "9.0", disaggregation: prefill}
      decode:  {engine: vllm, version: "0.33.0", platform: cuda, capability: "10.0",
                attention_backend: FLASHMLA_SPARSE_DSV41, disaggregation: decode}

A side names its ``engine`` (vllm, sglang), ``version`` and ``platform``, and may name
``capability``, ``attention_backend``, ``kv_cache_dtype``, ``model``, ``disaggregation``
(prefill, decode), ``env`` (the engine environment variables that decide), ``decided_by``
(``engine``: this side runs without dsv4sel; ``dsv4sel``), ``checkpoint`` (the model's local path,
for the record: not part of the KV contract) and any other input its rule set declares
(``mega_attn: available``). The file is read like a rule file (safe YAML, duplicate keys
refused, every node located) and checked against ``schema/deployment.schema.json``; every problem
is a :class:`~dsv4sel.errors.Problem` at ``file:line:column`` with its code, all of them in one
:class:`DeploymentError`. What the sides' rule sets make of the values is checked when the sides
are decided (:mod:`dsv4sel.tools.fleet`), at the same locations (:meth:`Side.where`).
"""

from __future__ import annotations

import os

from ..errors import Problem
from ..record import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SCHEMA_PATH = os.path.join(os.path.dirname(os.path.dirname(__file__)), "schema", "deployment.schema.json")
#: The side keys that are not inputs of a rule set.
SIDE_KEYS = ("engine", "version", "model", "disaggregation", "env", "decided_by", "checkpoint")


class DeploymentError(ValueError):
    """A deployment file that cannot be used; ``problems`` locates each problem, with its code."""

    def __init__(self, problems):
        self.problems = tuple(problems)
        count = len(self.problems)
        super().__init__(f"{count} problem{'s' if count != 1 else ''} in the deployment file:\n"
                         + "\n".join(f"  {p}" for p in self.problems))


class Side(Frozen):
    """One side of a deployment, as the file gives it. ``inputs`` are its rule-set inputs as given
    (``platform``, ``capability``, ``attention_backend``, ``kv_cache_dtype``, ``mega_attn``...),
    ``env`` its environment variables; ``marks`` the ``(line, column)`` of each key
    (``env.NAME`` for a variable)."""

    __slots__ = ("name", "engine", "version", "model", "inputs", "env", "disaggregation", "decided_by",
                 "checkpoint", "file", "marks")
    name: str
    engine: str
    version: str
    model: str | None
    inputs: tuple[tuple[str, str], ...]
    env: tuple[tuple[str, str], ...]
    disaggregation: str | None
    decided_by: str | None
    #: the model's local path on this side, for the record (not part of the KV contract)
    checkpoint: str | None
    file: str
    marks: tuple[tuple[str, tuple[int, int]], ...]

    def get(self, key: str) -> str | None:
        """An input as given (``attention_backend``, ``kv_cache_dtype``...) or None."""
        return dict(self.inputs).get(key)

    def where(self, key: str | None = None) -> tuple[int, int]:
        """The ``(line, column)`` of ``key`` (``env.NAME`` for a variable), else of the side."""
        marks = dict(self.marks)
        return marks.get(key or "", marks[""]) if key else marks[""]

    def problem(self, key: str | None, code: str, message: str) -> Problem:
        line, column = self.where(key)
        return Problem(self.file, line, column, f"side {self.name}: {message}", code=code)


class Deployment(Frozen):
    """A loaded deployment: its file's display name, default model and sides in file order."""

    __slots__ = ("file", "model", "sides", "description")
    file: str
    model: str | None
    sides: tuple[Side, ...]
    description: str | None


def _display(path: str) -> str:
    from ..engine.text import escape

    rel = os.path.relpath(path)
    return escape(path if rel.startswith("..") else rel)


def _schema_problems(loaded) -> list[Problem]:
    from ..engine.hints import quote_hint
    from ..engine.validate import schema_errors

    problems = []
    for path, code, message, at_key in schema_errors(loaded, SCHEMA_PATH):
        if "'string'" in message:
            hint = quote_hint(loaded, path)
            message, code = message + hint, ("DSV202" if hint else code)
        problems.append(loaded.problem(path, code, message, key=at_key))
    return sorted(dict.fromkeys(problems), key=lambda p: (p.line, p.column or 0))


def _side(loaded, name: str, raw: dict[str, Any]) -> Side:
    marks = {"": loaded.where(("sides", name), key=True)}
    for key in raw:
        marks[key] = loaded.where(("sides", name, key))
    for var in raw.get("env", {}):
        marks[f"env.{var}"] = loaded.where(("sides", name, "env", var))
    inputs = tuple((k, v) for k, v in raw.items() if k not in SIDE_KEYS)
    return Side(name, raw["engine"], raw["version"], raw.get("model"), inputs, tuple(raw.get("env", {}).items()),
                raw.get("disaggregation"), raw.get("decided_by"), raw.get("checkpoint"), loaded.file,
                tuple(marks.items()))


def load_deployment(path: str) -> Deployment:
    """Read and check the deployment file at ``path``; raises :class:`DeploymentError` listing every
    problem (YAML ``DSV1xx``, schema ``DSV2xx``), each at its ``file:line:column``."""
    from ..engine.load import load_file

    display = _display(os.fsdecode(path))
    if os.path.isdir(path):
        raise DeploymentError([Problem(display, 1, 1, "a directory, not a deployment file", code="DSV101")])
    loaded, problems = load_file(path, display)
    if loaded is None or problems:
        raise DeploymentError(problems)
    if not isinstance(loaded.data, dict) or loaded.data.get("kind", "deployment") != "deployment":
        kind = loaded.data.get("kind") if isinstance(loaded.data, dict) else None
        if kind is not None:
            raise DeploymentError([loaded.problem(("kind",), "DSV201", f"not a deployment file: kind is {kind!r}; "
                                                  "`dsv4sel fleet` reads `kind: deployment` (or no kind)")])
    schema = _schema_problems(loaded)
    if schema:
        raise DeploymentError(schema)
    data = loaded.data
    sides = tuple(_side(loaded, name, raw) for name, raw in data["sides"].items())
    return Deployment(display, data.get("model"), sides, data.get("description"))
