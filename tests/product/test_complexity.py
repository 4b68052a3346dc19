"""The complexity gate (issue 19): no function of ``dsv4sel/`` or ``kernels/`` has a cyclomatic
complexity above 15, as radon counts it (``radon cc -s -n C --show-closures dsv4sel kernels`` lists
the ones near the limit; without ``--show-closures`` it hides closures, which count here). A function over it fails ``make test`` with its name, file:line and figure, which is the
moment to split it into named steps rather than to raise the limit.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from radon.complexity import cc_visit
from radon.visitors import Class, Function

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 15
FOLDERS = ("dsv4sel", "kernels")


def _functions(blocks: list) -> Iterator[Function]:
    """Every function radon found: top-level ones, methods, closures, and those of nested classes.

    A class's own figure is the sum of its methods', so classes are walked, not measured."""
    for block in blocks:
        if isinstance(block, Class):
            yield from _functions(block.methods)
            yield from _functions(block.inner_classes)
        else:
            yield block
            yield from _functions(block.closures)


def over_limit(source: str, filename: str) -> list[str]:
    """``file:line name (figure)`` for each function of ``source`` above :data:`LIMIT`.

    radon lists a method both on its own and in its class, so each is reported once."""
    found = {(f.lineno, f.fullname): f.complexity for f in _functions(cc_visit(source)) if f.complexity > LIMIT}
    return [f"{filename}:{line} {name} (complexity {figure})" for (line, name), figure in sorted(found.items())]


def test_no_function_of_the_package_or_the_kernels_is_above_the_limit():
    files = sorted(path for folder in FOLDERS for path in (ROOT / folder).rglob("*.py"))
    assert len(files) > 50, f"found only {len(files)} Python files under {FOLDERS}: is ROOT {ROOT} the repo?"
    found = [hit for path in files for hit in over_limit(path.read_text(), str(path.relative_to(ROOT)))]
    assert not found, f"functions above cyclomatic complexity {LIMIT} (split them into named steps):\n" + "\n".join(found)


# 16 decision points: a chain of 15 `elif`s after an `if`, plus the function itself.
PLANTED = "class Planted:\n    def pick(self, x):\n        if x == 0:\n            return 0\n" + "".join(
    f"        elif x == {n}:\n            return {n}\n" for n in range(1, 16)) + "        return -1\n"


def test_the_gate_names_a_planted_function_above_the_limit_and_passes_one_at_it():
    assert over_limit(PLANTED, "planted.py") == ["planted.py:2 Planted.pick (complexity 17)"]
    at_limit = PLANTED.replace("        elif x == 15:\n            return 15\n", "").replace(
        "        elif x == 14:\n            return 14\n", "")
    assert over_limit(at_limit, "planted.py") == []


def test_the_gate_sees_a_function_nested_in_a_simple_one():
    nested = PLANTED.replace("class Planted:\n", "def outer():\n")
    assert over_limit(nested, "nested.py") == ["nested.py:2 pick (complexity 17)"]
