"""The compiled decision array: written by the compiler, read by the evaluator.

One module owns the encoding in both directions, so a format change touches
one file. The array holds one outcome index per input of the decision
space, i.e. per (point, requested backend). Its layout follows the fused
dimensions of :class:`dsv4sel.engine.space.Space` (an input and the inputs scoped
by it, such as platform and capability, form one dimension whose values are
the combinations that exist), with the requested backend outermost:

    offset = backend_index * points + sum(dim_index[d] * stride[d])

The dimensions are laid out smallest first, so the largest one is
contiguous. The compiler paints whole cubes (the regions the verifier's
exact scan finds, see :func:`paint`) with slice assignments instead of
deciding every point in Python; the evaluator's lookup is a few dict probes
and one index. This module imports neither yaml nor jsonschema.
"""

from __future__ import annotations

from operator import itemgetter

TYPE_CHECKING = False
if TYPE_CHECKING:  # the array module is the compiler's; the evaluator reads a memoryview
    from array import array
    from typing import Any, Literal

#: The largest array the compiled form holds (inputs, i.e. points x backend
#: choices): 2 bytes each for fewer than 65,536 distinct outcomes. Beyond it
#: the compiler refuses with one RuleError rather than running out of memory.
MAX_INPUTS = 1 << 26


def _row_type(name: str, fields: str, doc: str) -> type:
    """A tuple type whose items are also read by name, like a namedtuple. Built
    by hand because ``typing`` and ``collections.namedtuple`` would cost the
    cold start a few milliseconds; the rows stay plain tuples for marshal."""
    names = tuple(fields.split())

    def _replace(self, **changes):
        """A copy with ``changes`` (fields by name), like a namedtuple's."""
        return type(self)(changes.pop(n, v) for n, v in zip(names, self))

    namespace = {"__slots__": (), "__doc__": doc, "_fields": names, "_replace": _replace,
                 "__repr__": lambda self: f"{name}({', '.join(f'{n}={v!r}' for n, v in zip(names, self))})"}
    namespace.update({field: property(itemgetter(i)) for i, field in enumerate(names)})
    return type(name, (tuple,), namespace)


def select_row_type(fields: tuple[str, ...]) -> type[SelectRow]:
    """The row type of a select outcome whose profile fields are ``fields``
    (:attr:`dsv4sel.engine.profile.Profile.select_fields`, in order)."""
    made = _SELECT_ROWS.get(fields)
    if made is None:
        made = _SELECT_ROWS[fields] = _row_type(
            "SelectRow", " ".join(("kind", "backend", *fields, "rewrites", "messages", "path", "hosts",
                                    "host_settings")),
            """A compiled outcome: ``backend`` serves, with the profile's select fields by name.
    ``rewrites`` are ``(field, value)`` pairs; ``messages`` ``(level, text)`` pairs, every rule's
    on the path in order; ``path`` the indices of the rules consulted (the deciding rule last);
    ``hosts`` the serving engines' own classes, ``(host, "module:Class", versions)``
    (:mod:`dsv4sel.engine.hosts`); ``host_settings`` what a host must be told,
    ``(host, versions, ((name, value), ...))`` per host entry.""")
    return made


_SELECT_ROWS: dict[tuple[str, ...], type] = {}

if TYPE_CHECKING:
    # What the type checker sees of the rows: one class per kind, told apart by ``kind``
    # (a tagged union: ``row.kind == "select"`` narrows a Row to a SelectRow). At run
    # time they are the tuple types below, built by _row_type.

    #: The kinds of compiled outcome.
    RowKind = Literal["select", "reject", "gap"]

    class SelectRow(tuple):
        kind: Literal["select"]
        backend: str
        rewrites: tuple[tuple[str, Any], ...]
        messages: tuple[tuple[str, str], ...]
        path: tuple[int, ...]
        hosts: tuple[tuple[str, str, str], ...]
        host_settings: tuple[tuple[str, str, tuple[tuple[str, Any], ...]], ...]
        _fields: tuple[str, ...]

        def _replace(self, **changes: Any) -> SelectRow: ...
        def __getattr__(self, name: str) -> Any: ...  # the profile's select fields, by name

    class RejectRow(tuple):
        kind: Literal["reject"]
        backend: str | None
        reason: str
        path: tuple[int, ...]
        messages: tuple[tuple[str, str], ...]
        _fields: tuple[str, ...]

        def _replace(self, **changes: Any) -> RejectRow: ...

    class GapRow(tuple):
        kind: Literal["gap"]
        backend: str | None
        table: str
        path: tuple[int, ...]
        messages: tuple[()]
        _fields: tuple[str, ...]

        def _replace(self, **changes: Any) -> GapRow: ...

    #: Any compiled outcome.
    Row = SelectRow | RejectRow | GapRow
