"""The pipeline from rule files to a RuleSet: load -> validate -> compile.

Each stage reports every problem it finds, across all files, before the
pipeline stops; the evaluator only ever sees a fully valid rule set.
"""

from __future__ import annotations

from .errors import Problem, RuleError
from .sources import Source


def load_and_validate(sources: list[Source]):
    """Load and schema-check every source. Returns the loaded files; raises
    RuleError with all load and schema problems of all files."""
    try:
        from .load import load_file
    except ImportError as exc:
        raise ImportError(f"dsv4sel needs PyYAML to compile rule files, and it is not importable ({exc}): "
                          "pip install pyyaml") from exc
    from .validate import validate_file

    loaded, problems = [], []
    for src in sources:
        f, found = load_file(src.path, src.display)
        problems.extend(found)
        if f is not None and not found:  # a refused tag or merge key: the schema would only echo it
            schema_problems = validate_file(f)
            problems.extend(schema_problems)
            if not found and not schema_problems:
                loaded.append(f)
    if not sources:
        problems.append(Problem("<rules>", 1, 1, "no rule files found"))
    if problems:
        raise RuleError(problems)
    return loaded


def build_program(sources: list[Source], allowed_impl_modules: tuple[str, ...]):
    """Compile ``sources`` into a Program (see :mod:`dsv4sel.compile`)."""
    from .compile import compile_files

    files = load_and_validate(sources)
    packs = {src.display: src.pack for src in sources}
    return compile_files(files, allowed_impl_modules=allowed_impl_modules, packs=packs)
