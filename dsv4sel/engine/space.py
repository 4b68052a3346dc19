"""The decision space as a product of dimensions, and cubes over it.

The vocabulary is not a plain product: ``capability`` is scoped by
``platform`` (``12.0`` is a CUDA value, ``gfx942`` a ROCm one). To make it a
product again, every unscoped input is *fused* with the inputs scoped by it
into one :class:`Dim` whose values are the valid tuples, e.g.
``("cuda", "12.0")``. Over fused dimensions every box is a product, so two
rules intersect exactly when they intersect on every dimension, and a cube's
size is the product of its per-dimension counts.

A cube (a :data:`Box`) is a tuple of ints, one per dimension: bit ``i`` set means the
dimension's value ``i`` is in the cube. A rule's conditions become such a
cube (:meth:`Space.rule_cube`); a cube with an empty dimension is empty.
This module knows nothing about rules or tables; it only counts, picks
points and restricts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Protocol


class Declared(Protocol):
    """What the space reads of a declared input (:class:`dsv4sel.engine.model.InputDecl`)."""

    @property
    def by(self) -> str | None: ...

    @property
    def values(self) -> tuple[str, ...]: ...

    def values_for(self, point: dict[str, str]) -> tuple[str, ...]: ...

Box = tuple  # tuple[int, ...]: one value bitset per Dim (a cube of points)


def iter_bits(mask: int) -> Iterator[int]:
    """The indices of the set bits of ``mask``, ascending.

    Sparse masks take the lowest bit repeatedly; dense wide ones (thousands
    of rules) go through one binary string, which is linear in the width
    instead of quadratic.
    """
    if mask.bit_count() <= 16:
        while mask:
            low = mask & -mask
            yield low.bit_length() - 1
            mask ^= low
        return
    text = format(mask, "b")[::-1]
    i = text.find("1")
    while i >= 0:
        yield i
        i = text.find("1", i + 1)


def first_bits(mask: int, k: int) -> list[int]:
    """The indices of the ``k`` lowest set bits of ``mask`` (all if fewer),
    without walking the rest of a wide mask."""
    out: list[int] = []
    while mask and len(out) < k:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


@dataclass(frozen=True)
class Dim:
    """One dimension: an unscoped input and the inputs scoped by it.

    ``values`` are tuples with one entry per name in ``inputs``; only valid
    combinations (a capability declared for that platform) are listed, in
    vocabulary order.
    """

    index: int
    inputs: tuple[str, ...]
    values: tuple[tuple[str, ...], ...]

    @property
    def full(self) -> int:
        return (1 << len(self.values)) - 1

    def __len__(self) -> int:
        return len(self.values)


class Space:
    """The fused dimensions of a vocabulary (``Program.inputs``).

    ``inputs`` maps each input name to an object with ``name``, ``values``,
    ``by`` and ``values_for(point)`` (:class:`dsv4sel.engine.compile.InputDecl`).
    The backend is not a dimension here: it selects which table decides.
    """

    def __init__(self, inputs: Mapping[str, Declared]):
        self.input_names: tuple[str, ...] = tuple(inputs)
        children: dict[str, list[str]] = {}
        for name, decl in inputs.items():
            if decl.by is not None:
                children.setdefault(decl.by, []).append(name)
        dims: list[Dim] = []
        for name, decl in inputs.items():
            if decl.by is not None:
                continue
            group = (name, *children.get(name, ()))
            rows: list[tuple[str, ...]] = []
            for parent in decl.values:
                combos: list[tuple[str, ...]] = [(parent,)]
                for child in group[1:]:
                    scoped = inputs[child].values_for({name: parent})
                    combos = [c + (v,) for c in combos for v in scoped]
                rows.extend(combos)
            dims.append(Dim(len(dims), group, tuple(rows)))
        self.dims: tuple[Dim, ...] = tuple(dims)
        #: input name -> (dimension index, position inside the dimension's tuples)
        self.where: dict[str, tuple[int, int]] = {
            n: (d.index, k) for d in self.dims for k, n in enumerate(d.inputs)}
        self._index = [{v: i for i, v in enumerate(d.values)} for d in self.dims]
        self._cond_memo: dict[tuple, int] = {}
        self._full = tuple(d.full for d in self.dims)
        self._single = tuple(len(d.inputs) == 1 for d in self.dims)

    # ----------------------------------------------------------- building
    @property
    def full(self) -> Box:
        return tuple(d.full for d in self.dims)

    def rule_cube(self, conditions) -> Box:
        """The cube of points a rule's ``conditions`` accept.

        ``conditions`` is a sequence of ``(input, frozenset of values)``;
        inputs not named accept everything. Memoized per distinct condition,
        because generated and hand-written tables repeat them a lot.
        """
        out = list(self._full)
        fused: dict[int, dict[str, frozenset]] = {}
        for name, values in conditions:
            di, _ = self.where[name]
            if self._single[di]:
                key = (di, values)
                bits = self._cond_memo.get(key)
                if bits is None:
                    index = self._index[di]
                    bits = 0
                    for v in values:
                        i = index.get((v,))
                        if i is not None:
                            bits |= 1 << i
                    self._cond_memo[key] = bits
                out[di] = bits
            else:
                fused.setdefault(di, {})[name] = values
        for di, by_name in fused.items():
            d = self.dims[di]
            sets = tuple(by_name.get(n) for n in d.inputs)
            key = (di, sets)
            bits = self._cond_memo.get(key)
            if bits is None:
                bits = 0
                for i, row in enumerate(d.values):
                    if all(s is None or v in s for s, v in zip(sets, row)):
                        bits |= 1 << i
                self._cond_memo[key] = bits
            out[di] = bits
        return tuple(out)

    def point_cube(self, point: Mapping[str, str]) -> Box | None:
        """The one-point cube of ``point`` (None if it is outside the space)."""
        out = []
        for d in self.dims:
            i = self._index[d.index].get(tuple(point[n] for n in d.inputs))
            if i is None:
                return None
            out.append(1 << i)
        return tuple(out)

    # ----------------------------------------------------------- counting
    @staticmethod
    def size(cube: Box) -> int:
        n = 1
        for bits in cube:
            n *= bits.bit_count()
        return n

    @staticmethod
    def intersect(a: Box, b: Box) -> Box:
        return tuple(x & y for x, y in zip(a, b))

    # -------------------------------------------------------- enumeration
    def first_point(self, cube: Box) -> dict[str, str]:
        """The cube's first point in vocabulary order (cube must be non-empty)."""
        point: dict[str, str] = {}
        for d, bits in zip(self.dims, cube):
            row = d.values[(bits & -bits).bit_length() - 1]
            point.update(zip(d.inputs, row))
        return {n: point[n] for n in self.input_names}

    # -------------------------------------------------- restriction by input
    def split_by(self, cube: Box, names) -> Iterator[tuple[dict[str, str], Box]]:
        """Split ``cube`` by the values of the inputs ``names``: yields each
        assignment of those inputs that occurs in the cube with the sub-cube
        where it holds. Used to render templates such as ``{kv_cache_dtype}``
        once per distinct value instead of once per point."""
        wanted = [n for n in names if n in self.where]
        dims = sorted({self.where[n][0] for n in wanted})
        parts: list[list[tuple[dict[str, str], int]]] = []
        for di in dims:
            d = self.dims[di]
            keys = [k for k, n in enumerate(d.inputs) if n in wanted]
            groups: dict[tuple[str, ...], int] = {}
            for i in iter_bits(cube[di]):
                key = tuple(d.values[i][k] for k in keys)
                groups[key] = groups.get(key, 0) | (1 << i)
            parts.append([({d.inputs[k]: v for k, v in zip(keys, key)}, bits)
                          for key, bits in groups.items()])

        def walk(k: int, assignment: dict[str, str], sub: list[int]) -> Iterator[tuple[dict[str, str], Box]]:
            if k == len(dims):
                yield dict(assignment), tuple(sub)
                return
            for values, bits in parts[k]:
                saved = sub[dims[k]]
                sub[dims[k]] = bits
                yield from walk(k + 1, {**assignment, **values}, sub)
                sub[dims[k]] = saved

        yield from walk(0, {}, list(cube))

    def substitute(self, cube: Box, name: str, value: str) -> Box | None:
        """``cube`` with input ``name`` set to ``value`` at every point (the
        image of a rewrite). None when no such point is in the space."""
        di, k = self.where[name]
        d = self.dims[di]
        index = self._index[di]
        bits = 0
        for i in iter_bits(cube[di]):
            row = d.values[i]
            j = index.get(row[:k] + (value,) + row[k + 1:])
            if j is not None:
                bits |= 1 << j
        if not bits:
            return None
        return cube[:di] + (bits,) + cube[di + 1:]

    def restrict(self, cube: Box, name: str, values) -> Box:
        """``cube`` keeping only points whose input ``name`` is in ``values``."""
        di, k = self.where[name]
        d = self.dims[di]
        keep = set(values)
        bits = 0
        for i in iter_bits(cube[di]):
            if d.values[i][k] in keep:
                bits |= 1 << i
        return cube[:di] + (bits,) + cube[di + 1:]

    def project(self, cube: Box, name: str) -> tuple[str, ...]:
        """The distinct values input ``name`` takes in ``cube``, vocabulary order."""
        di, k = self.where[name]
        d = self.dims[di]
        seen: dict[str, None] = {}
        for i in iter_bits(cube[di]):
            seen.setdefault(d.values[i][k], None)
        return tuple(seen)


def merge(items: Iterable[tuple[Box, frozenset]]) -> list[tuple[Box, frozenset]]:
    """Merge ``(cube, payload)`` pairs; merged cubes carry the union of the
    payloads (e.g. the rules that routed inputs into a gap). The union of the
    result equals the union of the input; disjoint input stays disjoint.
    Sorted by each cube's first point, so the output is deterministic."""
    current: dict[Box, frozenset] = {}
    for box, payload in items:
        if all(box):
            current[box] = current.get(box, frozenset()) | payload
    if not current:
        return []
    ndims = len(next(iter(current)))
    changed = True
    while changed and len(current) > 1:
        changed = False
        for d in range(ndims):
            groups: dict[tuple, list] = {}
            for box, payload in current.items():
                key = box[:d] + box[d + 1:]
                slot = groups.get(key)
                if slot is None:
                    groups[key] = [box[d], payload]
                else:
                    slot[0] |= box[d]
                    slot[1] = slot[1] | payload
            if len(groups) < len(current):
                changed = True
                current = {key[:d] + (bits,) + key[d:]: payload for key, (bits, payload) in groups.items()}
    return sorted(current.items(), key=lambda item: tuple((b & -b).bit_length() for b in item[0]))
