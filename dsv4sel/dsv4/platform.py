"""What this machine is: platform and capability, the pack inputs probed on it, and whether an impl can run.

The one implementation of machine detection, for every command that asks:

- :func:`detect` gives ``(platform, capability)`` for ``select(platform=None)``
  and the vLLM drop-in;
- :func:`machine` gives the :class:`Machine` value ``dsv4sel doctor`` reports and
  ``dsv4sel explain --detect`` fills its query from: where the platform came
  from, the torch version, and the pack-declared inputs read from their probe
  classes (:func:`probe_inputs`);
- :func:`impl_available` asks an impl class the rules name whether it can run,
  loaded through the rule set's allow-list; the doctor's kernel checks and the
  probes both ask it.

Torch is imported lazily. :func:`probe_torch`, :func:`import_torch` and
:func:`impl_availability` are the kernels' (``dsv4sel.kernels.platform``): the
kernels never import the core, so the core takes them from there, here only.
"""

from __future__ import annotations

import os

from ..errors import InvalidQuery
# the one place that asks torch lives with the kernels, which need it without the core;
# import_torch (is torch importable, which version) is re-exported for the doctor, and
# impl_availability (is_available() asked without raising) is the kernels' availability_report's too
from ..kernels.platform import impl_availability, import_torch, probe_torch
from ..record import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .rules import RuleSet

PLATFORM_ENV = "DSV4SEL_PLATFORM"
CAPABILITY_ENV = "DSV4SEL_CAPABILITY"
PLATFORMS = ("cuda", "rocm", "xpu", "cpu")
#: :attr:`Machine.source` of a machine asked about by name rather than detected.
GIVEN = "--platform"
#: :attr:`Machine.source` of a machine whose platform the given capability names (``--capability
#: MI300X`` without ``--platform``: a ROCm GPU), asked about like a given one.
INFERRED = "--capability"


def detect() -> tuple[str, str | None]:
    """Return ``(platform, capability)`` for device 0 of this machine.

    What torch sees (:func:`probe_torch`) wins; otherwise the
    ``DSV4SEL_PLATFORM`` (and optional ``DSV4SEL_CAPABILITY``) environment
    variables decide. Raises :class:`InvalidQuery` naming the options when
    neither applies.
    """
    found, problem = probe_torch()
    if found is not None:
        return found
    env = os.environ.get(PLATFORM_ENV, "").strip().lower()
    if env:
        if env not in PLATFORMS:
            raise InvalidQuery(f"{PLATFORM_ENV}={env!r} is not a platform; use one of {', '.join(PLATFORMS)}")
        return env, os.environ.get(CAPABILITY_ENV) or None
    raise InvalidQuery(f"cannot detect the platform: {problem}. Pass platform= (one of "
                       f"{', '.join(PLATFORMS)}) or set {PLATFORM_ENV}, e.g. {PLATFORM_ENV}=cpu")


class InputProbe(Frozen):
    """An input filled from the machine: ``value`` is the input's last declared
    value when the ``impl`` class's ``is_available()`` says yes, its first
    otherwise (the schema's ``probe:`` contract); ``reason`` is the class's.
    ``asked`` is False where the input decides nothing on the machine (the
    FlashInfer SM120 specialization off SM12x) or the platform is unknown: the
    probe is not run, ``value`` is the input's default and ``reason`` says why."""

    __slots__ = ("name", "impl", "value", "reason", "asked")
    _defaults = {"asked": True}
    name: str
    impl: str
    value: str
    reason: str
    asked: bool


