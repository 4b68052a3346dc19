"""The support matrix, generated from the compiled rules (``dsv4sel table``).

Like the "DeepSeek V4 Decode Backends" table of vLLM's attention-backend
docs, but derived point by point from the decision table, so it cannot drift
from the rules: a row is one backend on a set of capabilities with the kv
dtypes that give the same cache there. Rows are compressed: capabilities
whose results are identical share a row, and a complete capability family
(every declared ``9.*`` value...) is written ``9.x``. Rule warnings become
numbered notes, so special cases are documented by the rules themselves.

Built from the compiled table only (:mod:`dsv4sel.tools.probe`): no yaml, no torch.
:func:`build_matrix` returns a :class:`Matrix` value and renders nothing; its
Markdown (``docs/backends.md``, checked in CI) is
:func:`dsv4sel.cli.render.table.markdown`, its JSON :meth:`Matrix.as_dict`. Both
are deterministic, byte for byte, for a given rule set.
"""

from __future__ import annotations

from . import probe
from ..engine.artifact import Row as OutcomeRow
from ..engine.families import compact
from ..engine.hosts import hosts_dict
from ..record import Frozen
from ..dsv4.rules import RuleSet
from ..dsv4.selection import Query
from ..engine.values import RuleRef

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Version of the :meth:`Matrix.as_dict` layout.
JSON_VERSION = 1


class Row(Frozen):
    """One line of the matrix.

    ``capabilities`` are the declared values the row covers, ``label`` their
    compressed spelling. ``condition`` holds the pack-declared inputs the row
    needs (e.g. ``(("mega_attn", "available"),)``), empty when the result is
    the same for all their values. ``cache_dtype`` is the cache dtype string
    the engine carries, or ``as requested`` when each kv dtype keeps its own
    string. ``default`` is ``yes`` (the platform default picks this backend
    for all the row's kv dtypes), ``no``, or ``with a, b`` (only for those).
    ``notes`` are 1-based indices into :attr:`Matrix.notes`.
    """

    __slots__ = ("model", "backend", "platform", "capabilities", "label", "condition", "kv_cache_dtypes",
                 "layout", "cache_dtype", "torch_dtype", "bytes_per_token", "block_size", "default", "impl",
                 "notes", "hosts", "host_settings")
    _defaults = {"hosts": (), "host_settings": ()}
    model: str
    backend: str
    platform: str
    capabilities: tuple[str, ...]
    label: str
    condition: tuple[tuple[str, str], ...]
    kv_cache_dtypes: tuple[str, ...]
    layout: str
    cache_dtype: str
    torch_dtype: str
    bytes_per_token: int
    block_size: int
    default: str
    impl: str
    notes: tuple[int, ...]
    hosts: tuple[tuple[str, str, str], ...]
    host_settings: tuple[tuple[str, str, tuple[tuple[str, str | int], ...]], ...]


class Unsupported(Frozen):
    """Capabilities of a platform on which no backend selects ``model`` with
    any kv dtype or input value, and the rule that rejects the default query there."""

    __slots__ = ("model", "platform", "capabilities", "label", "rule")
    model: str
    platform: str
    capabilities: tuple[str, ...]
    label: str
    rule: RuleRef


class Matrix(Frozen):
    """The whole matrix: rows, the notes they reference (rule warnings), the
    capabilities nothing serves, the models in order (the default first) and
    the rule files it was generated from."""

    __slots__ = ("rows", "notes", "unsupported", "models", "sources")
    rows: tuple[Row, ...]
    notes: tuple[str, ...]
    unsupported: tuple[Unsupported, ...]
    models: tuple[str, ...]
    sources: tuple[str, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": JSON_VERSION,
            "sources": list(self.sources),
            "models": list(self.models),
            "rows": [{
                "model": r.model, "backend": r.backend, "platform": r.platform,
                "capabilities": list(r.capabilities), "label": r.label, "condition": dict(r.condition),
                "kv_cache_dtypes": list(r.kv_cache_dtypes), "layout": r.layout, "cache_dtype": r.cache_dtype,
                "torch_dtype": r.torch_dtype, "bytes_per_token": r.bytes_per_token, "block_size": r.block_size,
                "default": r.default, "impl": r.impl, "notes": list(r.notes),
                "hosts": hosts_dict(r.hosts, r.host_settings),
            } for r in self.rows],
            "notes": list(self.notes),
            "unsupported": [{
                "model": u.model, "platform": u.platform, "capabilities": list(u.capabilities), "label": u.label,
                "rule": None if u.rule is None else {"id": u.rule.id, "location": u.rule.location},
            } for u in self.unsupported],
        }


# ------------------------------------------------------------------ building

def capability_label(caps: tuple[str, ...], declared: tuple[str, ...]) -> str:
    """Compress ``caps`` (a subset of the platform's ``declared`` values):
    ``any`` when it is all of them, a family ``9.x`` when it holds every
    declared member of the family, else the values themselves."""
    if set(caps) == set(declared):
        return "any"
    return ", ".join(compact([v for v in declared if v in caps], declared, min_members=1))


def _warnings(row: OutcomeRow) -> tuple[str, ...]:
    if row.kind == "select":
        return tuple(text for level, text in row.messages if level == "warning")
    return ()


def _models(rules: RuleSet) -> tuple[str, ...]:
    models = rules.values("model")
    default = rules.default_of("model")
    return tuple(sorted(models, key=lambda m: m != default))  # stable: the default model first


