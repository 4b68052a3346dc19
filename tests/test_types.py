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
