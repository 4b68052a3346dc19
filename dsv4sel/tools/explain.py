"""The explanation of one decision: what was chosen, how, and what else was possible.

:func:`explain` answers a query like :func:`dsv4sel.select`, but instead of a
bare Selection (or an exception) it returns an :class:`Explanation`:

* the outcome: the Selection, or the :class:`Refusal` with its reason;
* the **path**: every rule consulted, the default-backend rule first when the
  query named no backend, each with ``file:line``;
* the **rewrites** as before -> after (``cache_dtype``'s "before" is the
  query's kv-cache dtype: that is the cache-config value it replaces);
* the rule **messages**;
* **why not** every other backend of the platform: the first reason each would
  not serve this query, or what it would select if only it were asked for;
* on a rejection, the **nearest working alternatives**: the smallest change of
  backend and/or kv dtype that selects, one entry per distinct result
  (:mod:`dsv4sel.dsv4.alternatives`: the same list, in the same order, that
  ``SelectionError.suggestions`` names).

Everything is read from the compiled table (:mod:`dsv4sel.tools.probe`), so explaining
imports neither yaml, jsonschema nor torch. :func:`explain` returns the value and
renders nothing: ``dsv4sel explain`` prints it with :mod:`dsv4sel.cli.render.explain`;
:meth:`Explanation.as_dict` is its ``--json``.
"""

from __future__ import annotations

from . import probe
from ..dsv4.alternatives import Alternative, flag
from ..record import Frozen
from ..dsv4.rules import Rejection, RuleSet
from ..engine.artifact import Row
from ..engine.hosts import hosts_dict
from ..engine.values import Message, RuleRef
from ..dsv4.selection import Query, Selection

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing and dataclasses cost ~15 ms of cold start; values use record.Frozen
    from typing import Any, Mapping

    from ..dsv4.kvmemory import Geometry, KVMemory

#: Version of the :meth:`Explanation.as_dict` layout. Bumped only when a key is
#: removed or changes meaning; adding keys keeps the version.
JSON_VERSION = 1

#: Values of ``blocked_by`` (:class:`Refusal`, :class:`WhyNot`), broadest
#: first; a pack-declared input's name (e.g. ``mega_attn``) may also appear.
BLOCKED_BY = ("backend", "platform", "model", "capability", "kv_cache_dtype")


class PathStep(Frozen):
    """One rule on the way to the outcome.

    ``action`` is ``default`` (the default-backend decision picked ``target``),
    ``use`` (a backend table handed over to ``target``), ``select`` or
    ``reject`` (the deciding rule, always the last step). ``table`` is the
    decision table the rule belongs to: ``<default>`` or a backend name.
    """

    __slots__ = ("rule", "table", "action", "target", "description")
    _defaults = {"target": None, "description": None}

    rule: RuleRef
    table: str
    action: str
    target: str | None
    #: the rule's `description:`, why it exists (None when it has none)
    description: str | None


class Rewrite(Frozen):
    """A cache-config attribute the selection changes: ``before`` -> ``after``.

    ``before`` is what the query implies (the kv-cache dtype for
    ``cache_dtype``) or None when the rules cannot know the engine's value.
    """

    __slots__ = ("attribute", "before", "after")

    attribute: str
    before: Any
    after: Any


class Refusal(Frozen):
    """Why the query selects nothing.

    ``backend`` is the backend whose table rejected (the platform default's
    when none was named; None when the default decision itself rejected);
    ``rule`` the rejecting rule (None for a gap, where no rule decided);
    ``message`` the full one-line text :class:`~dsv4sel.SelectionError` carries.
    ``blocked_by`` (None for a gap) is the input to change, narrowest first:
    ``kv_cache_dtype`` when another kv dtype works here; a pack-declared
    input such as ``mega_attn`` when another value of it works; else
    ``capability`` when another capability of the platform works; ``model``
    when another model works on the platform; ``platform`` when the backend
    works only elsewhere; ``backend`` when it selects nowhere (not a
    DeepSeek-V4 backend). When the default decision itself rejected, the same
    questions are asked of the default decision.
    """

    __slots__ = ("backend", "reason", "rule", "gap", "message", "blocked_by")

    backend: str | None
    reason: str
    rule: RuleRef | None
    gap: bool
    message: str
    blocked_by: str | None


class WhyNot(Frozen):
    """Why another backend of the platform does not serve this query.

    ``verdict`` is ``rejects`` (its rules reject the query), ``would_serve``
    (it would select, but the query named another backend or the default
    decision picked another) or ``undecided`` (a gap in its table).
    ``blocked_by`` names the first input that stops it, as for
    :class:`Refusal` (None unless ``rejects``; a backend of the platform is
    never blocked by the platform, so it is ``capability`` or
    ``kv_cache_dtype``). ``rule`` is
    the rule that rejects, or for ``would_serve`` the rule that would select.
    ``accepts`` lists the kv dtypes it serves at this platform and capability.
    """

    __slots__ = ("backend", "verdict", "blocked_by", "reason", "rule", "accepts", "selection")
    _defaults = {"selection": None}

    backend: str
    verdict: str
    blocked_by: str | None
    reason: str
    rule: RuleRef | None
    accepts: tuple[str, ...]
    selection: Selection | None


