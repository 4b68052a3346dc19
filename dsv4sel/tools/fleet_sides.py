"""One side of a deployment decided as its engine decides it: the engines' inputs, in each rule set's words.

A side (:class:`~dsv4sel.tools.deployment.Side`) is decided one of two ways:

- ``engine``: what the engine does today, by its release's compat rule set
  (``rules/compat/<engine>-<release>``, found by :func:`dsv4sel.tools.releases.compat_dir`);
- ``dsv4sel``: what dsv4sel makes it do, by the shipped rules (with ``--rules`` packs): a vLLM
  side through :func:`dsv4sel.select`'s inputs, an SGLang side through the SGLang translation
  (the SGLang release's translation file, as the host registry names it), as the plugins decide.

A side's *settings* are what an operator sets on it: ``attention_backend``, ``kv_cache_dtype`` and
the environment variables that decide (:data:`ENV`), as ``{"attention_backend": ...,
"env.SGLANG_DSV4_KV_LAYOUT": ...}`` (None: unset). :func:`decide` takes a side and changes to its
settings, so the fleet's search for fixes decides the same way. An input its rule set does not
declare, or an unknown release, is a :class:`~dsv4sel.tools.deployment.DeploymentError` at the key.
"""

from __future__ import annotations

from ..dsv4.contract import sglang_pool_problem
from ..errors import InvalidQuery, SelectionError
from ..record import Frozen
from .deployment import DeploymentError, Side

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping

    from ..dsv4.contract import KVContract
    from ..dsv4.rules import RuleSet
    from ..dsv4.selection import Selection
    from ..engine.values import RuleRef

#: The environment variables that decide, per engine, and the values each may take.
ENV: dict[str, dict[str, tuple[str, ...]]] = {
    "vllm": {},
    "sglang": {
        "SGLANG_DSV4_KV_LAYOUT": ("v4", "auto", "v41", "v41_new"),
        "SGLANG_DSV4_COMPRESSED_KV_LAYOUT": ("auto", "fp8", "fp4"),
        "SGLANG_HACK_FLASHMLA_BACKEND": ("auto", "aiter_sparse", "unified_kv_triton"),
        "SGLANG_DSV4_UNIFIED_KV_FP8": ("0", "1"),
    },
}
MODES = ("dsv4sel", "engine")
#: SGLang's own input names (its translation's space) as a deployment file spells them.
SGLANG_KEYS = {"dsv4_attn_backend": "attention_backend (--dsv4-attn-backend)",
               "kv_layout_env": "env SGLANG_DSV4_KV_LAYOUT", "hip_kernel": "env SGLANG_HACK_FLASHMLA_BACKEND"}
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


class Outcome(Frozen):
    """A side decided: its selection and contract, or the reason its rules refuse it.

    ``rule`` is the deciding rule (the selecting or rejecting one; None for a translation's
    refusal, whose row is ``origin``); ``told`` the settings SGLang is told (empty for vLLM);
    ``notes`` what did not decide (an input the release's rules do not read)."""

    __slots__ = ("selection", "contract", "reason", "rule", "origin", "told", "notes")
    _defaults = {"told": (), "notes": ()}
    selection: Selection | None
    contract: KVContract | None
    reason: str | None
    rule: RuleRef | None
    origin: str | None
    told: tuple[tuple[str, Any], ...]
    notes: tuple[str, ...]


def settings_of(side: Side) -> dict[str, str | None]:
    """The side's settable values as given (None: unset)."""
    out: dict[str, str | None] = {"attention_backend": side.get("attention_backend"),
                                  "kv_cache_dtype": side.get("kv_cache_dtype")}
    env = dict(side.env)
    for name in ENV[side.engine]:
        out[f"env.{name}"] = env.get(name)
    return out


def check_env(side: Side) -> None:
    """Every variable of ``env`` must decide for the side's engine, with a value it takes."""
    known = ENV[side.engine]
    problems = []
    for name, value in side.env:
        if name not in known:
            names = ", ".join(known) or "none"
            problems.append(side.problem(f"env.{name}", "DSV703", f"{name} does not decide the DeepSeek-V4 cache "
                                         f"in {side.engine}; the variables that do: {names}"))
        elif _env_value(name, value) not in known[name]:
            problems.append(side.problem(f"env.{name}", "DSV702", f"{name}={value!r} is not one of "
                                         f"{', '.join(known[name])}"))
    if problems:
        raise DeploymentError(problems)


def _env_value(name: str, value: str | None) -> str | None:
    """An environment value as the engine reads it: lower case; a boolean as 0 or 1."""
    if value is None:
        return None
    value = value.strip().lower()
    if name == "SGLANG_DSV4_UNIFIED_KV_FP8":
        return "1" if value in _TRUE else "0" if value in _FALSE else value
    return value


def decide(side: Side, mode: str, rules: RuleSet, model: str, changes: Mapping[str, str | None] | None = None
           ) -> Outcome:
    """Decide ``side`` (with ``changes`` to its settings) by ``rules``, as ``mode`` says (see the
    module doc). InvalidQuery: a value outside the rule set's vocabulary; ValueError from a
    translation whose space lacks a value."""
    settings = {**settings_of(side), **(changes or {})}
    if side.engine == "vllm":
        return _vllm(side, rules, model, settings)
    return (_sglang_engine if mode == "engine" else _sglang_dsv4sel)(side, rules, model, settings)


