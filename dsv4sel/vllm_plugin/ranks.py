"""The ranks of one vLLM instance: one KV contract, checked at start-up with one named refusal.

vLLM's engine core gathers every worker's KV-cache specs (TP ranks, PP stages, the workers of
every node) and merges them in ``get_global_kv_cache_groups``, whose only check is a bare
``assert`` ("The KV cache specs for the same layer are different across workers") that names no
rank and no field; PP stages have disjoint layers and are never compared, and a spec holds no
attention class or rule. Two release-folder ``LATER`` targets of ``vllm.v1.engine.core``
(:mod:`.later`; the engine-core process imports it) close that:

- AROUND ``EngineCore._initialize_kv_caches`` (:func:`make_initialize_kv_caches`), for a
  DeepSeek-V4 model: before vLLM asks the workers for their specs, the engine core asks each worker
  for its dsv4sel decision (:func:`worker_decision`, through vLLM's own ``collective_rpc``, which runs
  a function in every worker), and refuses ranks whose KV contracts differ, or a rank where dsv4sel
  did not decide, with one :class:`~dsv4sel.SelectionError` (:func:`contracts_refusal`) naming the
  ranks, each differing contract field with each value, and each rank's device, backend and rule
  (``file:line``). Every worker of the instance is compared, PP stages included;
- ``get_global_kv_cache_groups`` (:func:`make_global_kv_cache_groups`): while the first runs, a
  worker whose spec of a layer differs from another's (what vLLM's assert catches) is one
  SelectionError (:func:`specs_refusal`) naming the layer, the two ranks, each differing spec field
  with both values, and each rank's decision. vLLM's own code runs after both checks pass.

Data-parallel ranks are engine cores of their own: they are not compared with each other (no KV
crosses them inside one instance; across prefill and decode the NIXL hash carries the contract,
:mod:`.handshake`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from ..errors import SelectionError
from .reading import model_of
from .state import _state

#: what every refusal ends with
FIX = ("Launch every rank with the same --attention-backend and --kv-cache-dtype, on GPUs whose rules decide one "
       "KV record, with dsv4sel in every node's environment (`dsv4sel fleet DEPLOYMENT.yaml` checks a deployment "
       "before launch).")
NO_DECISION = ("no dsv4sel decision: vLLM decided alone there (dsv4sel's plugin did not run in that worker: install "
               "dsv4sel in every node's environment, and keep dsv4sel in VLLM_PLUGINS where that is set)")
UNREADABLE = ("an answer this dsv4sel cannot read (another dsv4sel release in that worker's environment?): install "
              "one dsv4sel release on every node")
#: what a worker's decision holds (:func:`worker_decision`)
_KEYS = {"device": str, "backend": str, "rule": str, "contract": dict, "fingerprint": str}


def worker_decision(worker: Any = None) -> dict[str, Any] | None:
    """Run in a worker (the engine core's ``collective_rpc``): the dsv4sel decision its layers were
    built with, as plain data, or None where dsv4sel decided nothing there."""
    selection = _state.get("selection")
    if selection is None:
        return None
    import vllm

    contract = selection.contract_for("vllm", vllm.__version__)
    q, rule = selection.query, selection.rule
    return {"device": f"{q.platform} {q.capability}", "backend": selection.backend,
            "rule": f"{rule.id} ({rule.location})", "contract": contract.fields(), "fingerprint": contract.fingerprint}


def _ranks(indices: list[int]) -> str:
    return f"rank{'s' if len(indices) > 1 else ''} {', '.join(map(str, indices))}"


def _readable(decision: Any) -> bool:
    """Whether a worker's answer is a decision as :func:`worker_decision` makes it (a worker may run
    another dsv4sel release)."""
    return isinstance(decision, dict) and all(isinstance(decision.get(k), t) for k, t in _KEYS.items())


def _groups(decisions: list) -> dict[str | None, list[int]]:
    """Ranks by contract fingerprint (None: no decision; ``?``: an answer not readable), in rank order."""
    groups: dict[str | None, list[int]] = {}
    for index, decision in enumerate(decisions):
        key = decision["fingerprint"] if _readable(decision) else None if decision is None else "?"
        groups.setdefault(key, []).append(index)
    return groups


def _decided(decision: dict) -> str:
    return f"{decision['device']}: {decision['backend']} by {decision['rule']}"


def contracts_refusal(decisions: list) -> str | None:
    """Why these workers' decisions (rank order, as :func:`worker_decision` gives them) cannot share
    one KV cache, or None when every rank decided one contract."""
    groups = _groups(decisions)
    if len(groups) == 1 and None not in groups:
        return None
    decided = [ranks for fingerprint, ranks in groups.items() if fingerprint not in (None, "?")]
    lines = []
    if decided:
        base = decided[0]
        ref = decisions[base[0]]
        for ranks in decided[1:]:
            other = decisions[ranks[0]]["contract"]
            fields = [f"{name} {other.get(name)} against {value}" for name, value in ref["contract"].items()
                      if other.get(name) != value and not name.endswith(".encoding")]
            lines.append(f"  {_ranks(ranks)} against {_ranks(base)}: {'; '.join(fields)}")
        by_decision: dict[str, list[int]] = {}
        for index, decision in enumerate(decisions):
            if _readable(decision):
                by_decision.setdefault(_decided(decision), []).append(index)
        lines += [f"  {_ranks(ranks)} ({text})" for text, ranks in by_decision.items()]
    lines += [f"  {_ranks(groups[key])}: {text}" for key, text in ((None, NO_DECISION), ("?", UNREADABLE))
              if key in groups]
    return ("DeepSeek-V4 KV cache: the ranks of this vLLM instance did not decide one KV contract, and the engine "
            "would plan one KV cache for all of them:\n" + "\n".join(lines) + "\n" + FIX)


def _spec_fields(first: Any, other: Any) -> str:
    """The fields two KV-cache specs differ in, each with the other's value against the first's."""
    if type(first) is not type(other):
        return f"spec type {type(other).__name__} against {type(first).__name__}"
    if not dataclasses.is_dataclass(first):
        return f"spec {other!r} against {first!r}"
    names = [f.name for f in dataclasses.fields(first)]
    return "; ".join(f"{name} {getattr(other, name)!r} against {getattr(first, name)!r}" for name in names
                     if getattr(other, name) != getattr(first, name))


def specs_refusal(specs_per_worker: list, decisions: list) -> str | None:
    """Why these workers' KV-cache specs (rank order: layer name -> spec) cannot be merged, or None:
    the first layer two ranks build differently, with each rank's decision where it is known."""
    seen: dict[str, tuple[int, Any]] = {}
    found: list[tuple[str, int, int]] = []
    for index, specs in enumerate(specs_per_worker):
        for layer, spec in specs.items():
            first_index, first = seen.setdefault(layer, (index, spec))
            if first != spec:
                found.append((layer, first_index, index))
    if not found:
        return None
    layer, a, b = found[0]
    more = len({f[0] for f in found}) - 1
    known = [f"  rank {i} ({_decided(decisions[i]) if i < len(decisions) and _readable(decisions[i]) else NO_DECISION})"
             for i in (a, b)]
    return (f"DeepSeek-V4 KV cache: rank {b} builds another KV cache spec than rank {a} for layer {layer}"
            f"{f' (and {more} more layers)' if more else ''}: {_spec_fields(seen[layer][1], specs_per_worker[b][layer])}\n"
            + "\n".join(known) + "\n" + FIX)


