"""Exact analysis of one decision table over a cube, without visiting points.

For every dimension and value, :class:`TableIndex` precomputes a Python int
whose bit ``r`` is set when rule ``r`` accepts that value. :func:`scan`
recurses over the dimensions AND-ing these masks, so every prefix of the
space is handled once with the set of rules that can still match it
(prefix sharing), and values that leave the same rules are taken together
(so the recursion runs over classes of values, i.e. cubes, not values). A
branch stops as soon as its answer is known for the whole remaining cube:

* no rule left: the whole cube is a gap;
* the first rule left accepts everything that remains: it wins the cube;
* one rule left: it wins its box, the rest is a handful of gap cubes;
* every rule left ignores the next dimension: that dimension is skipped.

The last dimension is swept: the rules left are taken in table order, each
wins the values no earlier rule took. So the cost grows with the number of
distinct rule boxes, not with the number of points.

:func:`intersect_masks` finds, for every rule, the other rules whose boxes
intersect its own; over fused dimensions (see :mod:`dsv4sel.engine.space`) that is
exact, so overlaps need no enumeration either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .space import Box, Space, iter_bits


def mask_of(indices, n: int) -> int:
    """An int with the bits ``indices`` set (one allocation, not one per bit)."""
    raw = bytearray((n + 8) // 8)
    for i in indices:
        raw[i >> 3] |= 1 << (i & 7)
    return int.from_bytes(raw, "little")


class TableIndex:
    """The bit masks of one table's rules over a :class:`Space`.

    ``boxes[r]`` is rule ``r``'s cube (rules in table order). ``groups[d]``
    lists each distinct value bitset used on dimension ``d`` with the mask of
    rules using it; ``value_masks[d][i]`` is the mask of rules accepting value
    ``i`` of dimension ``d``.
    """

    def __init__(self, space: Space, conditions: list):
        self.space = space
        self.n = n = len(conditions)
        self.boxes: list[Box] = [space.rule_cube(c) for c in conditions]
        self.all = (1 << n) - 1
        self.groups: list[list[tuple[int, int]]] = []
        self.value_masks: list[list[int]] = []
        self.constrained: list[int] = []
        for d in space.dims:
            by_bits: dict[int, list[int]] = {}
            for r, box in enumerate(self.boxes):
                by_bits.setdefault(box[d.index], []).append(r)
            groups = [(bits, mask_of(rs, n)) for bits, rs in by_bits.items()]
            masks = [0] * len(d)
            for bits, mask in groups:
                for i in iter_bits(bits):
                    masks[i] |= mask
            self.groups.append(groups)
            self.value_masks.append(masks)
            self.constrained.append(sum(len(rs) for bits, rs in by_bits.items() if bits != d.full))
        # Dimensions no rule constrains come first (they are skipped for
        # free); then branch on the narrow ones and sweep the widest last:
        # branching costs one AND per value, the sweep one step per rule left.
        self.order: tuple[int, ...] = tuple(
            d.index for d in sorted(space.dims, key=lambda d: (self.constrained[d.index] > 0, len(d), d.index)))

    def free_masks(self, dom: Box) -> list[int]:
        """Per dimension, the rules that accept every value of ``dom`` there."""
        out = []
        for d, groups in enumerate(self.groups):
            want = dom[d]
            free = 0
            for bits, mask in groups:
                if bits & want == want:
                    free |= mask
            out.append(free)
        return out


@dataclass
class Scan:
    """What :func:`scan` found in one table over one cube (``domain``).

    ``won[r]`` counts the points rule ``r`` decides (it is the first rule
    that matches them); ``gaps`` are disjoint cubes no rule matches;
    ``regions[r]`` are disjoint cubes where ``r`` wins, kept only for the
    rules asked for; ``first[r]`` is one cube where ``r`` wins (for a
    counterexample). Sizes add up: sum(won) + sum(gap sizes) == size(domain).
    """

    domain: Box
    won: list[int]
    gaps: list[Box] = field(default_factory=list)
    regions: dict[int, list[Box]] = field(default_factory=dict)
    first: dict[int, Box] = field(default_factory=dict)


def scan(index: TableIndex, domain: Box | None = None, record=None) -> Scan:
    """Decide every point of ``domain`` (default: the whole space) with the
    table's first-hit order. ``record`` is a set of rule positions whose win
    regions to keep, or None to keep all."""
    space = index.space
    dom = tuple(domain) if domain is not None else space.full
    boxes = index.boxes
    order = index.order
    nd = len(order)
    last = nd - 1
    vm = index.value_masks
    free = index.free_masks(dom)
    out = Scan(dom, [0] * index.n)
    won, gaps, regions, first = out.won, out.gaps, out.regions, out.first
    if not all(dom):
        return out
    cur = list(dom)
    # points per remaining suffix of the order: the weight of a pruned branch
    suffix = [1] * (nd + 1)
    for k in range(nd - 1, -1, -1):
        suffix[k] = suffix[k + 1] * dom[order[k]].bit_count()

    def win(r: int, count: int, box: Box) -> None:
        if not won[r]:
            first[r] = box
        won[r] += count
        if record is None or r in record:
            regions.setdefault(r, []).append(box)

    def free_from(r: int, k: int) -> bool:
        b = boxes[r]
        for d in order[k:]:
            if b[d] & dom[d] != dom[d]:
                return False
        return True

    def single(r: int, k: int, weight: int) -> None:
        b = boxes[r]
        inter = list(cur)
        count = weight
        for d in order[k:]:
            x = b[d] & dom[d]
            inter[d] = x
            count *= x.bit_count()
        if count:
            win(r, count, tuple(inter))
        # the rest of the cube as disjoint cubes: outside r on the first
        # remaining dimension, or inside it there and outside on the next, ...
        g = list(cur)
        for d in order[k:]:
            x = b[d] & dom[d]
            rest = dom[d] & ~x
            if rest:
                g[d] = rest
                gaps.append(tuple(g))
            if not x:
                break
            g[d] = x

    def sweep(m: int, d: int, weight: int) -> None:
        remaining = dom[d]
        for r in iter_bits(m):
            take = boxes[r][d] & remaining
            if take:
                cur[d] = take
                win(r, weight * take.bit_count(), tuple(cur))
                remaining ^= take
                if not remaining:
                    break
        if remaining:
            cur[d] = remaining
            gaps.append(tuple(cur))
        cur[d] = dom[d]

    def walk(k: int, m: int, weight: int) -> None:
        if k == nd:
            if m:
                win((m & -m).bit_length() - 1, weight, tuple(cur))
            else:
                gaps.append(tuple(cur))
            return
        if not m:
            gaps.append(tuple(cur))
            return
        low = m & -m
        r = low.bit_length() - 1
        if free_from(r, k):
            win(r, weight * suffix[k], tuple(cur))
            return
        if m == low:
            single(r, k, weight)
            return
        d = order[k]
        if not (m & ~free[d]):  # no rule left looks at d
            walk(k + 1, m, weight * dom[d].bit_count())
            return
        if k == last:
            sweep(m, d, weight)
            return
        classes: dict[int, int] = {}
        masks = vm[d]
        for i in iter_bits(dom[d]):
            sub = m & masks[i]
            classes[sub] = classes.get(sub, 0) | (1 << i)
        for sub, bits in classes.items():
            cur[d] = bits
            walk(k + 1, sub, weight * bits.bit_count())
        cur[d] = dom[d]

    walk(0, index.all, 1)
    return out


def intersect_masks(index: TableIndex) -> list[int]:
    """For each rule ``r``, the mask of the other rules whose boxes intersect
    ``r``'s, i.e. that match at least one common point (0 for a dead rule).

    The rules meeting ``r`` on one dimension are those accepting one of its
    values there: an OR of a few per-value masks, memoized per distinct
    condition. Boxes intersect when they meet on every dimension: an AND.
    """
    memo: dict[tuple[int, int], int] = {}
    vm = index.value_masks
    out = []
    for r, box in enumerate(index.boxes):
        if not all(box):
            out.append(0)
            continue
        m = index.all & ~(1 << r)
        for d, bits in enumerate(box):
            if not m:
                break
            key = (d, bits)
            touching = memo.get(key)
            if touching is None:
                touching = memo[key] = _or_values(vm[d], bits)
            m &= touching
        out.append(m)
    return out


def _or_values(masks: list[int], bits: int) -> int:
    out = 0
    for i in iter_bits(bits):
        out |= masks[i]
    return out