class Explanation(Frozen):
    """Everything known about one decision. Exactly one of ``selection`` and
    ``rejection`` is set. ``alternatives`` is empty unless rejected. ``deciding``
    names the inputs of ``query.extra`` whose value changes this outcome
    (``flashinfer_sm120`` on SM12x, not on SM90): the text shows only those."""

    __slots__ = ("query", "selection", "rejection", "path", "rewrites", "messages", "why_not",
                 "alternatives", "rules_digest", "memory", "deciding")
    _defaults = {"memory": None, "deciding": ()}

    query: Query
    selection: Selection | None
    rejection: Refusal | None
    path: tuple[PathStep, ...]
    rewrites: tuple[Rewrite, ...]
    messages: tuple[Message, ...]
    why_not: tuple[WhyNot, ...]
    alternatives: tuple[Alternative, ...]
    rules_digest: str
    #: the KV memory ``explain(tokens=N)`` asked for (None: not asked, or rejected)
    memory: KVMemory | None
    deciding: tuple[str, ...]

    @property
    def ok(self) -> bool:
        """True when the query selects a backend."""
        return self.selection is not None

    @property
    def rule(self) -> RuleRef | None:
        """The deciding rule: the last step of the path (None for a bare gap)."""
        return self.path[-1].rule if self.path else None

    @property
    def description(self) -> str | None:
        """The deciding rule's `description:` (why it exists), or None."""
        return self.path[-1].description if self.path else None

    def as_dict(self) -> dict[str, Any]:
        """The explanation as JSON-ready data; keys documented in docs/cli.md."""
        return {
            "version": JSON_VERSION,
            "status": "selected" if self.ok else "rejected",
            "query": self.query.as_dict(),
            "selection": _selection_dict(self.selection),
            "rejection": None if self.rejection is None else {
                "backend": self.rejection.backend,
                "reason": self.rejection.reason,
                "blocked_by": self.rejection.blocked_by,
                "gap": self.rejection.gap,
                "message": self.rejection.message,
            },
            "rule": None if self.rule is None else {**_rule_fields(self.rule), "description": self.description},
            "path": [{**_rule_fields(s.rule), "table": s.table, "action": s.action, "target": s.target,
                      "description": s.description} for s in self.path],
            "rewrites": [{"attribute": r.attribute, "before": r.before, "after": r.after}
                         for r in self.rewrites],
            "messages": [{"level": m.level, "text": str(m)} for m in self.messages],
            "why_not": [{
                "backend": w.backend,
                "verdict": w.verdict,
                "blocked_by": w.blocked_by,
                "reason": w.reason,
                "rule": _rule_dict(w.rule),
                "accepts": list(w.accepts),
                "selection": _selection_dict(w.selection),
            } for w in self.why_not],
            "alternatives": [{
                "backend": a.backend,
                "kv_cache_dtype": a.kv_cache_dtype,
                "also": list(a.also),
                "changes": list(a.changes),
                "flags": a.flags,
                "selection": _selection_dict(a.selection),
                "rule": _rule_dict(a.selection.rule),
            } for a in self.alternatives],
            "rules_digest": self.rules_digest,
            "contract": None if self.selection is None else self.selection.contract.as_dict(),
            "memory": None if self.memory is None else self.memory.as_dict(),
        }


def _rule_dict(ref: RuleRef | None) -> dict[str, Any] | None:
    return None if ref is None else _rule_fields(ref)


def _rule_fields(ref: RuleRef) -> dict[str, Any]:
    from ..engine.sources import openable

    return {"id": ref.id, "file": ref.file, "line": ref.line, "location": ref.location, "pack": ref.pack,
            "path": openable(ref.file)}


def _selection_dict(sel: Selection | None) -> dict[str, Any] | None:
    if sel is None:
        return None
    return {
        **sel.fields(),
        "is_default": sel.is_default,
        "hosts": hosts_dict(sel.hosts, sel.host_settings),
    }


# ------------------------------------------------------------------ building