def _collect(executor: Any) -> list:
    """Every worker's :func:`worker_decision`, in rank order; a worker that cannot run it (dsv4sel
    not installed there) is one SelectionError."""
    try:
        found = executor.collective_rpc(worker_decision)
    except Exception as exc:  # noqa: BLE001 - whatever a worker fails with, the start is refused naming it
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise SelectionError(
            f"DeepSeek-V4 KV cache: dsv4sel cannot read the decision of every worker of this vLLM instance "
            f"({type(exc).__name__}: {text}); {FIX}") from None
    return list(found) if isinstance(found, (list, tuple)) else [found]


def make_initialize_kv_caches(original: Callable) -> Callable:
    def _initialize_kv_caches(self, vllm_config):
        if model_of(vllm_config) is None:
            return original(self, vllm_config)
        decisions = _collect(self.model_executor)
        refusal = contracts_refusal(decisions)
        if refusal is not None:
            raise SelectionError(refusal)
        _state["ranks"] = decisions
        try:
            return original(self, vllm_config)
        finally:
            _state["ranks"] = None

    _initialize_kv_caches.__doc__ = ("vLLM's _initialize_kv_caches after dsv4sel's check that every rank decided one "
                                     "KV contract (dsv4sel.vllm_plugin.ranks).")
    return _initialize_kv_caches


def make_global_kv_cache_groups(original: Callable) -> Callable:
    def get_global_kv_cache_groups(vllm_config, kv_cache_specs):
        decisions = _state.get("ranks")
        if decisions is not None:
            refusal = specs_refusal(kv_cache_specs, decisions)
            if refusal is not None:
                raise SelectionError(refusal)
        return original(vllm_config, kv_cache_specs)

    get_global_kv_cache_groups.__doc__ = ("vLLM's get_global_kv_cache_groups after dsv4sel's named check of the "
                                          "workers' specs (dsv4sel.vllm_plugin.ranks).")
    return get_global_kv_cache_groups
