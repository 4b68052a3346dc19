"""Shared fixtures, and the one place that makes tests/'s helpers importable.

The tests live in folders that mirror the packages (tests/README.md). pytest (rootdir import
mode "prepend") puts each test file's own folder on sys.path, not tests/, so the helpers kept
here (``_cli``, ``_repo``, ``_rule_text``, ...) are added once, below: this file is loaded
before any test module below it is imported.
"""

import sys
from pathlib import Path

import pytest

_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Every test compiles into its own cache dir, so no test depends on another's cache."""
    monkeypatch.setenv("DSV4SEL_CACHE_DIR", str(tmp_path_factory.mktemp("dsv4sel-cache")))


@pytest.fixture
def write_rules(tmp_path, monkeypatch):
    """Gather rule files into ``rules/`` of a fresh working directory (so messages name them
    ``rules/NAME``) and return its path. Each source is a folder of rule files (a test's data,
    ``tests/<package>/rules/...``; a later folder's file replaces an earlier one of the same
    name) or a ``{name: text}`` dict, for text a test generates."""
    monkeypatch.chdir(tmp_path)

    def write(*sources) -> str:
        directory = tmp_path / "rules"
        directory.mkdir(exist_ok=True)
        for source in sources:
            files = source if isinstance(source, dict) else {
                path.name: path.read_text() for path in sorted(Path(source).glob("*.yaml"))}
            assert files, f"no rule files in {source}"
            for name, text in files.items():
                (directory / name).write_text(text)
        return str(directory)

    return write


#: the suites that run the real engines, longest first (tests/hosts/...)
_ENGINE_SUITES = tuple(Path(__file__).resolve().parent / "hosts" / name for name in ("vllm", "sglang", ""))


def _engine_rank(item) -> int:
    path = Path(str(item.path))
    return next((i for i, suite in enumerate(_ENGINE_SUITES) if path.is_relative_to(suite)), len(_ENGINE_SUITES))


def pytest_collection_modifyitems(items):
    """The suites that run the real engines (tests/hosts) first, longest first: their engine
    processes then run beside the rest of the suite instead of making its tail (pytest-xdist
    hands out files in this order), which keeps ``make test``'s wall time near its CPU time / cores."""
    items.sort(key=_engine_rank)
