"""A rule path that names no rule files is one error naming it, from every command and from
``select()`` (issue 32, points 3 and 19): once an empty directory was silently an empty pack
in ``explain``, ``diff --pack`` (exit 0, "no change") and ``select()`` through
``DSV4SEL_RULES_PATH``, and only ``check`` refused it; and ``--rules`` at a pack's project
root said "no rule files" without naming the ``rules/`` folder below it."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

import dsv4sel

from _cli import run
from _repo import REPO

EMPTY = "no rule files (*.yaml, *.yml) in directory {}; a pack is the directory that holds its rule files"
COMMANDS = {
    "explain": ("explain", "--platform", "cuda", "--capability", "9.0", "--rules", "{}"),
    "check": ("check", "--rules", "{}"),
    "check PATH": ("check", "{}"),
    "test": ("test", "--rules", "{}", str(Path(REPO, "tests", "decisions"))),
    "table": ("table", "--rules", "{}"),
    "diff --pack -": ("diff", "--pack", "-", "{}"),
    "diff --pack NEW": ("diff", "--pack", "{}", str(Path(REPO, "examples", "mistakes", "clean"))),
}


def _run(command: str, path: str, cwd: Path):
    return run(*(word.format(path) for word in COMMANDS[command]), cwd=cwd)


@pytest.mark.parametrize("command", COMMANDS)
def test_an_empty_pack_directory_is_one_error_naming_it_from_every_command(command, tmp_path):
    (tmp_path / "empty").mkdir()
    result = _run(command, "empty", tmp_path)
    assert result.rc == 2, result
    assert result.err.count(EMPTY.format("empty")) == 1 and result.out == "", result


def test_select_refuses_an_empty_directory_on_the_rules_path(tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DSV4SEL_RULES_PATH", "empty")
    monkeypatch.setattr(dsv4sel.api, "_default", None)
    with pytest.raises(dsv4sel.RuleError) as info:
        dsv4sel.select(platform="cuda", capability="9.0")
    assert [(p.code, p.file, p.line, p.message) for p in info.value.problems] == [
        ("DSV306", "empty", 1, EMPTY.format("empty"))]


def test_the_folder_above_a_pack_s_rules_names_them(tmp_path):
    # a directory whose rules/ folder holds the rule files
    shutil.copytree(Path(REPO, "examples", "mistakes", "clean"), tmp_path / "my-pack" / "rules")
    for command in ("explain", "check", "diff --pack -"):
        result = _run(command, "my-pack", tmp_path)
        assert result.rc == 2 and "in directory my-pack; did you mean my-pack/rules?" in result.err, result


def test_a_pack_s_project_root_names_the_rules_folder_of_its_package():
    # --rules at the project root of a pack laid out as a Python package (pyproject.toml, PKG/rules/)
    root = os.path.join("examples", "b12x-pack")
    for command in ("explain", "check"):
        result = _run(command, root, Path(REPO))
        assert result.rc == 2, result
        assert f"in directory {root}; did you mean {root}/dsv4sel_b12x/rules?" in result.err, result
