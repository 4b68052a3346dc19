"""Frozen values declare their fields, so the type checker sees them (issue 19, point 4)."""

import importlib
import pkgutil

import pytest

import dsv4sel
from dsv4sel.record import Frozen, unannotated_fields


def _subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


def test_every_frozen_value_of_the_package_annotates_its_fields():
    for info in pkgutil.walk_packages(dsv4sel.__path__, "dsv4sel."):
        if "kernels" in info.name:  # kernels define no Frozen values and need torch
            continue
        importlib.import_module(info.name)
    classes = list(_subclasses(Frozen))
    assert len(classes) >= 20
    assert [c.__qualname__ for c in classes if unannotated_fields(c)] == []


def test_a_field_without_an_annotation_is_refused_at_class_definition():
    with pytest.raises(TypeError, match=r"Point: field 'y' in __slots__ has no annotation; declare it as `y: <type>`"):
        class Point(Frozen):
            __slots__ = ("x", "y")
            x: int


def test_annotated_fields_keep_their_slot_order_and_defaults():
    class Point(Frozen):
        __slots__ = ("x", "y")
        _defaults = {"y": 0}
        x: int
        y: int

    assert Point(1) == Point(x=1, y=0)
    assert Point._fields == ("x", "y")


def test_mypy_checks_the_kernels_under_their_installed_name_from_the_checkout_itself():
    # make test's mypy finds dsv4sel.kernels through typecheck/ (pyproject [tool.mypy]); a copy
    # there instead of the link would type-check stale kernels
    import os

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    link = os.path.join(repo, "typecheck", "dsv4sel", "kernels")
    assert os.path.islink(link)
    assert os.path.realpath(link) == os.path.realpath(os.path.join(repo, "kernels"))


def test_the_mypy_config_checks_the_whole_package_without_switching_checking_off():
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    import os

    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(repo, "pyproject.toml"), "rb") as f:
        mypy = tomllib.load(f)["tool"]["mypy"]
    assert mypy["packages"] == ["dsv4sel", "dsv4sel.kernels"] and mypy["mypy_path"] == "typecheck"
    sections = [mypy, *mypy.get("overrides", [])]
    assert not any(s.get("ignore_errors") or s.get("follow_imports") == "skip" for s in sections)