class Machine(Frozen):
    """The machine asked about. ``platform`` is None when it could not be
    detected (``problem`` says why); ``source`` says where it came from:
    ``torch``, ``DSV4SEL_PLATFORM`` (``, --capability`` added when the
    capability was given over a detected platform), ``--platform`` (another
    machine, asked about by name) or ``--capability`` (the platform of the GPU
    the capability names, given without ``--platform``). ``capability`` is the
    canonical spelling of a given capability (``9.0`` for ``H100``), which
    ``capability_given`` keeps as written when it differs. ``torch`` is the
    torch version, or None with ``torch_problem`` saying why. ``probes`` are
    the inputs read from it (:class:`InputProbe`, in the rules' order)."""

    __slots__ = ("platform", "capability", "source", "torch", "torch_problem", "problem", "probes",
                 "capability_given")
    _defaults = {"probes": (), "capability_given": None}
    platform: str | None
    capability: str | None
    source: str
    torch: str | None
    torch_problem: str | None
    problem: str | None
    probes: tuple[InputProbe, ...]
    capability_given: str | None

    @property
    def given(self) -> bool:
        """True when the machine was named (``--platform``, or a capability that names its
        platform), not detected."""
        return self.source in (GIVEN, INFERRED)

    @property
    def detected(self) -> bool:
        """True when the platform was detected (from torch or ``DSV4SEL_PLATFORM``)."""
        return self.platform is not None and not self.given

    @property
    def inputs(self) -> dict[str, str]:
        """The probed inputs as query values: ``{name: value}``."""
        return {p.name: p.value for p in self.probes}

    @property
    def target(self) -> tuple[str | None, str | None]:
        """What the kernels' ``is_available(platform, capability)`` is asked:
        the given platform and capability for a machine asked about by name
        (capability None for the rules' ``unknown``); ``(None, None)`` for this
        machine, which the kernels then look at themselves, through the same
        torch probe :func:`detect` uses."""
        if not self.given:
            return None, None
        return self.platform, None if self.capability in (None, "unknown") else self.capability


def _read(rules: RuleSet, platform: str | None, capability: str | None) -> Machine:
    """The machine without its probes (see :func:`machine`)."""
    torch, torch_problem = import_torch()
    version = getattr(torch, "__version__", None) if torch is not None else None
    given_cap, written = _spelled(rules, capability)
    if platform:
        return Machine(platform, given_cap, GIVEN, version, torch_problem, None, capability_given=written)
    # a capability that names its platform (MI300X: ROCm) asks about that machine
    named = rules.capability_platform(capability) if capability is not None else None
    try:
        found, found_capability = detect()
    except InvalidQuery as exc:
        if named is not None:
            return Machine(named, given_cap, INFERRED, version, torch_problem, None, capability_given=written)
        return Machine(None, None, "", version, torch_problem, exc.reason)
    if named is not None and named != found:
        return Machine(named, given_cap, INFERRED, version, torch_problem, None, capability_given=written)
    env = os.environ.get(PLATFORM_ENV, "").strip().lower()
    # detect() falls back to the environment only when torch sees no device
    gpu = probe_torch()[0] is not None
    source = PLATFORM_ENV if env == found and not gpu else "torch"
    if capability is not None:
        found_capability, source = given_cap, source + ", --capability"
    return Machine(found, found_capability, source, version, torch_problem, None,
                   capability_given=written if capability is not None else None)


def _spelled(rules: RuleSet, capability: str | None) -> tuple[str | None, str | None]:
    """A given capability as ``(canonical, as written)``: the one spelling normalizer's reading
    (:func:`dsv4sel.dsv4.capability.spelled`: ``H100`` is ``9.0``), which is what the kernels are
    asked about, and the text as written when it differs (None when not). A capability that
    spells nothing stays as written, for the query's normalization to refuse by name."""
    if capability is None:
        return None, None
    from .capability import spelled

    text = spelled(capability, rules.gpu_names())
    if text is None or text == capability:
        return capability, None
    return text, capability


