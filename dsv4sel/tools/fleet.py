"""A DeepSeek-V4 deployment decided as a whole: every side's decision, and whether they exchange KV.

:func:`decide_fleet` decides each side of a :class:`~dsv4sel.tools.deployment.Deployment` with
the rules of its engine and release (:mod:`dsv4sel.tools.fleet_sides`), as ``mode`` asks:
``engine`` (what the engines do today: each release's compat rule set) or ``dsv4sel`` (what
dsv4sel makes them do: the shipped rules, through the plugins' inputs; a side whose release no
dsv4sel plugin serves, or that says ``decided_by: engine``, is decided by its engine). It then
compares the sides' KV wire contracts (:mod:`dsv4sel.dsv4.contract`): the deployment is
compatible exactly when every side selects and all contracts are equal. Otherwise each
:class:`Difference` names a field, each side's value and the rule that decided it, and the
search for :class:`Fix` values tries the sides' own alternatives (another attention backend,
kv-cache dtype or engine environment variable, at most two per side) for the fewest changes that
make every side select one contract, or says why no setting does (:attr:`FleetReport.no_fix`). A
vLLM side its engine decides is offered only settings whose kernels run (the shipped rules select
them too): vLLM 0.33 builds layers on GPUs their kernels do not support.

The value renders nothing: ``dsv4sel fleet`` prints it with :mod:`dsv4sel.cli.render.fleet`;
:meth:`FleetReport.as_dict` is its ``--json``.
"""

from __future__ import annotations

import functools
import itertools

from ..engine.hosts import version_matches
from ..errors import InvalidQuery
from ..record import Frozen
from . import fleet_sides
from .deployment import Deployment, DeploymentError, Side
from .fleet_sides import ENV, Outcome

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Iterator

    from ..dsv4.contract import KVContract
    from ..dsv4.rules import RuleSet
    from ..engine.values import RuleRef

JSON_VERSION = 1
#: Contract fields no setting of a side changes.
FIXED_FIELDS = ("model", "engine", "release")
#: At most this many changed settings per side in the search for fixes, and fixes shown.
MAX_CHANGES = 2
MAX_FIXES = 3


def _plugin_versions() -> dict[str, str]:
    """The engine releases a dsv4sel plugin decides for."""
    from ..sglang_plugin.translation import VERSIONS
    from ..vllm_plugin.targets import SUPPORTED

    return {"vllm": SUPPORTED, "sglang": VERSIONS}


class SideReport(Frozen):
    """One side decided: who decided it (``decided_by``), by which rules (``rules``: the compat set's
    folder or ``shipped rules``), its model, and the :class:`~dsv4sel.tools.fleet_sides.Outcome`."""

    __slots__ = ("side", "decided_by", "rules", "model", "outcome")
    side: Side
    decided_by: str
    rules: str
    model: str
    outcome: Outcome

    @property
    def name(self) -> str:
        return self.side.name


class Difference(Frozen):
    """A contract field the sides disagree on: each side's value and the rule that decided it."""

    __slots__ = ("field", "values", "rules")
    field: str
    values: tuple[tuple[str, Any], ...]
    rules: tuple[tuple[str, RuleRef | None], ...]


class Fix(Frozen):
    """Settings that make every side select one contract: per side, the changed settings (a value of
    None unsets it), and the contract they agree on."""

    __slots__ = ("changes", "contract", "decisions")
    changes: tuple[tuple[str, tuple[tuple[str, str | None], ...]], ...]
    contract: KVContract
    #: per changed side, what it then selects: ``(side, backend, rule)``
    decisions: tuple[tuple[str, str, RuleRef], ...]


class FleetReport(Frozen):
    """The deployment decided (module doc)."""

    __slots__ = ("file", "mode", "sides", "differences", "fixes", "no_fix")
    file: str
    mode: str
    sides: tuple[SideReport, ...]
    differences: tuple[Difference, ...]
    fixes: tuple[Fix, ...]
    no_fix: str | None

    @property
    def compatible(self) -> bool:
        """Every side selects and all their contracts are equal."""
        contracts = [s.outcome.contract for s in self.sides]
        return all(c is not None for c in contracts) and len(set(contracts)) == 1

    def as_dict(self) -> dict[str, Any]:
        from ..engine.sources import openable

        def rule(ref):
            return None if ref is None else {"id": ref.id, "location": ref.location, "path": openable(ref.file)}

        return {
            "version": JSON_VERSION, "file": self.file, "as": self.mode, "compatible": self.compatible,
            "sides": {s.name: _side_dict(s, rule) for s in self.sides},
            "differences": [{"field": d.field, "values": dict(d.values),
                             "rules": {side: rule(ref) for side, ref in d.rules}} for d in self.differences],
            "fixes": [{"changes": {side: dict(ch) for side, ch in f.changes}, "contract": f.contract.fingerprint,
                       "selects": {side: {"backend": backend, "rule": rule(ref)} for side, backend, ref in f.decisions}}
                      for f in self.fixes],
            "no_fix": self.no_fix,
        }