def explain(rules: RuleSet, *, platform: Any, kv_cache_dtype: Any = "auto", backend: Any = None,
            capability: Any = None, model: Any = None,
            extra: Mapping[str, Any] | None = None, tokens: int | None = None,
            layers: str | None = None) -> Explanation:
    """Explain the decision for one raw query (arguments as :func:`dsv4sel.select`;
    ``model`` None means the rules' default model). With ``tokens`` a selection also
    carries the KV memory that many tokens need (:mod:`dsv4sel.dsv4.kvmemory`), for the
    layers ``layers`` names (``swa=2,c4=21,c128=20,window=128``) or the model's known ones.

    Raises :class:`~dsv4sel.InvalidQuery` (naming the valid values and the
    nearest one) when an input is outside the rules' vocabulary, and ValueError for a
    ``layers`` that does not parse or a model whose layers dsv4sel does not know. A
    query that no backend serves is not an error here: the Explanation says why.
    """
    if model is None:
        model = rules.default_of("model") or rules.values("model")[0]
    query, notes = rules.normalize(platform=platform, kv_cache_dtype=kv_cache_dtype, backend=backend,
                                   capability=capability, model=model, extra=extra)
    geometry = None if tokens is None else _geometry(query.model, layers)
    result = explain_query(rules, query, notes)
    if geometry is not None and tokens is not None and result.selection is not None:
        from ..dsv4.kvmemory import kv_memory

        result = result.replace(memory=kv_memory(result.selection.contract, tokens, geometry))
    return result


def _geometry(model: str, layers: str | None) -> Geometry:
    """The layers ``--layers`` names, or the ones dsv4sel knows for ``model``; ValueError otherwise."""
    from ..dsv4.kvmemory import GEOMETRIES, RATIOS, parse_layers

    if layers is not None:
        return parse_layers(layers, model)
    if model in GEOMETRIES:
        return GEOMETRIES[model]
    keys = ",".join(["swa=A", *(f"c{r}={n}" for r, n in zip(RATIOS.get(model, ()), "BC"))])
    raise ValueError(f"dsv4sel knows no layer counts for {model}: pass them, --layers {keys},window=TOKENS "
                     "(from the checkpoint's config.json)")


def explain_query(rules: RuleSet, query: Query, notes: tuple[Message, ...] = ()) -> Explanation:
    """Explain a normalized query; ``notes`` are normalization's messages."""
    row = probe.at(rules, query)
    decided = rules.outcome(query, notes)
    path = _path(rules, row)
    if isinstance(decided, Selection):
        selection, refusal = decided, None
        rewrites = tuple(Rewrite(name, query.kv_cache_dtype if name == "cache_dtype" else None, value)
                         for name, value in decided.rewrites.items())
        messages = decided.messages + _impl_warning(decided.impl, decided.allowed_impl_modules)
        alternatives: tuple[Alternative, ...] = ()
    else:
        selection, refusal = None, _refusal(rules, query, decided)
        rewrites = ()
        # the rejection keeps the messages of the rules before it (e.g. the
        # default rule's "capability unknown" warning), normalization's first
        messages = decided.messages
        alternatives = rules.alternatives(query)
    # the chosen (or rejecting) backend and the requested one are the subject, not a "why not"
    excluded = {decided.backend, query.backend}
    why_not = tuple(_why_not(rules, query, b, path)
                    for b in probe.platform_backends(rules, query) if b not in excluded)
    point = query.point()
    deciding = tuple(name for name, _ in query.extra if rules.decides(name, point))
    return Explanation(query, selection, refusal, path, rewrites, messages, why_not, alternatives,
                       rules.digest, deciding=deciding)


def _impl_warning(impl: str, allowed: tuple[str, ...]) -> tuple[Message, ...]:
    """A warning when the selected impl will not load here, the problem `dsv4sel check` reports
    as DSV406: the answer must not look like a working selection. What is wrong is said:
    :func:`_impl_problem`."""
    problem = _impl_problem(impl, allowed)
    if problem is None:
        return ()
    return (Message(f"the impl {impl} cannot be loaded here ({problem}): loading it will fail; "
                    "`dsv4sel check` reports this as DSV406", "warning"),)


def _impl_problem(impl: str, allowed: tuple[str, ...]) -> str | None:
    """Why ``impl`` will not load here, or None, told as cheaply as it can be.

    An impl of the shipped kernels (the profile's own allow-list) is not imported on the happy
    path, so explain imports no torch and no ``typing`` for the shipped rules: its module is
    looked up (``find_spec`` imports its parent packages, never the module itself) and its
    source read for the class's top-level ``class`` statement. Any other impl (a pack's own
    module), and a shipped-module name whose class statement is not there, is loaded for real
    through the one loader (:func:`~dsv4sel.engine.values.load_impl_class`, as ``check`` and
    ``load_impl()`` load it), so a misspelled class, a name that is no impl and a module that
    raises at import (an impl without ``run_library``) each show, with the loader's reason."""
    from ..dsv4.profile import PROFILE
    from ..engine.values import check_impl_allowed, load_impl_class
    from ..errors import ImplLoadError

    try:
        module, attr = check_impl_allowed(impl, PROFILE.allowed_impl_modules)
    except ImplLoadError:
        pass  # not a shipped kernel: loaded below
    else:
        found = _class_statement(module, attr)
        if found is not None:
            return None if found else f"no module named {module!r}"
    try:
        load_impl_class(impl, allowed, PROFILE.impl_base)
    except ImplLoadError as exc:
        reason = str(exc)
        prefix = f"impl {impl!r}: "
        return reason[len(prefix):] if reason.startswith(prefix) else reason
    return None