def machine(rules: RuleSet, platform: str | None = None, capability: str | None = None) -> Machine:
    """The machine a command asks about, with the inputs ``rules`` probe on it.

    With ``platform`` it is that machine (``source`` ``--platform``; the
    capability is ``capability``, None for unknown); nothing is detected. Without,
    a ``capability`` that names its platform (a GPU name, a gfx arch: see
    :meth:`~dsv4sel.dsv4.rules.RuleSet.capability_platform`) names the machine
    when it is not this one's platform (``source`` ``--capability``); else it is
    this machine: :func:`detect`'s platform and capability, the latter replaced by
    ``capability`` when given. A given capability is held in its canonical
    spelling. Never raises: a platform that cannot be detected is ``platform``
    None with the reason in ``problem``. Imports torch (through
    ``kernels.platform.import_torch``, which keeps its NumPy warning quiet).
    """
    found = _read(rules, platform, capability)
    return found.replace(probes=probe_inputs(rules, *found.target, at=_point(rules, found.platform, found.capability)))


def _this_machine(rules: RuleSet) -> dict[str, str]:
    """:func:`_point` of this machine (:func:`detect`); empty when it cannot be detected."""
    try:
        return _point(rules, *detect())
    except InvalidQuery:
        return {}


def _point(rules: RuleSet, platform: str | None, capability: str | None) -> dict[str, str]:
    """``platform`` and ``capability`` as declared values of the rules, for
    :meth:`~dsv4sel.dsv4.rules.RuleSet.decides`; empty when they are not (an unknown
    platform, a capability the rules do not declare there)."""
    if platform is None:
        return {}
    try:
        query, _ = rules.normalize(platform=platform, capability=capability,
                                   model=rules.default_of("model") or rules.values("model")[0])
    except InvalidQuery:
        return {}
    return {"platform": query.platform, "capability": query.capability}


def impl_available(impl: str, allowed: tuple[str, ...], platform: str | None = None,
                   capability: str | None = None) -> tuple[bool, str]:
    """Can the impl class ``impl`` (``module:Class``) run on ``platform`` and
    ``capability`` (None: this machine)? Loaded only through the allow-list
    ``allowed`` (:func:`dsv4sel.engine.values.load_impl_class`); a class that
    cannot load is "no", with the reason. Never raises."""
    from ..engine.values import load_impl_class
    from ..errors import ImplLoadError
    from .profile import PROFILE

    try:
        cls = load_impl_class(impl, allowed, PROFILE.impl_base)
    except ImplLoadError as exc:
        return False, f"cannot load: {exc}"
    return impl_availability(cls, platform, capability)


def probe_inputs(rules: RuleSet, platform: str | None = None, capability: str | None = None,
                 at: dict[str, str] | None = None) -> tuple[InputProbe, ...]:
    """Fill every input that declares a ``probe:`` from this machine (or from
    ``platform``/``capability``); a probe that cannot load counts as "no".

    ``at`` is where the machine is in the rules (its platform and capability as declared
    values; None: ``platform`` and ``capability``'s, or this machine's when they are None):
    a probe is asked only where its input decides something there, so the FlashInfer SM120
    specialization is not asked about off SM12x, nor mega-attention off SM10x; such an
    input keeps its default (``asked`` False, the reason says why). An empty ``at`` (the
    platform is unknown) asks none."""
    if at is None:
        at = _point(rules, platform, capability) if platform is not None else _this_machine(rules)
    out = []
    for name, impl in rules.probes.items():
        default = rules.default_of(name) or rules.values(name)[0]
        if not at:
            out.append(InputProbe(name, impl, default, "not probed: the platform or its capability is unknown", False))
            continue
        if not rules.decides(name, at):
            where = f"{at['platform']}" + ("" if at["capability"] == "unknown" else f" {at['capability']}")
            out.append(InputProbe(name, impl, default, f"not probed: it decides nothing on {where}", False))
            continue
        values = rules.values(name, at.get(rules.scope(name)[0] or "")) or rules.values(name)
        ok, reason = impl_available(impl, rules.allowed_impl_modules, platform, capability)
        out.append(InputProbe(name, impl, values[-1] if ok else values[0], reason))
    return tuple(out)