def _extra(side: Side, rules: RuleSet, skip: tuple[str, ...]) -> dict[str, str]:
    """The side's other inputs (``mega_attn``...) and, where the rule set declares it, its role
    under disaggregation."""
    from ..dsv4.roles import with_role

    extra = {k: v for k, v in side.inputs if k not in skip}
    return with_role({"extra": extra}, rules.plain_inputs, side.disaggregation)["extra"]


def _select(rules: RuleSet, query: dict[str, Any], settle: Callable[[Selection], Outcome]) -> Outcome:
    q, notes = rules.normalize(**query)
    outcome = rules.outcome(q, notes)
    if hasattr(outcome, "reason"):
        return Outcome(None, None, outcome.reason, outcome.rule, None)
    return settle(outcome)  # type: ignore[arg-type]


def _vllm(side: Side, rules: RuleSet, model: str, settings: dict[str, str | None]) -> Outcome:
    query = {"platform": side.get("platform"), "capability": side.get("capability"),
             "backend": settings["attention_backend"], "kv_cache_dtype": settings["kv_cache_dtype"] or "auto",
             "model": model,
             "extra": _extra(side, rules, ("platform", "capability", "attention_backend", "kv_cache_dtype"))}
    notes = _unread_role(side, rules)
    return _select(rules, query, lambda sel: Outcome(sel, sel.contract_for("vllm", side.version), None, sel.rule,
                                                     None, (), notes))


def _unread_role(side: Side, rules: RuleSet) -> tuple[str, ...]:
    if side.disaggregation and "disaggregation" not in rules.plain_inputs and side.engine == "vllm":
        return (f"disaggregation {side.disaggregation} decides nothing in these rules (no rule reads it)",)
    return ()


def _sglang_env(settings: Mapping[str, str | None]) -> dict[str, str]:
    return {name: _env_value(name, settings.get(f"env.{name}")) or "" for name in ENV["sglang"]
            if settings.get(f"env.{name}") is not None}


def _sglang_settle(side: Side, settings: Mapping[str, str | None], told: Mapping[str, Any],
                   sel: Selection) -> Outcome:
    env = _sglang_env(settings)
    problem = sglang_pool_problem(told, env)
    if problem is not None:
        return Outcome(None, None, problem, sel.rule, None, tuple(told.items()))
    contract = sel.contract_for("sglang", side.version, told, env)
    return Outcome(sel, contract, None, sel.rule, None, tuple(told.items()))


def _sglang_point(side: Side, model: str, settings: Mapping[str, str | None]) -> dict[str, str]:
    """SGLang's own inputs: its flags, its environment and its deployment."""
    if side.disaggregation == "both":
        raise InvalidQuery("disaggregation 'both' is vLLM's kv_both; SGLang's --disaggregation-mode is "
                           "prefill or decode")
    env = _sglang_env(settings)
    point = {"model": model, "platform": side.get("platform") or "", "capability": side.get("capability") or "unknown",
             "kv_cache_dtype": settings["kv_cache_dtype"] or "auto",
             "kv_layout_env": env.get("SGLANG_DSV4_KV_LAYOUT", "unset"),
             "deployment": side.get("deployment") or ("pd" if side.disaggregation else "single")}
    if point["platform"] == "rocm":
        point["hip_kernel"] = env.get("SGLANG_HACK_FLASHMLA_BACKEND", "auto")
    return point


def _sglang_engine(side: Side, rules: RuleSet, model: str, settings: dict[str, str | None]) -> Outcome:
    point = _sglang_point(side, model, settings)
    backend = (settings["attention_backend"] or "auto").upper()
    extra = {k: v for k, v in point.items() if k in rules.plain_inputs}
    extra.update(_extra(side, rules, ("platform", "capability", "attention_backend", "kv_cache_dtype", "deployment")))
    query = {"platform": point["platform"], "capability": side.get("capability"), "model": model,
             "backend": None if backend == "AUTO" else backend, "kv_cache_dtype": point["kv_cache_dtype"],
             "extra": extra}
    return _select(rules, query, lambda sel: _sglang_settle(side, settings, sel.settings_for("sglang"), sel))


def _sglang_dsv4sel(side: Side, rules: RuleSet, model: str, settings: dict[str, str | None]) -> Outcome:
    from ..sglang_plugin.translation import translation

    t = translation()
    point = {**_sglang_point(side, model, settings), "dsv4_attn_backend": settings["attention_backend"] or "auto"}
    for name, value in point.items():
        values = t.space[name]
        declared = values.get(point["platform"], ()) if isinstance(values, dict) else values
        if value not in declared:
            raise InvalidQuery(f"{SGLANG_KEYS.get(name, name)} {value!r} is not one of SGLang 0.5.23's: "
                               f"{', '.join(declared)}")
    try:
        decision = t.decide(point, rules, role=side.disaggregation)
    except SelectionError as exc:
        return Outcome(None, None, exc.reason, exc.rule, exc.origin)
    return _sglang_settle(side, settings, decision.settings, decision.selection)
