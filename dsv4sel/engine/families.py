"""Value families: ``9.x`` means every declared value that starts with ``9.``.

One definition for the three places that meet families: the compiler reads
``9.x`` in a rule's condition (:func:`members`), and the checker's cubes and
the support matrix write a complete family back as ``9.x`` (:func:`compact`).
A family is the text before a value's first dot, so ``10.0`` and ``10.3`` are
``10.x``; a value without a dot (``gfx942``, ``unknown``) is in no family.
"""

from __future__ import annotations

SUFFIX = ".x"


def family_of(value: str) -> str | None:
    """``"10.3"`` -> ``"10.x"``; None for a value without a dot."""
    prefix, dot, _ = value.partition(".")
    return prefix + SUFFIX if dot and prefix else None


def is_family(word: str) -> bool:
    """True when ``word`` is spelt as a family (``P.x``)."""
    return word.endswith(SUFFIX) and len(word) > len(SUFFIX)


def members(family: str, values) -> list[str]:
    """The ``values`` in ``family`` (``P.x``), in their order."""
    return [v for v in values if family_of(v) == family]


def compact(chosen, domain, *, min_members: int = 2) -> list[str]:
    """``chosen`` (in ``domain`` order) with every family whose declared
    members are all chosen written once as ``P.x``, where it stands. A family
    of fewer than ``min_members`` declared values stays spelt out: the
    checker's cubes name a lone ``11.0`` as itself, while the support matrix
    (``min_members=1``) writes ``11.x`` to read like its neighbours."""
    picked = set(chosen)
    out: list[str] = []
    for value in chosen:
        family = family_of(value)
        group = members(family, domain) if family is not None else []
        if family is not None and len(group) >= min_members and picked.issuperset(group):
            if family not in out:
                out.append(family)
        else:
            out.append(value)
    return out
