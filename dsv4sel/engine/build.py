"""The pipeline from rule files to a RuleSet: load -> validate -> compile.

Each stage reports every problem it finds, across all files, before the
pipeline stops; the evaluator only ever sees a fully valid rule set.
"""

from __future__ import annotations

from ..errors import Problem, RuleError
from .profile import Profile
from .sources import Source


def _parse(src: Source):
    """Read and parse one source: ``(loaded file or None, load problems)``."""
    try:
        from .load import load_file
    except ImportError as exc:
        from .hints import dependency_error

        raise dependency_error(exc, "yaml", "PyYAML") from exc

    if src.unreadable is not None:
        return None, [Problem(src.display, src.line, 1, src.unreadable, code=src.code)]
    return load_file(src.path, src.display)


def _validated(loaded, problems: list[Problem], schema: str) -> list[Problem]:
    """The schema problems of a parsed file; none for a file that failed to load, which holds
    None where the bad nodes were (checking its schema would report each problem twice)."""
    from .validate import validate_file

    return validate_file(loaded, schema) if loaded is not None and not problems else []


def load_source(src: Source, schema: str):
    """Load and schema-check one source: ``(loaded file or None, load problems,
    schema problems)``. The loaded file is usable only when both lists are empty."""
    loaded, problems = _parse(src)
    return loaded, problems, _validated(loaded, problems, schema)


def _too_many_nodes(src: Source, nodes: int, position: int, count: int) -> RuleError:
    from .sources import MAX_LOAD_NODES, split_or_raise

    return RuleError([Problem(src.display, 1, 1, (
        f"the rule files expand to more than {MAX_LOAD_NODES:,} YAML nodes in all ({nodes:,} up to this file, "
        f"{position:,} of {count:,} files); a load holds at most {MAX_LOAD_NODES:,}: "
        + split_or_raise("MAX_LOAD_NODES")), code="DSV110")])


def load_and_validate(sources: list[Source], schema: str):
    """Load every source and check it against the rule schema at ``schema``.
    Returns the loaded files; raises RuleError with all load and schema
    problems of all files, in file order.

    The load is bounded as a whole (:mod:`dsv4sel.engine.sources`): past
    ``MAX_LOAD_FILES`` files or ``MAX_LOAD_BYTES`` bytes it is refused before
    any file is read; every file is parsed before any is validated (the costly
    step), so past ``MAX_LOAD_NODES`` YAML nodes it is refused at the file that
    crosses the bound, no file after it read and none validated. Each is one
    DSV110 problem."""
    from .sources import MAX_LOAD_NODES, load_bound_problem

    bound = load_bound_problem(sources)
    if bound is not None:
        raise RuleError([bound])
    parsed = []
    nodes = 0
    for i, src in enumerate(sources):
        f, found = _parse(src)
        parsed.append((f, found))
        nodes += f.nodes if f is not None else 0
        if nodes > MAX_LOAD_NODES:
            raise _too_many_nodes(src, nodes, i + 1, len(sources))
    loaded, problems = [], []
    for f, found in parsed:
        schema_problems = _validated(f, found, schema)
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
