"""How-to-fix hints that several stages attach to their messages.

YAML reads unquoted ``8.0`` as a float, ``no`` as false and ``12`` as an int;
where the rule or test schema expects a string, the message says to quote the
value and shows it quoted as it was written in the file. A compiler dependency
that does not import is told apart from one that is not installed.
"""

from __future__ import annotations

from typing import Any


def _literal(source: str, line: int, column: int) -> str | None:
    """The plain scalar written at 1-based ``line``/``column`` of ``source``."""
    lines = source.splitlines()
    if not 1 <= line <= len(lines):
        return None
    text = lines[line - 1][column - 1:]
    end = len(text)
    for stop in (",", "]", "}", " #"):
        at = text.find(stop)
        if at != -1:
            end = min(end, at)
    token = text[:end].strip()
    return token or None


def _value_at(data: Any, path: tuple) -> Any:
    for key in path:
        try:
            data = data[key]
        except (KeyError, IndexError, TypeError):
            return None
    return data


def quote_hint(loaded, path: tuple) -> str:
    """A hint for a schema error at ``path`` of ``loaded`` (a LoadedFile) when
    the value there, or an item of the list there, is a YAML number or
    boolean: ``; YAML reads the unquoted 8.0 as a number: quote it, "8.0"``.
    Empty when the value is not such a scalar."""
    value = _value_at(loaded.data, path)
    candidates = [(path, value)]
    if isinstance(value, list):
        candidates = [(path + (i,), v) for i, v in enumerate(value)]
    quoted = []
    kinds = []
    for item_path, item in candidates:
        if isinstance(item, bool):
            kinds.append("boolean")
        elif isinstance(item, (int, float)):
            kinds.append("number")
        else:
            continue
        line, column = loaded.where(item_path)
        literal = _literal(loaded.source, line, column) or str(item).lower()
        quoted.append((literal, f'"{literal}"'))
    if not quoted:
        return ""
    if len(quoted) == 1:
        literal, fixed = quoted[0]
        return f"; YAML reads the unquoted {literal} as a {kinds[0]}: quote it, {fixed}"
    what = " or ".join(f"{k}s" for k in sorted(set(kinds), reverse=True))
    return ("; YAML reads unquoted " + ", ".join(q[0] for q in quoted) + f" as {what}: quote them, ["
            + ", ".join(q[1] for q in quoted) + "]")


#: The environment variable a serving process allows a pack's impl modules with, and the one that
#: lists packs (read by :mod:`dsv4sel.engine.sources`, which sits above this module).
ALLOW_IMPL_ENV = "DSV4SEL_ALLOW_IMPL_MODULES"
RULES_PATH_ENV = "DSV4SEL_RULES_PATH"


def allow_impl_hint(impl: str, from_environment: bool = False) -> str:
    """How to allow an impl class whose module is not on the allow-list: every way in, the
    environment variable first for a pack that came from the environment (``DSV4SEL_RULES_PATH``:
    a serving process, which has no command line to pass ``--allow-impl-module`` on)."""
    top = str(impl).partition(":")[0].split(".")[0] or "MODULE"
    flag = f"--allow-impl-module {top} (Python: allowed_impl_modules=({top!r},))"
    installed = ("install the pack with an entry point in group dsv4sel.rules, whose top-level package may "
                 "name impl classes")
    if from_environment:
        return (f"; to allow it, set {ALLOW_IMPL_ENV}={top} beside {RULES_PATH_ENV}, which names this pack, "
                f"or pass {flag}, or {installed}")
    return f"; to allow it, pass {flag}, set {ALLOW_IMPL_ENV}={top} in a serving process's environment, or {installed}"


def import_ran_out_of_memory(exc: ImportError) -> bool:
    """Whether an import failed for want of memory: a MemoryError inside it, or the dynamic
    loader unable to map a library (its message says so), there or in an import whose failure
    led to it (a package that falls back to another module when one does not import)."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:  # e.g. a fallback import tried after the real one failed
        seen.add(id(cause))
        if isinstance(cause, MemoryError) or (isinstance(cause, ImportError) and any(
                sign in str(cause) for sign in ("failed to map segment", "Cannot allocate memory"))):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def dependency_error(exc: ImportError, module: str, distribution: str) -> Exception:
    """What to raise when importing ``module`` (from ``distribution``), which the compiler
    needs, failed with ``exc``: ``pip install`` only when it is not installed. An import
    that fails for want of memory (a MemoryError inside it, or the dynamic loader unable
    to map a library) is a MemoryError, and any other failure says the module is broken,
    never that it is missing."""
    text = str(exc)
    if import_ran_out_of_memory(exc):
        return MemoryError(f"importing {module}: {text}")
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] == module:
        return ImportError(f"dsv4sel needs {distribution} to compile rule files, and it is not installed: "
                           f"pip install {distribution.lower()} (a warm compiled cache needs neither PyYAML "
                           "nor jsonschema)")
    return ImportError(f"dsv4sel needs {distribution} to compile rule files, and it is installed but does not "
                       f"import ({type(exc).__name__}: {text}); reinstall it")
