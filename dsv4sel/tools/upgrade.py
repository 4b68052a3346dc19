"""``dsv4sel upgrade``: what changes for a user who moves from one release of a host to another.

Each release of a host has a compat rule set (``rules/compat/vllm-0.33``: what that release
itself decides, :data:`dsv4sel.dsv4.host_registry.HOSTS`). :func:`upgrade` compares the two
sets at every input of either space, as a user of that host meets them (:class:`View`: the
compiled row, with the host's class and block size for that release read from the rule's
``hosts:`` entry), and sorts every changed input into one :data:`CATEGORIES` entry, in this
order:

- ``input``: an input the old release ignores decides now (``lora``): the new release decides
  differently than at that input's default, where the old one decided the same;
- ``reworded``: refused (or undecided) before and after, for another reason;
- ``accepted`` / ``refused``: an explicit ``--attention-backend`` built by one release and
  refused (or not known) by the other;
- ``to_refusal`` / ``to_decision``: with no backend named, a decision that became a refusal
  (or an error the host raises) and the reverse;
- both select: ``default`` / ``backend`` (another backend, with no backend named / for a name),
  ``class`` (the host's class), ``format`` (layout, cache dtype, torch dtype, bytes per token,
  rewrites), ``block`` (block size), ``other`` (log lines, dsv4sel's own impl).

Changed inputs of one category whose two sides show alike (:class:`Gist`) form a
:class:`Group`, written as cubes; each group keeps its exact outcome pairs
(:class:`Detail`). Values only: :mod:`dsv4sel.cli.render.upgrade` writes them.
"""

from __future__ import annotations

from ..dsv4.host_registry import Host, Release
from ..dsv4.rules import RuleSet
from ..engine.hosts import version_matches
from ..record import Frozen
from .aligned import Aligned
from .diff import ABSENT, Outcome, cubes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..engine.artifact import Row

#: Every category, in the order a report lists them.
CATEGORIES = ("input", "accepted", "refused", "default", "backend", "to_refusal", "to_decision",
              "class", "format", "block", "other", "reworded")
#: The categories in which nothing a user builds or is refused changes: a refusal's reason, a log line.
WORDING = ("other", "reworded")
#: The fields a group shows when both sides select and they differ, in this order; where
#: none of them differs, the :data:`MINOR_FIELDS` that do (the ``other`` category).
SHOWN_FIELDS = ("host_class", "layout", "cache_dtype", "torch_dtype", "bytes_per_token", "block_size", "rewrites")
MINOR_FIELDS = ("impl", "messages")
FORMAT_FIELDS = ("layout", "cache_dtype", "torch_dtype", "bytes_per_token", "rewrites")


class View(Frozen):
    """What a user of one release of a host meets at one input: the compiled ``outcome``
    (:class:`~dsv4sel.tools.diff.Outcome`, without the classes and settings of any host), the
    ``host_class`` the rule names for that release (None: none, or not a selection) and the
    ``block_size`` that release builds (its ``hosts:`` entry's ``settings: block_size`` where
    it has one, else the selection's)."""

    __slots__ = ("outcome", "host_class", "block_size")
    outcome: Outcome
    host_class: str | None
    block_size: int | None

    @property
    def kind(self) -> str:
        return self.outcome.kind

    def field(self, name: str):
        """A selection's field as a user meets it (``host_class`` and ``block_size`` for this release)."""
        if name in ("host_class", "block_size"):
            return getattr(self, name)
        return getattr(self.outcome, name)


ABSENT_VIEW = View(ABSENT, None, None)


def view(row: Row, host: str, version: str) -> View:
    """``row`` as a user of ``host`` ``version`` meets it."""
    if row.kind != "select":
        return View(Outcome(row._replace(path=(), messages=()) if row.kind == "reject" else row._replace(path=())),
                    None, None)
    classes = [cls for name, cls, versions in row.hosts if name == host and version_matches(version, versions)]
    block = row.block_size
    for name, versions, settings in row.host_settings:
        if name == host and version_matches(version, versions):
            block = dict(settings).get("block_size", block)
    return View(Outcome(row._replace(path=(), hosts=(), host_settings=())), classes[0] if classes else None, block)


