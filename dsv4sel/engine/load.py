"""Stage 1, load: YAML text -> plain data plus the position of every node.

YAML is untrusted input, so the loader promises, for any file:

- only the YAML core schema's tags (no ``!!python/...``), and YAML 1.2
  core-schema scalars, as editors and ``check-jsonschema`` read them:
  ``yes``/``on`` are strings, ``0o17``/``0x1f`` are integers, and an integer
  with a leading zero (``0400``: octal 256 in YAML 1.1, 400 in 1.2) is an
  error rather than a guess;
- duplicate mapping keys are errors (PyYAML silently keeps the last one);
- bounded work: anchors and aliases are allowed (the shipped rules use them
  for shared messages), but a file may expand to at most
  :data:`MAX_NODES` nodes, nest at most :data:`MAX_DEPTH` levels and hold
  integers of at most :data:`MAX_INT_DIGITS` digits; a recursive alias is an
  error. "Billion laughs" therefore stops after ``MAX_NODES`` nodes;
- no control characters: names and keys hold none at all, texts only
  newlines and tabs, so a rule file cannot drive the terminal that shows it;
- only regular files of at most :data:`MAX_FILE_BYTES` bytes are read (a
  FIFO or ``/dev/zero`` is refused without reading);
- every problem carries ``file:line:column``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from ..errors import Problem
from .text import control_character, escape, read_bounded

#: Limits on what one rule file may cost; the shipped files stay far below them.
MAX_FILE_BYTES = 1 << 20
MAX_NODES = 100_000
MAX_DEPTH = 64
MAX_INT_DIGITS = 12

if TYPE_CHECKING:
    from yaml import SafeLoader as _BaseLoader
else:
    try:  # the libyaml C parser is ~8x faster; the pure-Python one behaves the same
        _BaseLoader = yaml.CSafeLoader
    except AttributeError:  # pragma: no cover - depends on how PyYAML was built
        _BaseLoader = yaml.SafeLoader


class _CoreSchemaLoader(_BaseLoader):
    """A safe loader whose implicit tags follow the YAML 1.2 core schema."""


_CoreSchemaLoader.yaml_implicit_resolvers = {}
for _tag, _pattern, _first in (
    ("null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    ("float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
              r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+0123456789.")),
):
    _CoreSchemaLoader.add_implicit_resolver("tag:yaml.org,2002:" + _tag, re.compile(_pattern), _first)

_CORE_TAGS = {
    "tag:yaml.org,2002:" + t
    for t in ("str", "int", "float", "bool", "null", "map", "seq")
}


class _TooLarge(Exception):
    """Raised inside the node walk when a bound is exceeded; becomes one Problem."""

    def __init__(self, node: yaml.Node, message: str):
        self.node, self.message = node, message


class _BadScalar(Exception):
    """A scalar that is refused; becomes one Problem at the scalar, and loading goes on."""



def _is_merge_key(node: yaml.Node) -> bool:
    """A YAML merge key: tagged ``!!merge``, or a plain ``<<``, which YAML 1.1 readers (and users)
    take as one although the core schema this loader reads calls it an ordinary key; a quoted
    ``"<<"`` stays a key (a plain scalar's style is None, or "" from the C loader)."""
    return node.tag == "tag:yaml.org,2002:merge" or (
        isinstance(node, yaml.ScalarNode) and node.value == "<<" and not node.style)

def _scalar(node: yaml.ScalarNode) -> Any:
    """The value of a core-schema scalar node (the tag is already resolved)."""
    tag, text = node.tag.rsplit(":", 1)[-1], node.value
    if tag == "str":
        return text
    if tag == "null":
        return None
    if tag == "bool":
        return text.lower() == "true"
    if tag == "int":
        return _integer(text)
    if tag == "float":
        return _number(text)
    raise ValueError(f"unexpected tag {node.tag}")  # pragma: no cover - filtered by _CORE_TAGS


def _integer(text: str) -> int:
    digits = text.lstrip("+-")
    if len(digits) > MAX_INT_DIGITS:
        raise _BadScalar(f"integer {escape(text[:20])}... has more than {MAX_INT_DIGITS} digits; "
                         "rule files hold small integers (bytes per token, block sizes)")
    if digits.startswith(("0o", "0x")):
        return int(digits[2:], 8 if digits[1] == "o" else 16) * (-1 if text.startswith("-") else 1)
    if len(digits) > 1 and digits.startswith("0"):
        raise _BadScalar(f"integer {text} has a leading zero (YAML 1.1 reads it as octal, "
                         f"1.2 as decimal); write {int(digits)} or 0o{digits.lstrip('0')}")
    return int(text)


def _number(text: str) -> float:
    if len(text) > 64:
        raise _BadScalar(f"number {escape(text[:20])}... is too long")
    lowered = text.lower()
    if lowered.endswith(".inf"):
        return float("-inf" if lowered.startswith("-") else "inf")
    if lowered == ".nan":
        return float("nan")
    return float(text)


Path = tuple  # a path of mapping keys and sequence indices, as jsonschema reports it


@dataclass
class LoadedFile:
    """A parsed rule file.

    ``data`` is the document as dicts, lists and scalars. ``marks`` maps a
    path to the (line, column) of the value at that path; ``key_marks`` maps a
    mapping's path plus a key to the position of the key itself. ``nodes``
    counts the YAML nodes it expanded to (aliases counted each time), what
    loading, validating and compiling it cost.
    """

    file: str
    source: str
    data: Any
    nodes: int = 0
    marks: dict[Path, tuple[int, int]] = field(default_factory=dict)
    key_marks: dict[Path, tuple[int, int]] = field(default_factory=dict)

    def where(self, path: Path, *, key: bool = False) -> tuple[int, int]:
        """Best position for ``path``: the exact node, else its nearest parent."""
        path = tuple(path)
        if key and path in self.key_marks:
            return self.key_marks[path]
        while path and path not in self.marks:
            path = path[:-1]
        return self.marks.get(path, (1, 1))

    def problem(self, path: Path, code: str, message: str, *, key: bool = False) -> Problem:
        line, column = self.where(path, key=key)
        return Problem(self.file, line, column, message, code=code)


def _position(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def load_text(text: str, file: str) -> tuple[LoadedFile | None, list[Problem]]:
    """Parse ``text``; return the loaded file (None if unusable) and every problem found.

    Never raises for any ``text``: syntax errors and exceeded bounds (see the
    module docstring) come back as problems."""
    loader = _CoreSchemaLoader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        if mark and mark.index < len(text) and text[mark.index] == "\t":  # PyYAML: "cannot start any token"
            return None, [Problem(file, line, column, "a tab character: YAML indents with spaces only; "
                                  "replace the tab with spaces", code="DSV102")]
        return None, [Problem(file, line, column, f"YAML syntax error: {escape(str(exc.problem or exc))}", code="DSV102")]
    except yaml.YAMLError as exc:
        return None, [Problem(file, 1, 1, f"YAML error: {escape(' '.join(str(exc).split()))}", code="DSV102")]
    except RecursionError:  # the pure-Python composer recurses per nesting level
        return None, [Problem(file, 1, 1, f"the YAML nests deeper than {MAX_DEPTH} levels", code="DSV108")]
    finally:
        loader.dispose()
    if root is None:
        return None, [Problem(file, 1, 1, "the file is empty; a rule file needs at least `kind:`", code="DSV103")]

    loaded = LoadedFile(file=file, source=text, data=None)
    problems: list[Problem] = []
    produced = 0
    active: set[int] = set()  # ids of the nodes on the current path: an alias back to one is a cycle

    def located(node: yaml.Node, code: str, message: str) -> Problem:
        line, column = _position(node)
        return Problem(file, line, column, message, code=code)

    def enter(node: yaml.Node, path: Path, depth: int) -> bool:
        """Count ``node`` against the bounds (raising _TooLarge past one) and mark its place;
        False, with the problem recorded, when its tag is not plain YAML data."""
        nonlocal produced
        produced += 1
        if produced > MAX_NODES:
            raise _TooLarge(node, f"the file expands to more than {MAX_NODES} YAML nodes "
                                  "(aliases of aliases?); rule files are small")
        if depth > MAX_DEPTH:
            raise _TooLarge(node, f"the YAML nests deeper than {MAX_DEPTH} levels")
        if id(node) in active:
            raise _TooLarge(node, "a recursive alias: this node contains itself")
        loaded.marks.setdefault(path, _position(node))
        if node.tag not in _CORE_TAGS:
            problems.append(located(node, "DSV104", f"tag '{escape(node.tag)}' is not allowed: rule files are plain YAML data"))
            return False
        return True

    def scalar(node: yaml.ScalarNode, is_key: bool) -> Any:
        try:
            value = _scalar(node)
        except _BadScalar as exc:
            problems.append(located(node, "DSV107", str(exc)))
            return None
        if isinstance(value, str):
            bad = control_character(value, in_text=not is_key)
            if bad:
                problems.append(located(node, "DSV109", f"{'key' if is_key else 'string'} '{escape(value)}' holds "
                                              f"the control character '{escape(bad)}'"
                                              "; rule files hold printable text only"))
                return None
        return value

    def mapping(node: yaml.Node, path: Path, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if _is_merge_key(key_node):
                problems.append(located(key_node, "DSV105", "merge keys (<<) are not supported; "
                                                  "repeat the fields or use `defaults:`"))
                continue
            if not isinstance(key_node, yaml.ScalarNode):
                problems.append(located(key_node, "DSV107", "mapping keys must be plain scalars"))
                continue
            key = build(key_node, path + ("<key>",), depth + 1, is_key=True)
            if not isinstance(key, (str, int, bool)):
                if key is not None or key_node.tag.endswith(":null"):
                    problems.append(located(key_node, "DSV107", "mapping keys must be plain scalars"))
                continue
            key_line, key_col = _position(key_node)
            if key in out:
                first_line, _ = loaded.key_marks[path + (key,)]
                problems.append(Problem(file, key_line, key_col,
                                        f"duplicate key '{escape(str(key))}' (first defined on line {first_line})", code="DSV106"))
                continue
            loaded.key_marks[path + (key,)] = (key_line, key_col)
            out[key] = build(value_node, path + (key,), depth + 1)
        loaded.marks.pop(path + ("<key>",), None)
        return out

    # Three steps of one walk (bounds and tag, scalars, mappings), each under the complexity limit.
    def build(node: yaml.Node, path: Path, depth: int, is_key: bool = False) -> Any:
        if not enter(node, path, depth):
            return None
        if isinstance(node, yaml.ScalarNode):
            return scalar(node, is_key)
        active.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [build(item, path + (i,), depth + 1) for i, item in enumerate(node.value)]
            return mapping(node, path, depth)
        finally:
            active.discard(id(node))

    try:
        loaded.data = build(root, (), 0)
    except _TooLarge as exc:
        return None, [located(exc.node, "DSV108", exc.message)]
    loaded.nodes = produced
    return loaded, problems


def read_rule_file(path: str) -> str:
    """The text of the rule file at ``path``.

    Only a regular file of at most :data:`MAX_FILE_BYTES` bytes is read: a
    FIFO, a device or a directory is refused without blocking or reading.
    Raises OSError or ValueError with a message fit for a Problem."""
    data = read_bounded(path, MAX_FILE_BYTES, "a rule file", "rule files are regular *.yaml files")
    return data.decode("utf-8")


def load_file(path: str, display: str) -> tuple[LoadedFile | None, list[Problem]]:
    """Read and parse one rule file; ``display`` is the name used in messages."""
    try:
        text = read_rule_file(path)
    except OSError as exc:
        return None, [Problem(display, 1, 1, f"cannot read rule file: {escape(exc.strerror or str(exc))}", code="DSV101")]
    except UnicodeDecodeError as exc:
        before = exc.object[:exc.start]
        line, column = before.count(b"\n") + 1, exc.start - (before.rfind(b"\n") + 1) + 1
        return None, [Problem(display, line, column, f"the file is not UTF-8 text ({exc.reason}); "
                                                     "save it as UTF-8", code="DSV101")]
    except ValueError as exc:
        return None, [Problem(display, 1, 1, f"cannot read rule file: {exc}", code="DSV101")]
    return load_text(text, display)