def _groups(rules: RuleSet, query: Query, backend: str) -> tuple:
    """What ``backend`` gives at ``query``'s point for every kv dtype, grouped
    by the cache it selects: ``((layout, torch, bytes, block, impl), items)``
    with items ``(kv, cache dtype, is default, warnings)``."""
    groups: dict[tuple, list] = {}
    for kv in rules.values("kv_cache_dtype"):
        row = probe.at(rules, query, backend, kv)
        if not probe.serves(row, backend):
            continue
        default_row = probe.at(rules, query, None, kv)
        is_default = probe.serves(default_row, backend) and rules.same_result(default_row, row)
        warnings = _warnings(row) + (_warnings(default_row) if is_default else ())
        key = (row.layout, row.torch_dtype, row.bytes_per_token, row.block_size, row.impl, row.hosts,
               row.host_settings)
        groups.setdefault(key, []).append((kv, row.cache_dtype, is_default, warnings))
    return tuple((key, tuple(items)) for key, items in groups.items())


def _declared(rules: RuleSet, extra: tuple, model: str, platform: str) -> bool:
    """True when every value of ``extra`` is declared where it is scoped (an input declared per
    model or per platform, e.g. ``prefill_context_parallel`` by model)."""
    point = {"model": model, "platform": platform}
    return all(rules.declared_at(name, value, point) for name, value in extra)


#: what a backend gives at one point, per condition on the pack-declared inputs:
#: ``((condition, groups of :func:`_groups`), ...)``; empty when it gives nothing there
Signature = tuple[tuple[tuple[tuple[str, str], ...], tuple], ...]


def _signature(rules: RuleSet, model: str, platform: str, cap: str, backend: str,
               combos: list[tuple[tuple[str, str], ...]]) -> Signature:
    """What ``backend`` gives at one point under each combination of the pack-declared inputs."""
    per_combo = [(extra, _groups(rules, Query(model, platform, cap, None, "auto", extra), backend))
                 for extra in combos]
    if all(g == per_combo[0][1] for _, g in per_combo):
        # the pack-declared inputs do not matter here: no condition
        return (((), per_combo[0][1]),) if per_combo[0][1] else ()
    return tuple((extra, g) for extra, g in per_combo if g)


def build_matrix(rules: RuleSet) -> Matrix:
    """The support matrix of ``rules`` (see the module docstring)."""
    combos = probe.extra_combos(rules)
    notes: list[str] = []
    rows: list[Row] = []

    def note(text: str) -> int:
        if text not in notes:
            notes.append(text)
        return notes.index(text) + 1

    for model in _models(rules):
        for backend in rules.selectable_backends:
            for platform in rules.values("platform"):
                declared = rules.values("capability", platform)
                by_signature: dict[Signature, list[str]] = {}
                here = [extra for extra in combos if _declared(rules, extra, model, platform)]
                for cap in declared:
                    signature = _signature(rules, model, platform, cap, backend, here)
                    if signature:
                        by_signature.setdefault(signature, []).append(cap)
                for signature, caps in by_signature.items():
                    label = capability_label(tuple(caps), declared)
                    for condition, groups in signature:
                        for (layout, torch_dtype, bpt, block, impl, hosts, settings), items in groups:
                            rows.append(_row(model, backend, platform, tuple(caps), label, condition, layout,
                                             torch_dtype, bpt, block, impl, items, note, hosts, settings))
    return Matrix(tuple(rows), tuple(notes), _unsupported(rules, combos), _models(rules), rules.sources)


def _row(model, backend, platform, caps, label, condition, layout, torch_dtype, bpt, block, impl, items,
         note, hosts=(), host_settings=()) -> Row:
    cache = {c for _, c, _, _ in items}
    if len(cache) == 1:
        cache_col = next(iter(cache))
    elif all(c == kv for kv, c, _, _ in items):
        cache_col = "as requested"
    else:
        cache_col = ", ".join(f"{kv} -> {c}" for kv, c, _, _ in items)
    defaults = [kv for kv, _, d, _ in items if d]
    default = ("yes" if len(defaults) == len(items) else "no" if not defaults
               else "with " + ", ".join(defaults))
    refs = tuple(sorted({note(w) for *_, ws in items for w in ws}))
    return Row(model, backend, platform, caps, label, condition, tuple(kv for kv, *_ in items), layout,
               cache_col, torch_dtype, bpt, block, default, impl, refs, tuple(hosts), tuple(host_settings))


def _unsupported(rules: RuleSet, combos: list) -> tuple[Unsupported, ...]:
    out: list[Unsupported] = []
    kvs = rules.values("kv_cache_dtype")
    backends = (None, *rules.selectable_backends)
    default_extra = probe.default_extra(rules)
    for model in _models(rules):
        for platform in rules.values("platform"):
            declared = rules.values("capability", platform)
            by_rule: dict[RuleRef | None, list[str]] = {}
            for cap in declared:
                query = Query(model, platform, cap, None, "auto", default_extra)
                if any(probe.at(rules, query, b, kv, extra=e)[0] == "select"
                       for b in backends for e in combos if _declared(rules, e, model, platform) for kv in kvs):
                    continue
                path = probe.path_of(probe.at(rules, query, None, "auto"))
                by_rule.setdefault(rules.rule(path[-1]) if path else None, []).append(cap)
            for rule, caps in by_rule.items():
                out.append(Unsupported(model, platform, tuple(caps), capability_label(tuple(caps), declared),
                                       rule))
    return tuple(out)