class Gist(Frozen):
    """One side of a group as a report shows it: ``kind`` (``select``, ``refused``,
    ``undecided``, ``absent``), the ``backend`` selected (or, for a refusal, the backend whose
    rules refuse, when it is not the one asked for) and, when both sides select, the
    ``fields`` that differ as ``(name, value)`` pairs (:data:`SHOWN_FIELDS`, or where none
    does and the backend is the same, :data:`MINOR_FIELDS`); a selection facing a refusal
    shows its host class."""

    __slots__ = ("kind", "backend", "fields")
    kind: str
    backend: str | None
    fields: tuple[tuple[str, object], ...]


class Detail(Frozen):
    """``count`` inputs (written as ``cubes``) that go from exactly ``old`` to ``new``."""

    __slots__ = ("count", "cubes", "old", "new")
    count: int
    cubes: tuple[str, ...]
    old: View
    new: View


class Group(Frozen):
    """``count`` changed inputs of one category (as ``cubes``) whose sides show as ``old`` and
    ``new``; ``details`` are their exact outcome pairs, largest first."""

    __slots__ = ("count", "cubes", "old", "new", "details")
    count: int
    cubes: tuple[str, ...]
    old: Gist
    new: Gist
    details: tuple[Detail, ...]


class Category(Frozen):
    """The changed inputs of one :data:`CATEGORIES` entry (``name``; ``input`` names the input
    for ``input``), ``count`` of them, in groups, largest first."""

    __slots__ = ("name", "input", "count", "groups")
    name: str
    input: str | None
    count: int
    groups: tuple[Group, ...]


class Upgrade(Frozen):
    """Moving ``host`` (its ``label``) from release ``old`` to ``new`` (their compat sets
    ``old_rules``, ``new_rules`` as shown): ``compared`` inputs of either space, and every
    changed one in its category (only the non-empty ones, in :data:`CATEGORIES` order)."""

    __slots__ = ("host", "label", "old", "new", "old_rules", "new_rules", "compared", "categories")  # noqa: RUF023
    host: str
    label: str
    old: str
    new: str
    old_rules: str
    new_rules: str
    compared: int
    categories: tuple[Category, ...]

    @property
    def changed(self) -> int:
        return sum(c.count for c in self.categories)

    @property
    def decided(self) -> int:
        """The changed inputs a user builds (or is refused) differently: all but :data:`WORDING`."""
        return sum(c.count for c in self.categories if c.name not in WORDING)


# ------------------------------------------------------------------ the comparison

class _Sides:
    """Both rule sets' rows as views, numbered so that equal views share a number."""

    def __init__(self, host: str, old: tuple[RuleSet, str], new: tuple[RuleSet, str]):
        self.views: list[View] = [ABSENT_VIEW]
        numbers: dict[View, int] = {ABSENT_VIEW: 0}

        def number(rules: RuleSet, version: str) -> list[int]:
            out = []
            for row in rules.rows:
                v = view(row, host, version)
                out.append(numbers.setdefault(v, len(numbers)))
                if out[-1] == len(self.views):
                    self.views.append(v)
            return out

        self.old = number(*old)
        self.new = number(*new)


def upgrade(host: Host, old_release: Release, new_release: Release, old: RuleSet, new: RuleSet,
            shown: tuple[str, str]) -> Upgrade:
    """Every input whose outcome differs between ``old`` (release ``old_release``'s compat set)
    and ``new``, as a user of ``host`` meets them, in categories; ``shown`` names the two
    rule sets in the report."""
    aligned = Aligned(old, new)
    sides = _Sides(host.name, (old, old_release.version), (new, new_release.version))
    inputs = _new_inputs(aligned, sides)
    boxes: dict[tuple, list] = {}
    compared = 0
    for backend in aligned.backends:
        for point, oi, ni in aligned.pairs(backend):
            compared += 1
            a = 0 if oi is None else sides.old[oi]
            b = 0 if ni is None else sides.new[ni]
            if a != b:
                name, deciding = _classify(sides, aligned, inputs, backend, point, a, b)
                boxes.setdefault((name, deciding, a, b), []).append(aligned.box(backend, point))
    return Upgrade(host.name, host.label, old_release.version, new_release.version, *shown, compared,
                   _categories(aligned, sides, boxes))


