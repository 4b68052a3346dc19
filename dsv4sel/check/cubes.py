"""Grouping point sets into few, compact cubes, and writing cubes for people.

:func:`merge` joins cubes that differ in one dimension only (``A x X`` and
``A x Y`` become ``A x (X | Y)``), repeatedly, so a gap the scan reports as
many pieces reads as one or two lines. :class:`CubeWriter` turns a cube over
the fused dimensions of :mod:`dsv4sel.engine.space` (plus a set of requested
backends) into public :class:`~dsv4sel.check.findings.Cube` values (per-input
value lists, read with capability scoped by platform), e.g.
``platform=cuda capability=12.x backend=<none> kv_cache_dtype=float16``;
:func:`cube_text` is the one way a cube is written, here and in ``dsv4sel diff``:
an input that takes every value is left out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Mapping, Sequence, cast

from ..engine.families import compact
from .findings import Cube, Input
from ..engine.space import Box, Dim, Space, iter_bits

if TYPE_CHECKING:
    from ..engine.model import InputDecl

BACKEND = "backend"
#: one scoped input of a cube: (input, its parent input, ((parent value, the input's values), ...))
Scope = tuple[str, str, tuple[tuple[str, tuple[str, ...]], ...]]


def describe(values: Sequence[str | None], domain: Sequence[str | None]) -> str:
    """``*``, a comma list (families compacted) or ``not(...)``, whichever is shortest."""
    shown = ["<none>" if v is None else v for v in values]
    full = ["<none>" if v is None else v for v in domain]
    if set(shown) >= set(full):
        return "*"
    plain = compact(shown, full)
    rest = [v for v in full if v not in set(shown)]
    negated = compact(rest, full)
    # not(...) when it names fewer values, and few of them (a long not() reads badly)
    if len(negated) < len(plain) and len(negated) <= 4:
        return "not(" + ",".join(negated) + ")"
    return ",".join(plain)


def cube_text(parts: Iterable[tuple[str, str]]) -> str:
    """A cube as ``name=values name=values ...`` from ``(name, describe(...))`` pairs,
    leaving out every input that takes all its values (``*``): a cube names only what
    narrows it. ``*`` alone when nothing does."""
    return " ".join(f"{name}={shown}" for name, shown in parts if shown != "*") or "*"


class CubeWriter:
    """Writes cubes of a :class:`Space` (plus requested backends) as
    :class:`Cube` values and points as :class:`Input` values."""

    def __init__(self, space: Space, inputs: Mapping[str, InputDecl], backends: Sequence[str],
                 key: Sequence[str] = ()):
        self.space = space
        self.inputs = inputs
        self.backend_domain: tuple[str | None, ...] = (None, *backends)
        names = list(space.input_names)
        # the backend where the profile's key has it (after the inputs before it there), else last
        before = key[:list(key).index(BACKEND)] if BACKEND in key else names
        at = max((names.index(n) + 1 for n in before if n in names), default=0)
        #: display order: the inputs as in a lookup key, the backend where the profile puts it
        self.order: tuple[str, ...] = tuple(names[:at] + [BACKEND] + names[at:])
        # tables repeat the same value sets over and over: write each once
        self._alternatives: dict[tuple[int, int], list[dict]] = {}
        self._texts: dict[tuple, str] = {}  # "name=values" per (name, values, parents)
        self._scopes: dict[tuple[str, tuple[str, ...]], Scope] = {}

    def _domain(self, name: str, parents: Sequence[str] | None) -> list[str]:
        decl = self.inputs[name]
        if parents is None or decl.by is None:
            return list(decl.values)
        seen: dict[str, None] = {}
        for p in parents:
            for v in decl.values_for({decl.by: p}):
                seen.setdefault(v, None)
        return list(seen)

    def _dim_alternatives(self, d: Dim, bits: int) -> list[dict[str, tuple[str, ...]]]:
        """One dimension's value set as products of per-input value lists."""
        rows = [d.values[i] for i in iter_bits(bits)]
        if len(d.inputs) == 1:
            return [{d.inputs[0]: tuple(r[0] for r in rows)}]
        by_parent: dict[str, list[tuple[str, ...]]] = {}
        for row in rows:
            by_parent.setdefault(row[0], []).append(row[1:])
        if len(d.inputs) == 2:
            return self._scoped_groups(d.inputs[0], d.inputs[1], {p: [k[0] for k in kids]
                                                                 for p, kids in by_parent.items()})
        return self._exact_products(d, by_parent)

    @staticmethod
    def _exact_products(d: Dim, by_parent: dict[str, list[tuple[str, ...]]]) -> list[dict[str, tuple[str, ...]]]:
        """Several inputs scoped by one parent (rare): parents with the same child combinations
        together, as one product where the combinations are one, else one cube per combination."""
        by_children: dict[tuple[tuple[str, ...], ...], list[str]] = {}
        for parent, kids in by_parent.items():
            by_children.setdefault(tuple(kids), []).append(parent)
        out: list[dict[str, tuple[str, ...]]] = []
        for combos, parents in by_children.items():
            columns = [tuple(dict.fromkeys(k[j] for k in combos)) for j in range(len(d.inputs) - 1)]
            product = 1
            for c in columns:
                product *= len(c)
            if product == len(combos):
                out.append({d.inputs[0]: tuple(parents), **dict(zip(d.inputs[1:], columns))})
            else:  # not a product: one cube per child combination
                for k in combos:
                    out.append({d.inputs[0]: tuple(parents), **{n: (v,) for n, v in zip(d.inputs[1:], k)}})
        return out

    def _scoped_groups(self, parent: str, child: str, kids_of: dict[str, list[str]]) -> list[dict]:
        """Parents written together when one child list fits them all, read
        with scoping: ``platform=cuda,rocm capability=*`` is every declared
        capability of cuda and of rocm."""
        decl = self.inputs[child]
        scope = {p: set(decl.values_for({parent: p})) for p in kids_of}
        groups: list[tuple[list[str], set[str]]] = []
        for p, kids in kids_of.items():
            for members, union in groups:
                joined = union | set(kids)
                if all(set(kids_of[q]) == joined & scope[q] for q in (*members, p)):
                    members.append(p)
                    union |= set(kids)
                    break
            else:
                groups.append(([p], set(kids)))
        order = {v: i for i, v in enumerate(decl.values)}
        return [{parent: tuple(members), child: tuple(sorted(union, key=order.__getitem__))}
                for members, union in groups]

    def cubes(self, box: Box, backends: Iterable[str | None]) -> list[Cube]:
        """``box`` x ``backends`` as a list of :class:`Cube` (usually one)."""
        chosen = set(backends)
        backend_values = tuple(b for b in self.backend_domain if b in chosen)
        combos: list[dict[str, tuple[str | None, ...]]] = [{BACKEND: backend_values}]
        for d, bits in zip(self.space.dims, box):
            alternatives = self._alternatives.get((d.index, bits))
            if alternatives is None:
                alternatives = self._alternatives[(d.index, bits)] = self._dim_alternatives(d, bits)
            combos = [{**acc, **alt} for acc in combos for alt in alternatives] if len(alternatives) > 1 else [
                {**acc, **alternatives[0]} for acc in combos]
        return [self._cube(values) for values in combos]

    def _cube(self, values: dict[str, tuple[str | None, ...]]) -> Cube:
        """One product of per-input value lists as a :class:`Cube`, in display order."""
        items = tuple((n, values[n]) for n in self.order)
        scopes: list[Scope] = []
        parts = []
        for name, vals in items:
            by = self.inputs[name].by if name != BACKEND else None
            # a parent is an input, never the backend: its values are never None
            parents = cast("tuple[str, ...]", values[by]) if by else None
            key = (name, vals, parents)
            text = self._texts.get(key)
            if text is None:
                domain = list(self.backend_domain) if name == BACKEND else self._domain(name, parents)
                text = self._texts[key] = describe(vals, domain)
            parts.append((name, text))
            if by and parents is not None:
                scopes.append(self._scope(name, by, parents))
        return Cube(items, cube_text(parts), tuple(scopes))

    def _scope(self, name: str, by: str, parents: tuple[str, ...]) -> Scope:
        """``name``'s values per value of its parent input ``by`` (one of ``parents``)."""
        key = (name, parents)
        hit = self._scopes.get(key)
        if hit is None:
            decl = self.inputs[name]
            hit = self._scopes[key] = (name, by, tuple((p, tuple(decl.values_for({by: p}))) for p in parents))
        return hit

    def input(self, point: Mapping[str, str], backend: str | None) -> Input:
        """A point of the space plus a requested backend, as an :class:`Input`."""
        return Input(tuple((n, backend if n == BACKEND else point[n]) for n in self.order))