else:
    RejectRow = _row_type("RejectRow", "kind backend reason path messages",
                          "A compiled outcome: the deciding rule rejects, for ``reason``.")
    GapRow = _row_type("GapRow", "kind backend table path",
                       "A compiled outcome: no rule of ``table`` decides (``check`` lists these).")
    GapRow.messages = property(lambda self: ())
    #: Any compiled outcome (a type for annotations); ``row.kind`` is "select", "reject" or "gap".
    Row = tuple


def stored(row: tuple) -> tuple:
    """``row`` as marshal stores it (a plain tuple)."""
    return tuple(row)


def loaded(data: tuple, select_row: type[SelectRow]) -> Row:
    """A stored row as its type (``select_row`` for select rows, from
    :func:`select_row_type`); raises on a row of an unknown kind or the wrong length."""
    kinds: dict[str, type[Row]] = {"select": select_row, "reject": RejectRow, "gap": GapRow}
    kind = kinds[data[0]]
    if len(data) != len(kind._fields):
        raise ValueError(f"a {data[0]} row has {len(data)} fields, not {len(kind._fields)}")
    return kind(data)


class Layout:
    """Where each (point, backend) lives in the flat array.

    ``dims`` lists, per dimension, the names of its inputs and its value
    tuples (see :class:`dsv4sel.engine.space.Dim`), in the space's order;
    ``backends`` the backend choices (None first: the platform default);
    ``order`` the dimensions in memory order, outermost first.
    """

    def __init__(self, dims, backends, order=None):
        self.dims = tuple((tuple(names), tuple(tuple(v) for v in values)) for names, values in dims)
        self.backends = tuple(backends)
        self.order = tuple(order) if order is not None else tuple(
            sorted(range(len(self.dims)), key=lambda d: len(self.dims[d][1])))
        strides = [0] * len(self.dims)
        stride = 1
        for d in reversed(self.order):
            strides[d] = stride
            stride *= len(self.dims[d][1])
        self.strides = tuple(strides)
        self.points = stride
        self.size = stride * len(self.backends)

    @classmethod
    def for_space(cls, space, backends) -> "Layout":
        return cls([(d.inputs, d.values) for d in space.dims], (None, *backends))

    def as_data(self) -> dict:
        return {"dims": self.dims, "backends": self.backends, "order": self.order}

    @classmethod
    def from_data(cls, data: dict) -> "Layout":
        """The layout stored in ``data``; its memory order must be the one the
        compiler writes (smallest dimension outermost), so stored data cannot
        permute the array's dimensions."""
        layout = cls(data["dims"], data["backends"])
        if tuple(data["order"]) != layout.order:
            raise ValueError("the stored dimension order is not the compiled form's")
        return layout


def _runs(bits: int):
    """(start, length) of each run of consecutive set bits, lowest first."""
    start = 0
    while bits:
        skip = (bits & -bits).bit_length() - 1
        bits >>= skip
        start += skip
        length = (~bits & (bits + 1)).bit_length() - 1  # trailing ones
        yield start, length
        bits >>= length
        start += length


def paint(ids: array, layout: Layout, box, backend_index: int, value: int) -> None:
    """Set every input of ``box`` (a cube of the space, one bit mask per
    dimension) requested with backend ``backend_index`` to ``value``.

    Dimensions that the cube covers whole, innermost first, join into one
    contiguous block, so a rule that ignores most inputs costs a handful of
    slice assignments, not one per point."""
    from array import array

    order, strides = layout.order, layout.strides
    k = len(order) - 1
    while k >= 0 and box[order[k]] == (1 << len(layout.dims[order[k]][1])) - 1:
        k -= 1
    base0 = backend_index * layout.points
    if k < 0:
        ids[base0:base0 + layout.points] = array(ids.typecode, [value]) * layout.points
        return
    inner = strides[order[k]]
    runs = [(start * inner, length * inner) for start, length in _runs(box[order[k]])]
    fills: dict[int, array] = {}
    for length in {n for _, n in runs}:
        fills[length] = array(ids.typecode, [value]) * length

    def walk(j: int, base: int) -> None:
        if j == k:
            for start, length in runs:
                ids[base + start:base + start + length] = fills[length]
            return
        d = order[j]
        stride, bits, i = strides[d], box[d], 0
        while bits:
            if bits & 1:
                walk(j + 1, base + i * stride)
            bits >>= 1
            i += 1

    walk(0, base0)