def _new_inputs(aligned: Aligned, sides: _Sides) -> tuple[str, ...]:
    """The new set's inputs (with a default) that the old set never decides on: whatever their
    value, it builds the same or refuses (a refusal's reason may name the input)."""
    new = aligned.new
    built = [n if sides.views[n].kind == "select" else 0 for n in sides.old]
    return tuple(name for name in new.key_inputs
                 if name != "backend" and new.default_of(name) is not None and aligned.old_ignores(name, built))


def _classify(sides: _Sides, aligned: Aligned, inputs: tuple[str, ...], backend: str | None, point: int,
              a: int, b: int) -> tuple[str, str | None]:
    """(category, the deciding input for ``input``) of one changed input."""
    old, new = sides.views[a], sides.views[b]
    if old.kind != "select" and new.kind != "select":
        return "reworded", None
    values = aligned.values(point)
    for name in inputs:
        if values.get(name) != aligned.new.default_of(name):
            twin = aligned.with_default(point, name)
            row = None if twin is None else aligned.new_row(backend, twin)
            if row is not None and sides.new[row] != b:
                return "input", name
    return _outcome_category(old, new, backend is None), None


def _outcome_category(old: View, new: View, default: bool) -> str:
    """The category of a change that no new input explains (``default``: no backend named)."""
    if old.kind != "select":
        return "to_decision" if default else "accepted"
    if new.kind != "select":
        return "to_refusal" if default else "refused"
    if old.outcome.backend != new.outcome.backend:
        return "default" if default else "backend"
    if old.host_class != new.host_class:
        return "class"
    if any(old.field(f) != new.field(f) for f in FORMAT_FIELDS):
        return "format"
    return "block" if old.block_size != new.block_size else "other"


def gist(side: View, other: View, requested: str | None) -> Gist:
    """How ``side`` shows in a group, facing ``other`` (see :class:`Gist`)."""
    if side.kind == "absent":
        return Gist("absent", None, ())
    if side.kind == "gap":
        return Gist("undecided", None, ())
    if side.kind == "reject":
        backend = side.outcome.backend
        return Gist("refused", None if backend == requested else backend, ())
    if other.kind != "select":
        return Gist("select", side.outcome.backend, (("host_class", side.host_class),))
    fields = tuple((f, side.field(f)) for f in SHOWN_FIELDS if side.field(f) != other.field(f))
    if not fields and side.outcome.backend == other.outcome.backend:
        fields = tuple((f, side.field(f)) for f in MINOR_FIELDS if side.field(f) != other.field(f))
    return Gist("select", side.outcome.backend, fields)


def _categories(aligned: Aligned, sides: _Sides, boxes: dict[tuple, list]) -> tuple[Category, ...]:
    """The changed inputs (boxes by category, deciding input, old and new view number),
    grouped as a report shows them: by category, then by how both sides show (:func:`gist`)."""
    names, domains = aligned.names, [list(d) for d in aligned.domains]
    at = names.index("backend")
    grouped: dict[tuple, dict[tuple, list]] = {}
    gists: dict[tuple, tuple[Gist, Gist]] = {}
    for (name, deciding, a, b), points in boxes.items():
        old, new = sides.views[a], sides.views[b]
        for box in points:
            requested = domains[at][box[at].bit_length() - 1]
            key = gists.get((a, b, requested))
            if key is None:
                key = gists[a, b, requested] = (gist(old, new, requested), gist(new, old, requested))
            grouped.setdefault((name, deciding), {}).setdefault(key, []).append((a, b, box))
    out = []
    for (name, deciding) in sorted(grouped, key=lambda k: (CATEGORIES.index(k[0]), k[1] or "")):
        groups = [_group(names, domains, sides, key, members) for key, members in grouped[(name, deciding)].items()]
        groups.sort(key=lambda g: (-g.count, g.cubes))
        out.append(Category(name, deciding, sum(g.count for g in groups), tuple(groups)))
    return tuple(out)


def _group(names, domains, sides: _Sides, key: tuple[Gist, Gist], members: list) -> Group:
    by_pair: dict[tuple[int, int], list] = {}
    for a, b, box in members:
        by_pair.setdefault((a, b), []).append(box)
    details = sorted((Detail(len(bs), cubes(names, domains, bs), sides.views[a], sides.views[b])
                      for (a, b), bs in by_pair.items()), key=lambda d: (-d.count, d.cubes))
    return Group(len(members), cubes(names, domains, [box for _, _, box in members]), *key, tuple(details))
