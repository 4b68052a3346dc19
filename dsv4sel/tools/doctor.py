"""The machine report behind ``dsv4sel doctor``: what this machine is, what the
rules pick on it, and which impl classes can run.

:func:`build_report` gathers three things into a frozen :class:`Report`:

1. the machine: platform and capability (through :func:`dsv4sel.dsv4.platform.detect`,
   i.e. torch or ``DSV4SEL_PLATFORM``; or given, to ask about another
   machine), the torch version or why torch is missing;
2. the outcome of the rules there for ``auto`` and every other kv dtype, with
   no ``--attention-backend``;
3. for every impl class the rules name: whether it loads through the rule
   set's allow-list (:meth:`Selection.load_impl`) and whether its kernel
   library can run (the class's ``is_available(platform, capability)``).

Unlike ``explain`` this imports torch. It never raises for a missing torch, a
missing kernel module or a kernel adapter's bug: each becomes a line of the
report.
"""

from __future__ import annotations

import os

from ..record import Frozen
from ..dsv4.rules import Rejection, RuleSet
from ..dsv4.selection import Query, Selection
from ..engine.values import load_impl_class

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

#: Version of the :meth:`Report.as_dict` layout.
JSON_VERSION = 1


class Machine(Frozen):
    """The machine asked about. ``platform`` is None when it could not be
    detected (``problem`` says why); ``source`` says where it came from:
    ``torch``, ``DSV4SEL_PLATFORM`` or ``--platform``. ``torch`` is the torch
    version, or None with ``torch_problem`` saying why."""

    __slots__ = ("platform", "capability", "source", "torch", "torch_problem", "problem")


class ImplCheck(Frozen):
    """One impl class the rules name, the backends that use it, and whether it
    can run (``reason`` says why or why not)."""

    __slots__ = ("impl", "backends", "available", "reason")


class InputProbe(Frozen):
    """A pack-declared input filled from this machine: ``value`` is the
    input's last declared value when the ``impl`` class's ``is_available()``
    says yes, its first otherwise (the schema's ``probe:`` contract)."""

    __slots__ = ("name", "impl", "value", "reason")


