"""Stage 1, load: YAML text -> plain data plus the position of every node.

YAML is untrusted input. Only the YAML core schema's tags are accepted (no
``!!python/...``), duplicate mapping keys are errors (PyYAML silently keeps the
last one), and every problem carries ``file:line:column``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import Problem

try:  # the libyaml C parser is ~8x faster; the pure-Python one behaves the same
    _Loader = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - depends on how PyYAML was built
    _Loader = yaml.SafeLoader

_CORE_TAGS = {
    "tag:yaml.org,2002:" + t
    for t in ("str", "int", "float", "bool", "null", "map", "seq")
}

Path = tuple  # a path of mapping keys and sequence indices, as jsonschema reports it


@dataclass
class LoadedFile:
    """A parsed rule file.

    ``data`` is the document as dicts, lists and scalars. ``marks`` maps a
    path to the (line, column) of the value at that path; ``key_marks`` maps a
    mapping's path plus a key to the position of the key itself.
    """

    file: str
    source: str
    data: Any
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

    def problem(self, path: Path, message: str, *, key: bool = False) -> Problem:
        line, column = self.where(path, key=key)
        return Problem(self.file, line, column, message)


def _position(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def load_text(text: str, file: str) -> tuple[LoadedFile | None, list[Problem]]:
    """Parse ``text``; return the loaded file (None if unusable) and every problem found."""
    problems: list[Problem] = []
    loader = _Loader(text)
    try:
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        return None, [Problem(file, line, column, f"YAML syntax error: {exc.problem or exc}")]
    except yaml.YAMLError as exc:
        return None, [Problem(file, 1, 1, f"YAML error: {exc}")]
    finally:
        loader.dispose()

    loaded = LoadedFile(file=file, source=text, data=None)
    if root is None:
        return None, [Problem(file, 1, 1, "the file is empty; a rule file needs at least `kind:`")]
    constructor = yaml.SafeLoader("")  # used only to turn scalar nodes into int/bool/str

    def build(node: yaml.Node, path: Path) -> Any:
        loaded.marks[path] = _position(node)
        if node.tag not in _CORE_TAGS:
            line, column = _position(node)
            problems.append(Problem(file, line, column,
                                    f"tag {node.tag!r} is not allowed: rule files are plain YAML data"))
            return None
        if isinstance(node, yaml.MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    line, column = _position(key_node)
                    problems.append(Problem(file, line, column,
                                            "merge keys (<<) are not supported; repeat the fields or use `defaults:`"))
                    continue
                key = build(key_node, path + ("<key>",))
                if not isinstance(key, (str, int, bool)) or key is None:
                    line, column = _position(key_node)
                    problems.append(Problem(file, line, column, "mapping keys must be plain scalars"))
                    continue
                key_line, key_col = _position(key_node)
                if key in out:
                    first_line, _ = loaded.key_marks[path + (key,)]
                    problems.append(Problem(file, key_line, key_col,
                                            f"duplicate key {key!r} (first defined on line {first_line})"))
                    continue
                loaded.key_marks[path + (key,)] = (key_line, key_col)
                out[key] = build(value_node, path + (key,))
            loaded.marks.pop(path + ("<key>",), None)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [build(item, path + (i,)) for i, item in enumerate(node.value)]
        try:
            return constructor.construct_object(node, deep=True)
        except yaml.YAMLError as exc:  # e.g. a malformed !!int
            line, column = _position(node)
            problems.append(Problem(file, line, column, f"bad scalar: {exc}"))
            return None

    loaded.data = build(root, ())
    constructor.dispose()
    return loaded, problems


def load_file(path: str, display: str) -> tuple[LoadedFile | None, list[Problem]]:
    """Read and parse one rule file; ``display`` is the name used in messages."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        return None, [Problem(display, 1, 1, f"cannot read rule file: {exc}")]
    return load_text(text, display)
