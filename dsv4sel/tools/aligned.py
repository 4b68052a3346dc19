"""Two compiled rule sets' decision arrays, aligned input by input.

``dsv4sel upgrade`` compares what two releases of a host decide at every input of either
release's space. Their spaces need not be the same: the newer release may declare an input
the older one does not (``lora``), or values it does not (a new ``--attention-backend``
name). :class:`Aligned` walks the new rule set's compiled array (:meth:`RuleSet.dense`) and
finds, for each of its points, the old rule set's point with the same values (an input the
old set lacks is dropped, one the new set lacks takes the old set's default), so the two
arrays are compared slice by slice, one slice per requested backend, without a lookup per
key. Points only the old set has (a value the new release no longer declares) are listed
too, each with the new side absent.

Data only, no rendering: :mod:`dsv4sel.tools.upgrade` classifies what differs.
"""

from __future__ import annotations

from ..dsv4.rules import RuleSet

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Iterator

    #: one point's input values by name (a value None: an input's default that is not declared)
    Values = dict[str, str | None]


class Aligned:
    """The points of ``old`` and ``new`` paired by their values.

    ``names`` is every input of either key (the new key's order, then inputs only the old one
    has), ``domains`` each input's values in display order (the new set's, then values only the
    old one declares), ``backends`` every requested backend (None: the platform default) of
    either set. :meth:`pairs` yields the array slots to compare; :meth:`box` gives the cube of
    one point; :meth:`with_default` the point with one input at its declared default.
    """

    def __init__(self, old: RuleSet, new: RuleSet):
        self.old, self.new = old, new
        self._old_layout, self._old_ids = old.dense()
        self._new_layout, self._new_ids = new.dense()
        self.names: tuple[str, ...] = tuple(dict.fromkeys((*new.key_inputs, *old.key_inputs)))
        self.backends: tuple[str | None, ...] = tuple(
            dict.fromkeys((*self._new_layout.backends, *self._old_layout.backends)))
        self._new_points = [self._values(self._new_layout, p) for p in range(self._new_layout.points)]
        self._old_points = [self._values(self._old_layout, p) for p in range(self._old_layout.points)]
        self.domains = self._domains()
        self._value_bits = [{v: 1 << i for i, v in enumerate(d)} for d in self.domains]
        self._old_index = self._combo_index(self._old_layout)
        self._new_index = self._combo_index(self._new_layout)
        defaults = {name: old.default_of(name) for name in old.key_inputs if name != "backend"}
        #: for each new point, the old point with the same values (None: outside the old space); an
        #: input the old set lacks is dropped, one the new set lacks is at the old set's default
        self._old_at = [self._offset(self._old_layout, self._old_index, {**defaults, **values})
                        for values in self._new_points]
        self._old_only = sorted(set(range(self._old_layout.points)) - set(p for p in self._old_at if p is not None))

    @staticmethod
    def _values(layout, point: int) -> Values:
        """The input values of ``point`` (an offset within one backend's slice)."""
        values: Values = {}
        for (names, combos), stride in zip(layout.dims, layout.strides):
            values.update(zip(names, combos[point // stride % len(combos)]))
        return values

    def _domains(self) -> tuple[tuple[str | None, ...], ...]:
        out = []
        for name in self.names:
            if name == "backend":
                out.append(self.backends)
                continue
            seen = [p[name] for p in (*self._new_points, *self._old_points) if name in p]
            out.append(tuple(dict.fromkeys(seen)))
        return tuple(out)

    def pairs(self, backend: str | None) -> Iterator[tuple[int, int | None, int | None]]:
        """``(new point, old row index, new row index)`` for every point of ``backend``'s slice
        in either set (a row index None: that set does not have the point); a point only the
        old set has comes after the rest as ``(-1 - its old offset, old row, None)``."""
        new_base = self._base(self._new_layout, backend)
        old_base = self._base(self._old_layout, backend)
        new_ids, old_ids = self._new_ids, self._old_ids
        if new_base is not None:
            news = new_ids[new_base:new_base + self._new_layout.points].tolist()
            if old_base is None:
                olds: list[int | None] = [None] * len(news)
            else:
                olds = [None if q is None else old_ids[old_base + q] for q in self._old_at]
            yield from zip(range(len(news)), olds, news)
        if old_base is not None:
            for q in (self._old_only if new_base is not None else range(self._old_layout.points)):
                yield -1 - q, old_ids[old_base + q], None

    @staticmethod
    def _base(layout, backend: str | None) -> int | None:
        try:
            return layout.backends.index(backend) * layout.points
        except ValueError:
            return None

    def values(self, point: int) -> Values:
        """The input values of a point :meth:`pairs` yielded (a negative one: an old-only point,
        with the inputs only the new set has at their defaults)."""
        if point >= 0:
            return self._new_points[point]
        values = dict(self._old_points[-1 - point])
        for name in self.new.key_inputs:
            if name != "backend" and name not in values:
                values[name] = self.new.default_of(name)
        return values

    def box(self, backend: str | None, point: int) -> tuple[int, ...]:
        """The point as one bit per input, bit i = value i of that input's :attr:`domains`."""
        values = self.values(point)
        return tuple(bits[backend if name == "backend" else values.get(name)]
                     for name, bits in zip(self.names, self._value_bits))

    def new_row(self, backend: str | None, point: int) -> int | None:
        """The new set's row index at a new point (None outside its space)."""
        base = self._base(self._new_layout, backend)
        return None if base is None else self._new_ids[base + point]

    def with_default(self, point: int, name: str) -> int | None:
        """The new point equal to ``point`` but for input ``name`` at the new set's default
        (None when that point is outside the new space, or ``point`` is old-only)."""
        if point < 0:
            return None
        return self._offset(self._new_layout, self._new_index, {**self._new_points[point], name: self.new.default_of(name)})

    def old_ignores(self, name: str, same: list[int]) -> bool:
        """Whether the old set decides the same at every point whatever the value of input
        ``name`` (always, when it does not declare the input): ``same`` numbers the old rows,
        equal numbers for rows a user cannot tell apart."""
        old = self.old
        if name not in old.key_inputs:
            return True
        default, layout, ids = old.default_of(name), self._old_layout, self._old_ids
        bases = range(0, layout.size, layout.points)
        for q, values in enumerate(self._old_points):
            if values[name] != default:
                twin = self._offset(layout, self._old_index, {**values, name: default})
                if twin is not None and any(same[ids[base + q]] != same[ids[base + twin]] for base in bases):
                    return False  # an input the old set decides on is found at its first points
        return True

    @staticmethod
    def _combo_index(layout) -> list[dict[tuple, int]]:
        """Per dimension of ``layout``, each value tuple's position."""
        return [{combo: i for i, combo in enumerate(combos)} for _, combos in layout.dims]

    @staticmethod
    def _offset(layout, index: list[dict[tuple, int]], values: Values) -> int | None:
        """The offset of the point with ``values`` in one backend's slice of ``layout`` (None: a
        value ``layout`` does not have)."""
        offset = 0
        for (names, _), stride, where in zip(layout.dims, layout.strides, index):
            at = where.get(tuple(values[n] for n in names))
            if at is None:
                return None
            offset += at * stride
        return offset
