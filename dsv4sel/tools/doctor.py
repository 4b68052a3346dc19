"""The machine report behind ``dsv4sel doctor``: what this machine is, what the
rules pick on it, and which impl classes can run.

:func:`build_report` gathers three things into a frozen :class:`Report`:

1. the machine (:func:`dsv4sel.dsv4.platform.machine`, the one machine detection,
   which ``dsv4sel explain --detect`` fills its query from too): platform and
   capability (torch or ``DSV4SEL_PLATFORM``; or given, to ask about another
   machine), the torch version or why torch is missing, and the pack-declared
   inputs read from their probe classes;
2. the outcome of the rules there for ``auto`` and every other kv dtype, with
   no ``--attention-backend``;
3. for every impl class the rules name: whether it loads through the rule
   set's allow-list and whether its kernel library can run (the class's
   ``is_available(platform, capability)``, asked through
   :func:`dsv4sel.dsv4.platform.impl_available`, as the probes are).

It returns values and renders nothing: ``dsv4sel doctor`` prints the report
with :mod:`dsv4sel.cli.render.doctor` or, with ``--json``, :meth:`Report.as_dict`.
Unlike ``explain`` this imports torch. It never raises for a missing torch, a
missing kernel module or a kernel adapter's bug: each becomes a line of the
report.
"""

from __future__ import annotations

from ..dsv4.platform import InputProbe, Machine, impl_available, machine as read_machine, probe_inputs
from ..dsv4.rules import Rejection, RuleSet
from ..dsv4.selection import Query, Selection
from ..engine.values import Message
from ..record import Frozen