def new_array(layout: Layout, typecode: str = "H") -> array:
    """A zeroed array for ``layout`` (2-byte entries: the compiled form holds at
    most 65,536 outcomes, ``ruleset.MAX_ROWS``)."""
    from array import array

    return array(typecode, bytes(layout.size * array(typecode).itemsize))


def all_below(ids: memoryview, limit: int) -> bool:
    """Whether every entry of ``ids`` is below ``limit`` (a cache entry is
    untrusted: an index past the outcomes must be found before any lookup).

    ``max()`` costs ~20 ns an entry (0.6 s at 30 million); for 2-byte entries
    the test runs on the bytes instead (translate and big-int AND run in C),
    a megabyte at a time so that it needs no copy of the whole array: an
    entry ``hi * 256 + lo`` is below ``limit`` when ``hi`` is below the last
    allowed high byte, or equal to it with ``lo`` not above the last low."""
    if limit <= 0:
        return len(ids) == 0
    if ids.format != "H" or limit > 1 << 16:
        return max(ids, default=0) < limit
    if ids_little_endian() is False:  # pragma: no cover - no big-endian CI machine
        return max(ids, default=0) < limit
    top_high, top_low = divmod(limit - 1, 256)
    above = bytes(1 if b > top_high else 0 for b in range(256))
    at_top = bytes(1 if b == top_high else 0 for b in range(256))
    low_above = bytes(1 if b > top_low else 0 for b in range(256))
    flat = ids.cast("B")
    step = 1 << 20
    for start in range(0, len(flat), step):
        raw = flat[start:start + step].tobytes()
        highs, lows = raw[1::2], raw[0::2]
        if 1 in highs.translate(above):
            return False
        if top_low != 255 and int.from_bytes(highs.translate(at_top), "little") & int.from_bytes(
                lows.translate(low_above), "little"):
            return False
    return True


def ids_little_endian() -> bool:
    import sys

    return sys.byteorder == "little"


def _steps(index: dict, positions: tuple[int, ...], fused: bool, key: tuple,
           vary: dict[int, frozenset | None]) -> list[int]:
    """:meth:`OutcomeTable.around`'s offsets along one dimension: those of the values
    (``index``: value, or for ``fused`` the tuple of the inputs at ``positions``, to its
    offset) that keep ``key``'s value at each position outside ``vary`` and, at each
    position in it, are one of the values given (None: any)."""
    tests = []
    for j, position in enumerate(positions):
        values = vary.get(position, _FIXED)
        if values is not None:  # None: any value passes
            tests.append((j, (key[position],) if values is _FIXED else values))
    if not tests:
        return list(index.values())
    if not fused:
        allowed = tests[0][1]
        return [step for value, step in index.items() if value in allowed]
    return [step for values, step in index.items() if all(values[j] in allowed for j, allowed in tests)]


def _spans(offsets: list[int]) -> list[tuple[int, int]]:
    """``(first, length)`` of each run of consecutive numbers in sorted ``offsets``."""
    spans: list[tuple[int, int]] = []
    for o in offsets:
        if spans and spans[-1][0] + spans[-1][1] == o:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((o, 1))
    return spans


#: :meth:`OutcomeTable.around`: a key position that keeps its value
_FIXED = frozenset({object()})