#: The most of a module's source read to find a class statement (the shipped kernels' modules
#: are tens of kilobytes): past it, the module is loaded instead.
_SOURCE_READ = 1 << 20


def _class_statement(module: str, attr: str) -> bool | None:
    """False when ``module`` is not there; True when its source has the top-level statement
    ``class ATTR``; None when that cannot be told without importing it (then the caller does)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):  # a parent package is missing or broken
        return None
    if spec is None:
        return False
    origin = spec.origin if spec.has_location else None
    if not origin or not origin.endswith(".py"):
        return None
    try:
        with open(origin, "rb") as source:
            text = source.read(_SOURCE_READ + 1)
    except OSError:
        return None
    if len(text) > _SOURCE_READ:
        return None
    statement = b"\nclass " + attr.encode()
    text = b"\n" + text
    at = text.find(statement)
    while at != -1:
        if text[at + len(statement):at + len(statement) + 1] in (b"(", b":", b" "):
            return True
        at = text.find(statement, at + 1)
    return None


def _refusal(rules: RuleSet, query: Query, rejection: Rejection) -> Refusal:
    blocked = None if rejection.gap else _blocked_by(rules, query, rejection.backend)
    return Refusal(rejection.backend, rejection.reason, rejection.rule, rejection.gap, rejection.message(),
                   blocked)


def _blocked_by(rules: RuleSet, query: Query, backend: str | None) -> str:
    """The first input that stops ``backend`` (None: the default decision) on
    this query: the kv dtype when another kv dtype works here, else a
    pack-declared input (``mega_attn``...) when another value of it works, else
    the capability, the model, the platform, or ``backend`` when the backend
    selects nowhere at all. See :class:`Refusal`."""
    if probe.serves_somewhere(rules, query, backend, anywhere=False):
        return "kv_cache_dtype"
    for extra in probe.extra_combos(rules):
        if extra != query.extra and probe.serves_somewhere(rules, query, backend, anywhere=False, **dict(extra)):
            return next(name for (name, value), (_, mine) in zip(extra, query.extra) if value != mine)
    if probe.serves_somewhere(rules, query, backend):
        return "capability"
    if any(probe.serves_somewhere(rules, query, backend, model=model)
           for model in rules.values("model") if model != query.model):
        return "model"
    if backend is None or backend in rules.selectable_backends:
        return "platform"
    return "backend"


def _path(rules: RuleSet, row: Row) -> tuple[PathStep, ...]:
    indices = probe.path_of(row)
    tables = [rules.rule_table(i) for i in indices]
    steps = []
    for n, (index, table) in enumerate(zip(indices, tables)):
        last = n == len(indices) - 1
        if not last:
            # the next rule's table is the backend this step handed over to
            action = "default" if table == probe.DEFAULT_TABLE else "use"
            steps.append(PathStep(rules.rule(index), table, action, tables[n + 1], rules.description(index)))
        elif row.kind == "gap":
            # the last consulted rule handed over to a table in which nothing matched
            action = "default" if table == probe.DEFAULT_TABLE else "use"
            steps.append(PathStep(rules.rule(index), table, action, row.table, rules.description(index)))
        else:
            steps.append(PathStep(rules.rule(index), table, row.kind, None, rules.description(index)))
    return tuple(steps)


def _why_not(rules: RuleSet, query: Query, backend: str, path: tuple[PathStep, ...]) -> WhyNot:
    accepts = probe.accepted_kv(rules, query, backend)
    outcome = rules.outcome(query.replace(backend=backend))
    if isinstance(outcome, Selection):
        gives = f"it would give {outcome.layout}, {outcome.bytes_per_token} B/token"
        if query.backend is not None:
            reason = f"not requested: the query asks for {query.backend}; {gives}"
        elif path and path[0].action == "default":
            step = path[0]
            reason = (f"not the default: rule {step.rule.id} ({step.rule.location}) picks {step.target}; "
                      f"{gives} with {flag('backend', backend)}")
        else:
            reason = f"not the default: the default decision rejects this query; {gives} with " \
                     f"{flag('backend', backend)}"
        return WhyNot(backend, "would_serve", None, reason, outcome.rule, accepts, outcome)
    if outcome.gap:
        return WhyNot(backend, "undecided", None, outcome.reason, outcome.rule, accepts)
    return WhyNot(backend, "rejects", _blocked_by(rules, query, backend), outcome.reason, outcome.rule, accepts)