def _side_dict(report: SideReport, rule) -> dict[str, Any]:
    side, out = report.side, report.outcome
    decision: dict[str, Any]
    if out.selection is not None:
        decision = {"status": "selected", **out.selection.fields(), "rule": rule(out.rule),
                    **({"settings": dict(out.told)} if out.told else {})}
    else:
        decision = {"status": "rejected", "reason": out.reason, "rule": rule(out.rule), "origin": out.origin}
    return {"engine": side.engine, "version": side.version, "decided_by": report.decided_by, "rules": report.rules,
            "model": report.model, "inputs": dict(side.inputs), "env": dict(side.env),
            "disaggregation": side.disaggregation, "checkpoint": side.checkpoint, "notes": list(out.notes),
            "decision": decision,
            "contract": None if out.contract is None else out.contract.as_dict()}


# ------------------------------------------------------------------ rule sets

class RuleSets:
    """The rule sets sides are decided by: the shipped ones (with the command's packs) and each
    release's compat set, loaded once on first use."""

    def __init__(self, shipped: RuleSet):
        self.shipped = shipped
        self._compat: dict[str, RuleSet] = {}

    def compat(self, path: str) -> RuleSet:
        if path not in self._compat:
            self._compat[path] = _load_compat(path)
        return self._compat[path]


@functools.lru_cache(maxsize=8)
def _load_compat(path: str) -> RuleSet:
    """A compat rule set, loaded once per process (its files are the package's own)."""
    from .. import load_rules
    from ..engine.sources import Pack

    label = "rules/compat/" + path.replace("\\", "/").rsplit("/", 1)[-1]
    return load_rules([Pack(label.rsplit("/", 1)[-1], path, (), label)])


def _who(side: Side, mode: str) -> str:
    """Who decides ``side``: its ``decided_by``, else ``mode``; a release no dsv4sel plugin serves is
    decided by its engine."""
    wanted = side.decided_by or mode
    if wanted == "dsv4sel" and not version_matches(side.version, _plugin_versions()[side.engine]):
        return "engine"
    return wanted


def _rules_for(side: Side, who: str, sets: RuleSets) -> tuple[RuleSet, str]:
    if who == "dsv4sel":
        return sets.shipped, "shipped rules"
    from .releases import compat_dir, find_release

    try:
        path = compat_dir(*find_release(side.engine, side.version))
    except ValueError as exc:
        raise DeploymentError([side.problem("version", "DSV701", str(exc))]) from None
    return sets.compat(path), "rules/compat/" + path.replace("\\", "/").rsplit("/", 1)[-1]


def _model(side: Side, deployment: Deployment, rules: RuleSet) -> str:
    return side.model or deployment.model or rules.default_of("model") or rules.values("model")[0]


def _decide_side(side: Side, mode: str, sets: RuleSets, deployment: Deployment) -> tuple[SideReport, RuleSet]:
    fleet_sides.check_env(side)
    who = _who(side, mode)
    rules, label = _rules_for(side, who, sets)
    model = _model(side, deployment, rules)
    try:
        outcome = fleet_sides.decide(side, who, rules, model)
    except InvalidQuery as exc:
        raise DeploymentError([side.problem(_culprit(side, exc.reason), "DSV702", exc.reason)]) from None
    notes = outcome.notes
    if who != (side.decided_by or mode):
        notes += (f"no dsv4sel plugin decides {side.engine} {side.version}: its engine decides alone",)
    return SideReport(side, who, label, model, outcome.replace(notes=notes)), rules