__all__ = ["ImplCheck", "InputProbe", "Machine", "Report", "UnknownPlatform", "build_report", "impl_checks",
           "probe_inputs"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Version of the :meth:`Report.as_dict` layout.
JSON_VERSION = 1


class ImplCheck(Frozen):
    """One impl class the rules name, the backends that use it, and whether it
    can run (``reason`` says why or why not)."""

    __slots__ = ("impl", "backends", "available", "reason")
    impl: str
    backends: tuple[str, ...]
    available: bool
    reason: str


class Report(Frozen):
    """The doctor's findings. ``machine`` is the :class:`Machine` asked about
    (with its probed inputs), ``query`` the normalized query for it (None
    when the platform is unknown), ``notes`` normalization's messages,
    ``selections`` ``(kv dtype, Selection | Rejection)`` pairs with the
    default kv dtype first, ``impls`` one check per impl class, ``deciding``
    the inputs of ``query.extra`` that decide one of those selections (the
    others are left out of the text). ``ok`` is True when the default kv
    dtype selects and that impl can run."""

    __slots__ = ("machine", "query", "notes", "selections", "impls", "rules_digest", "rule_files", "deciding")
    _defaults = {"deciding": ()}
    machine: Machine
    query: Query | None
    notes: tuple[Message, ...]
    selections: tuple[tuple[str, Selection | Rejection], ...]
    impls: tuple[ImplCheck, ...]
    rules_digest: str
    rule_files: tuple[str, ...]
    deciding: tuple[str, ...]

    @property
    def probes(self) -> tuple[InputProbe, ...]:
        """The pack-declared inputs read from the machine."""
        return self.machine.probes

    @property
    def auto(self) -> Selection | Rejection | None:
        return self.selections[0][1] if self.selections else None

    @property
    def ok(self) -> bool:
        impl = getattr(self.auto, "impl", None)
        return impl is not None and any(c.impl == impl and c.available for c in self.impls)

    def as_dict(self) -> dict[str, Any]:
        import platform as pyplatform

        from .._version import __version__

        def rule(ref):
            return None if ref is None else {"id": ref.id, "location": ref.location}

        m = self.machine
        return {
            "version": JSON_VERSION,
            "ok": self.ok,
            "machine": {
                "platform": m.platform,
                "capability": self.query.capability if self.query is not None else m.capability,
                "source": m.source or None, "problem": m.problem,
                "torch": m.torch, "torch_problem": m.torch_problem,
                "python": pyplatform.python_version(), "dsv4sel": __version__,
                "rules_digest": self.rules_digest,
            },
            "query": None if self.query is None else self.query.as_dict(),
            "probes": [{"input": p.name, "impl": p.impl, "value": p.value, "reason": p.reason, "asked": p.asked}
                       for p in self.probes],
            "messages": [{"level": n.level, "text": str(n)} for n in self.notes],
            "selections": [
                {"kv_cache_dtype": kv, "status": "rejected", "backend": o.backend, "reason": o.reason,
                 "rule": rule(o.rule)} if isinstance(o, Rejection) else
                {"kv_cache_dtype": kv, "status": "selected", "backend": o.backend, "layout": o.layout,
                 "cache_dtype": o.cache_dtype, "impl": o.impl, "rule": rule(o.rule)}
                for kv, o in self.selections],
            "impls": [{"impl": c.impl, "backends": list(c.backends), "available": c.available,
                       "reason": c.reason} for c in self.impls],
        }


class UnknownPlatform(ValueError):
    """A platform, capability, model or input given to :func:`build_report` is outside the
    rules' vocabulary."""


def _selections(rules: RuleSet, query: Query) -> tuple:
    kvs = list(rules.values("kv_cache_dtype"))
    default = rules.default_of("kv_cache_dtype") or kvs[0]
    kvs.sort(key=lambda kv: kv != default)  # stable sort: the default first, then vocabulary order
    return tuple((kv, rules.outcome(query.replace(backend=None, kv_cache_dtype=kv)))
                 for kv in kvs)


def impl_checks(rules: RuleSet, platform: str | None = None, capability: str | None = None) -> tuple[ImplCheck, ...]:
    """Load every impl class the rules select somewhere, through the rule
    set's allow-list, and ask ``is_available(platform, capability)``; None
    asks about this machine. Order: rule-file order of the backends. Never
    raises."""
    users: dict[str, list[str]] = {}
    impl_of: dict[int, str] = {}
    for index, row in enumerate(rules.rows):
        if row.kind == "select":
            impl_of[index] = row.impl
            names = users.setdefault(row.impl, [])
            if row.backend not in names:
                names.append(row.backend)
    # the impls some input of the space selects; stop once all are found
    reached: set[str] = set()
    for _key, index in rules.items():
        impl = impl_of.get(index)
        if impl is not None and impl not in reached:
            reached.add(impl)
            if len(reached) == len(users):
                break
    order = {b: i for i, b in enumerate(rules.selectable_backends)}
    rank = lambda b: order.get(b, len(order))  # noqa: E731
    checks = []
    for impl in sorted((i for i in users if i in reached), key=lambda i: min(map(rank, users[i]))):
        ok, reason = impl_available(impl, rules.allowed_impl_modules, platform, capability)
        checks.append(ImplCheck(impl, tuple(sorted(users[impl], key=rank)), ok, reason))
    return tuple(checks)


def build_report(rules: RuleSet, platform: str | None = None, capability: str | None = None,
                 model: str | None = None, inputs: dict[str, str] | None = None) -> Report:
    """The report for this machine, or for ``platform``/``capability`` when
    given. Pack-declared inputs come from their probes unless ``inputs``
    names them; a capability given without ``platform`` that names its platform
    (``MI300X``) asks about that platform. Raises :class:`UnknownPlatform` when a
    given value is outside the rules' vocabulary; a detected one that is becomes
    ``machine.problem``."""
    from ..errors import InvalidQuery

    found = read_machine(rules, platform, capability)
    target = found.target  # what the kernels are asked about: the machine as given, or this one
    extra = found.inputs
    extra.update(inputs or {})
    query = None
    notes: tuple[Message, ...] = ()
    if found.platform is not None:
        try:
            # as written (MI300X), so that a refusal names what the user wrote
            query, notes = rules.normalize(platform=found.platform,
                                           capability=found.capability_given or found.capability,
                                           model=model or rules.default_of("model"), extra=extra)
        except InvalidQuery as exc:
            if found.given or capability is not None or model or inputs:
                raise UnknownPlatform(exc.reason) from None
            found = found.replace(platform=None, problem=f"detected {found.platform} "
                                  f"{found.capability}, which the rules do not know: {exc.reason}")
    selections = _selections(rules, query) if query is not None else ()
    deciding: tuple[str, ...] = ()
    if query is not None:
        held = {"model": query.model, "platform": query.platform, "capability": query.capability, "backend": None}
        deciding = tuple(name for name, _ in query.extra if rules.decides(name, {**held, **dict(query.extra)}))
    impls = impl_checks(rules, *target)
    return Report(found, query, tuple(notes), selections, impls, rules.digest, rules.sources, deciding)
