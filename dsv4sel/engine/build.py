"""The pipeline from rule files to a RuleSet: load -> validate -> compile.

Each stage reports every problem it finds, across all files, before the
pipeline stops; the evaluator only ever sees a fully valid rule set.
"""

from __future__ import annotations

from ..errors import Problem, RuleError
from .profile import Profile
from .sources import Source


def load_source(src: Source, schema: str):
    """Load and schema-check one source: ``(loaded file or None, load problems,
    schema problems)``. The loaded file is usable only when both lists are empty."""
    try:
        from .load import load_file
    except ImportError as exc:
        raise ImportError(f"dsv4sel needs PyYAML to compile rule files, and it is not importable ({exc}): "
                          "pip install pyyaml") from exc
    from .validate import validate_file

    if src.unreadable is not None:
        return None, [Problem(src.display, src.line, 1, src.unreadable, code="DSV101")], []
    loaded, problems = load_file(src.path, src.display)
    # a file that failed to load holds None where the bad nodes were: checking
    # its schema would report each load problem a second time
    schema_problems = validate_file(loaded, schema) if loaded is not None and not problems else []
    return loaded, problems, schema_problems


def load_and_validate(sources: list[Source], schema: str):
    """Load every source and check it against the rule schema at ``schema``.
    Returns the loaded files; raises RuleError with all load and schema
    problems of all files."""
    loaded, problems = [], []
    for src in sources:
        f, found, schema_problems = load_source(src, schema)
        problems.extend(found)
        problems.extend(schema_problems)
        if f is not None and not found and not schema_problems:
            loaded.append(f)
    if not sources:
        problems.append(Problem("<rules>", 1, 1, "no rule files found", code="DSV306"))
    if problems:
        raise RuleError(problems)
    return loaded


def build_program(sources: list[Source], allowed_impl_modules: tuple[str, ...], profile: Profile):
    """Compile ``sources`` into a Program of ``profile``'s domain (see
    :mod:`dsv4sel.engine.compile`): the one pipeline from rule files to a
    program, used by ``load_rules``, ``verify`` and every command. Raises
    RuleError with every problem of the first stage that found any."""
    from .compile import compile_files

    files = load_and_validate(sources, profile.schema)
    packs = {src.display: src.pack for src in sources}
    return compile_files(files, allowed_impl_modules=allowed_impl_modules, profile=profile, packs=packs)