def _culprit(side: Side, reason: str) -> str | None:
    """The key of ``side`` an invalid-input message is about: the first of its keys or values it quotes."""
    pairs = [*side.inputs, *((f"env.{k}", v) for k, v in side.env), *((("model", side.model),) if side.model else ()),
             *((("disaggregation", side.disaggregation),) if side.disaggregation else ())]
    quoted = [(reason.find(repr(text)), key) for key, value in pairs
              for text in (value, key.removeprefix("env.")) if repr(text) in reason]
    return min(quoted)[1] if quoted else None


# ------------------------------------------------------------------ comparing

def _differences(reports: tuple[SideReport, ...]) -> tuple[Difference, ...]:
    decided = [(r, r.outcome.contract.fields()) for r in reports if r.outcome.contract is not None]
    if len(decided) < 2:
        return ()
    out = []
    for name in decided[0][1]:
        values = [(r.name, fields[name]) for r, fields in decided]
        if len({repr(v) for _, v in values}) > 1:
            out.append(Difference(name, tuple(values), tuple((r.name, r.outcome.rule) for r, _ in decided)))
    return tuple(out)


# ------------------------------------------------------------------ fixes

def _candidates(side: Side, who: str, rules: RuleSet) -> dict[str, tuple[str | None, ...]]:
    """The values each setting of ``side`` may take, in the order fixes prefer them."""
    if side.engine == "sglang" and who == "dsv4sel":
        from ..sglang_plugin.translation import translation

        space = translation().space
        backends: tuple[str | None, ...] = (None, *(b for b in space["dsv4_attn_backend"] if b != "auto"))
        kvs: tuple[str | None, ...] = tuple(space["kv_cache_dtype"])
    elif side.engine == "sglang":
        backends = (None, *(b.lower() for b in rules.selectable_backends))
        kvs = rules.values("kv_cache_dtype")
    else:
        backends, kvs = (None, *rules.selectable_backends), rules.values("kv_cache_dtype")
    out: dict[str, tuple[str | None, ...]] = {"attention_backend": backends, "kv_cache_dtype": kvs}
    rocm_only = ("SGLANG_HACK_FLASHMLA_BACKEND", "SGLANG_DSV4_UNIFIED_KV_FP8")
    for name, values in ENV[side.engine].items():
        if name not in rocm_only or side.get("platform") == "rocm":
            out[f"env.{name}"] = (None, *values)
    return out


def _variants(side: Side, who: str, rules: RuleSet) -> Iterator[tuple[tuple[tuple[str, str | None], ...], int]]:
    """Changes of at most :data:`MAX_CHANGES` settings, fewest first, with their count."""
    given = fleet_sides.settings_of(side)
    options = {k: [v for v in vs if v != given.get(k)] for k, vs in _candidates(side, who, rules).items()}
    yield (), 0
    for size in range(1, MAX_CHANGES + 1):
        for keys in itertools.combinations(options, size):
            for values in itertools.product(*(options[k] for k in keys)):
                yield tuple(zip(keys, values)), size


def _runs(report: SideReport, shipped: RuleSet, changes: dict[str, str | None]) -> bool:
    """Whether a setting vLLM decides by itself also runs: vLLM 0.33 builds layers whose kernels
    fail later (FlashInfer on SM90, FlashMLA on SM12x), which its compat rule set states as
    selections; a fix is offered only where the shipped rules, which know the kernels, select too."""
    if report.side.engine != "vllm" or report.decided_by != "engine":
        return True
    try:
        return fleet_sides.decide(report.side, "dsv4sel", shipped, report.model, changes).selection is not None
    except (InvalidQuery, ValueError):
        return False


def _reachable(report: SideReport, rules: RuleSet, shipped: RuleSet) -> dict[KVContract, tuple[int, tuple, Outcome]]:
    """Every contract the side's own settings reach, with the fewest changes that reach it."""
    side, out = report.side, {}
    for changes, size in _variants(side, report.decided_by, rules):
        try:
            outcome = fleet_sides.decide(side, report.decided_by, rules, report.model, dict(changes))
        except (InvalidQuery, ValueError, KeyError):
            continue
        if outcome.contract is not None and outcome.contract not in out and (
                not size or _runs(report, shipped, dict(changes))):
            out[outcome.contract] = (size, changes, outcome)
    return out