class OutcomeTable:
    """Read-only mapping from a key ``(*key_inputs)`` to an outcome index, over
    the array :func:`paint` filled. ``key_inputs`` names each key position
    (``backend`` among them); ``data`` is :meth:`Layout.as_data` plus
    ``typecode`` and ``ids`` (raw bytes)."""

    def __init__(self, data: dict, key_inputs):
        self.layout = layout = Layout.from_data(data)
        self.key_inputs = tuple(key_inputs)
        position = {name: i for i, name in enumerate(self.key_inputs)}
        self._backend_at = position["backend"]
        self._backends = {b: i * layout.points for i, b in enumerate(layout.backends)}
        #: per dimension: (key position, None, index) for one input, (-1, positions, index) for fused ones
        lookups: list[tuple[int, tuple[int, ...] | None, dict]] = []
        for (names, values), stride in zip(layout.dims, layout.strides):
            if len(names) == 1:
                index = {v[0]: i * stride for i, v in enumerate(values)}
                lookups.append((position[names[0]], None, index))
            else:
                index = {v: i * stride for i, v in enumerate(values)}
                lookups.append((-1, tuple(position[n] for n in names), index))
        self._lookups = tuple(lookups)
        #: per dimension for :meth:`get`: what picks its value (a fused one's tuple) from a key, and the index
        self._picks = tuple((itemgetter(at) if fused is None else itemgetter(*fused), index)
                            for at, fused, index in lookups)
        #: the dimension whose values are adjacent in the array (stride 1), None without one
        self._contiguous = next((d for d, stride in enumerate(layout.strides) if stride == 1), None)
        if data["typecode"] != "H":
            raise ValueError(f"the decision array's typecode is {data['typecode']!r}, not 'H'")
        self.ids = memoryview(data["ids"]).cast("H")
        if len(self.ids) != layout.size:
            raise ValueError(f"the decision array holds {len(self.ids)} entries, its layout {layout.size}")

    def get(self, key: tuple, default=None):
        """The outcome index of ``key``, or ``default`` when the key is outside the space."""
        try:
            offset = self._backends.get(key[self._backend_at])
            if offset is None:
                return default
            for pick, index in self._picks:
                step = index.get(pick(key))
                if step is None:
                    return default
                offset += step
        except (IndexError, TypeError):
            return default
        return self.ids[offset]

    def around(self, key: tuple, vary: dict[int, frozenset | None]) -> set[int]:
        """The outcome indices at ``key`` and at every key that differs from it only at
        the positions of ``vary``, each to one of the values given there (None: any
        value of the space). One walk over the array's offsets, no key built per point:
        the batch that "does anything here select X?" needs. Empty when ``key`` is
        outside the space at a position that does not vary."""
        offsets = _steps(self._backends, (self._backend_at,), False, key, vary)
        spans = [(0, 1)]  # along the contiguous dimension: (first offset, length) of each run
        for d, (at, fused, index) in enumerate(self._lookups):
            steps = _steps(index, (at,) if fused is None else fused, fused is not None, key, vary)
            if d == self._contiguous:
                spans = _spans(sorted(steps))
            else:
                offsets = [o + s for o in offsets for s in steps]
        ids, found = self.ids, set()
        for o in offsets:  # a slice per run: the largest dimension is read in C, not offset by offset
            for start, length in spans:
                found.update(ids[o + start:o + start + length].tolist())
        return found

    def tally(self, key: tuple, vary: dict[int, tuple]) -> tuple[dict[int, int], dict[int, tuple], int]:
        """Over ``key`` and every key that differs from it at the positions of ``vary``, each
        to one of the (distinct) values given there: how many keys give each outcome index,
        one such key per index, and how many of the keys lie outside the space. The counting
        form of :meth:`around` (``dsv4sel check`` counts a host's space with it)."""
        import collections
        import math

        allowed: dict[int, frozenset | None] = {position: frozenset(values) for position, values in vary.items()}
        offsets = _steps(self._backends, (self._backend_at,), False, key, allowed)
        spans = [(0, 1)]
        for d, (at, fused, index) in enumerate(self._lookups):
            steps = _steps(index, (at,) if fused is None else fused, fused is not None, key, allowed)
            if d == self._contiguous:
                spans = _spans(sorted(steps))
            else:
                offsets = [o + s for o in offsets for s in steps]
        ids = self.ids
        counts: collections.Counter = collections.Counter()
        first: dict[int, int] = {}
        for o in offsets:
            for start, length in spans:
                chunk = ids[o + start:o + start + length].tolist()
                counts.update(chunk)
                for value in set(chunk).difference(first):
                    first[value] = o + start + chunk.index(value)
        expected = math.prod(len(values) for values in vary.values())
        return dict(counts), {i: self.key_at(o) for i, o in first.items()}, expected - sum(counts.values())

    def key_at(self, offset: int) -> tuple:
        """The key whose outcome sits at ``offset`` of the array (the inverse of :meth:`get`)."""
        layout = self.layout
        value_of: dict[str, Any] = {"backend": layout.backends[offset // layout.points]}
        rest = offset % layout.points
        for (names, values), stride in zip(layout.dims, layout.strides):
            picked = values[(rest // stride) % len(values)]
            for name, v in zip(names, picked):
                value_of[name] = v
        return tuple(value_of[name] for name in self.key_inputs)

    def __getitem__(self, key: tuple) -> int:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key) -> bool:
        return self.get(key) is not None

    def __len__(self) -> int:
        return len(self.ids)

    def keys(self):
        """Every key, backend outermost, then the dimensions in the space's order."""
        import itertools

        layout = self.layout
        where = {n: (d, k) for d, (names, _) in enumerate(layout.dims) for k, n in enumerate(names)}
        slots = [("backend", None) if n == "backend" else where[n] for n in self.key_inputs]
        for backend in layout.backends:
            for combo in itertools.product(*(values for _, values in layout.dims)):
                yield tuple(backend if d == "backend" else combo[d][k] for d, k in slots)

    __iter__ = keys

    def items(self):
        for key in self.keys():
            yield key, self[key]

    def values(self):
        return iter(self.ids)