class Report(Frozen):
    """The doctor's findings. ``query`` is the normalized query for the
    machine (None when the platform is unknown), ``notes`` normalization's
    messages, ``selections`` ``(kv dtype, Selection | Rejection)`` pairs with
    the default kv dtype first, ``impls`` one check per impl class. ``ok`` is
    True when the default kv dtype selects and that impl can run."""

    __slots__ = ("machine", "query", "notes", "selections", "impls", "probes", "rules_digest", "rule_files")

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
            "probes": [{"input": p.name, "impl": p.impl, "value": p.value, "reason": p.reason}
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


def _machine(platform: str | None, capability: str | None) -> Machine:
    from ..errors import InvalidQuery
    from ..dsv4.platform import PLATFORM_ENV, detect, import_torch, probe_torch

    torch, torch_problem = import_torch()
    version = getattr(torch, "__version__", None) if torch is not None else None
    if platform:
        return Machine(platform, capability, "--platform", version, torch_problem, None)
    try:
        found, found_capability = detect()
    except InvalidQuery as exc:
        return Machine(None, None, "", version, torch_problem, exc.reason)
    env = os.environ.get(PLATFORM_ENV, "").strip().lower()
    # detect() falls back to the environment only when torch sees no device
    gpu = probe_torch()[0] is not None
    source = PLATFORM_ENV if env == found and not gpu else "torch"
    if capability is not None:
        found_capability, source = capability, source + ", --capability"
    return Machine(found, found_capability, source, version, torch_problem, None)


def _selections(rules: RuleSet, query: Query) -> tuple:
    kvs = list(rules.values("kv_cache_dtype"))
    default = rules.default_of("kv_cache_dtype") or kvs[0]
    kvs.sort(key=lambda kv: kv != default)  # stable sort: the default first, then vocabulary order
    return tuple((kv, rules.outcome(Query(query.model, query.platform, query.capability, None, kv, query.extra)))
                 for kv in kvs)


def _ask(cls: type, platform: str | None, capability: str | None) -> tuple[bool, str]:
    """``cls.is_available(platform, capability)``, never raising."""
    is_available = getattr(cls, "is_available", None)
    if not callable(is_available):
        return False, f"{cls.__name__} has no is_available() classmethod"
    try:
        ok, reason = is_available(platform, capability)
    except Exception as exc:  # a kernel adapter's bug is a finding, not a crash
        return False, f"is_available() raised {type(exc).__name__}: {exc}"
    return bool(ok), str(reason)


def probe_inputs(rules: RuleSet, platform: str | None = None,
                 capability: str | None = None) -> tuple[InputProbe, ...]:
    """Fill every input that declares a ``probe:`` from this machine (or from
    ``platform``/``capability``); a probe that cannot load counts as "no"."""
    from ..errors import ImplLoadError

    out = []
    for name, impl in rules.probes.items():
        values = rules.values(name)
        try:
            ok, reason = _ask(load_impl_class(impl, rules.allowed_impl_modules), platform, capability)
        except ImplLoadError as exc:
            ok, reason = False, f"cannot load: {exc}"
        out.append(InputProbe(name, impl, values[-1] if ok else values[0], reason))
    return tuple(out)


def impl_checks(rules: RuleSet, platform: str | None = None, capability: str | None = None) -> tuple[ImplCheck, ...]:
    """Load every impl class the rules name, through a Selection that uses it
    (so the rule set's allow-list applies), and ask ``is_available(platform,
    capability)``; None asks about this machine. Order: rule-file order of the
    backends. Never raises."""
    from ..errors import ImplLoadError

    users: dict[str, list[str]] = {}
    impl_of: dict[int, str] = {}
    for index, row in enumerate(rules.rows):
        if row.kind == "select":
            impl_of[index] = row.impl
            names = users.setdefault(row.impl, [])
            if row.backend not in names:
                names.append(row.backend)
    # one point per impl, to build a Selection through the evaluator; stop once all are found
    first: dict[str, tuple] = {}
    for key, index in rules.items():
        impl = impl_of.get(index)
        if impl is not None and impl not in first:
            first[impl] = key
            if len(first) == len(users):
                break
    order = {b: i for i, b in enumerate(rules.selectable_backends)}
    rank = lambda b: order.get(b, len(order))  # noqa: E731
    checks = []
    for impl in sorted(first, key=lambda i: min(map(rank, users[i]))):
        model, plat, cap, backend, kv, *extra = first[impl]
        selection = rules.outcome(Query(model, plat, cap, backend, kv, tuple(zip(rules.extra_inputs, extra))))
        backends = tuple(sorted(users[impl], key=rank))
        try:
            ok, reason = _ask(selection.load_impl(), platform, capability)
        except ImplLoadError as exc:
            ok, reason = False, f"cannot load: {exc}"
        checks.append(ImplCheck(impl, backends, ok, reason))
    return tuple(checks)


def build_report(rules: RuleSet, platform: str | None = None, capability: str | None = None,
                 model: str | None = None, inputs: dict[str, str] | None = None) -> Report:
    """The report for this machine, or for ``platform``/``capability`` when
    given. Pack-declared inputs come from their probes unless ``inputs``
    names them. Raises :class:`UnknownPlatform` when a given value is outside
    the rules' vocabulary; a detected one that is becomes ``machine.problem``."""
    from ..errors import InvalidQuery

    # _machine imports torch first, through kernels.platform.import_torch, which keeps its NumPy warning quiet
    machine = _machine(platform, capability)
    asked = platform is not None
    # the kernels parse capabilities; "unknown" is the rules' word for None
    target = (machine.platform if asked else None,
              machine.capability if asked and machine.capability != "unknown" else None)
    probes = probe_inputs(rules, *target)
    extra = {p.name: p.value for p in probes}
    extra.update(inputs or {})
    query, notes = None, ()
    if machine.platform is not None:
        try:
            query, notes = rules.normalize(platform=machine.platform, capability=machine.capability,
                                           model=model or rules.default_of("model"), extra=extra)
        except InvalidQuery as exc:
            if asked or model or inputs:
                raise UnknownPlatform(exc.reason) from None
            machine = machine.replace(platform=None, problem=f"detected {machine.platform} "
                                      f"{machine.capability}, which the rules do not know: {exc.reason}")
    selections = _selections(rules, query) if query is not None else ()
    impls = impl_checks(rules, *target)
    return Report(machine, query, tuple(notes), selections, impls, probes, rules.digest, rules.sources)