def _fixes(reports: tuple[SideReport, ...], rule_sets: tuple[RuleSet, ...],
           shipped: RuleSet) -> tuple[tuple[Fix, ...], str | None]:
    fixed = [f for f in FIXED_FIELDS if len({_fixed(r, f) for r in reports}) > 1]
    if fixed:
        return (), _fixed_reason(reports, fixed)
    reach = [_reachable(r, rules, shipped) for r, rules in zip(reports, rule_sets)]
    common = set(reach[0]).intersection(*reach[1:])
    if not common:
        return (), _no_common_reason(reports, reach)
    # fewest changes first; then fewest values set rather than unset (dropping an odd setting before
    # adding one); then the sides' order
    ranked = sorted(common, key=lambda c: (sum(r[c][0] for r in reach),
                                           sum(v is not None for r in reach for _, v in r[c][1]),
                                           [r[c][0] for r in reach], [str(r[c][1]) for r in reach]))
    return tuple(_fix(reports, reach, contract) for contract in ranked[:MAX_FIXES]), None


def _fix(reports: tuple[SideReport, ...], reach, contract: KVContract) -> Fix:
    """The fix that reaches ``contract``: each side's fewest changes that reach it."""
    changed = [(rep.name, reach_[contract]) for rep, reach_ in zip(reports, reach) if reach_[contract][0]]
    return Fix(tuple((name, changes) for name, (_, changes, _) in changed), contract,
               tuple((name, _backend(out), out.rule) for name, (_, _, out) in changed))


def _backend(outcome: Outcome) -> str:
    return outcome.selection.backend if outcome.selection is not None else "-"


def _fixed(report: SideReport, field: str) -> str:
    return {"model": report.model, "engine": report.side.engine, "release": report.side.version}[field]


def _fixed_reason(reports: tuple[SideReport, ...], fields: list[str]) -> str:
    what = {"model": "models", "engine": "engines", "release": "engine releases"}
    parts = "; ".join(f"different {what[f]} (" + ", ".join(f"{r.name} {_fixed(r, f)}" for r in reports) + ")"
                      for f in fields)
    return (f"no setting makes these sides agree: they run {parts}. The KV bytes of one engine release are "
            "read only by that release (vLLM's NIXL handshake hashes the version; SGLang's carries none and "
            "the layouts differ); run one engine release and one model on every side")


def _no_common_reason(reports: tuple[SideReport, ...], reach) -> str:
    def records(contracts) -> str:
        mains = sorted({f"{c.pool('main').record} {c.pool('main').bytes_per_token} B "
                        f"({c.pool('main').arrangement}, fp8 {c.pool('main').fp8}, block {c.block_size})"
                        for c in contracts})
        return ", ".join(mains) or "nothing (every setting is refused)"

    sides = "; ".join(f"{r.name} ({r.side.engine} {r.side.version} on {r.side.get('platform')} "
                      f"{r.side.get('capability') or 'capability unknown'}) can hold {records(reach_)}"
                      for r, reach_ in zip(reports, reach))
    return (f"no setting makes these sides agree: no attention backend, kv-cache dtype or engine variable (at most "
            f"{MAX_CHANGES} per side) gives every side one KV contract. {sides}")


# ------------------------------------------------------------------ the deployment

def decide_fleet(deployment: Deployment, shipped: RuleSet, mode: str = "dsv4sel", *,
                 search: bool = True) -> FleetReport:
    """Decide every side of ``deployment`` and compare their contracts (module doc). ``shipped`` is the
    rule set dsv4sel decides with (the shipped rules and any packs); ``mode`` ``dsv4sel`` or ``engine``.
    Raises :class:`DeploymentError` (every problem located in the file, with its code) for an unknown
    release, an input outside a side's rules or an environment variable that does not decide."""
    if mode not in fleet_sides.MODES:
        raise ValueError(f"mode must be one of {', '.join(fleet_sides.MODES)}, not {mode!r}")
    sets = RuleSets(shipped)
    reports, rule_sets, problems = [], [], []
    for side in deployment.sides:
        try:
            side_report, rules = _decide_side(side, mode, sets, deployment)
        except DeploymentError as exc:
            problems.extend(exc.problems)
            continue
        reports.append(side_report)
        rule_sets.append(rules)
    if problems:
        raise DeploymentError(sorted(problems, key=lambda p: (p.line, p.column or 0)))
    done = tuple(reports)
    report = FleetReport(deployment.file, mode, done, _differences(done), (), None)
    if report.compatible or not search:
        return report
    fixes, no_fix = _fixes(done, tuple(rule_sets), shipped)
    return report.replace(fixes=fixes, no_fix=no_fix)


__all__ = ["Difference", "Fix", "FleetReport", "SideReport", "decide_fleet"]
