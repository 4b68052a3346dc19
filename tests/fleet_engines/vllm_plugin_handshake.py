"""vLLM 0.33's own handshake and start-up checks, fed by sides built with and without the dsv4sel plugin
(runs in .venv-vllm only, one CUDA process).

Usage: ``python vllm_plugin_handshake.py JOB.json`` with ``{"sides": [SIDE], "pairs": [{"id", "prefill",
"decode"}], "ranks": [{"id", "workers": [side id, ...]}]}``, a side ``{"id", "model", "capability",
"backend", "kv", "mega", "model_path", "plugin"}``. Every side is built as vLLM builds it (the layer
vLLM's ``_select_dsv4_attn_cls`` chooses, its whole ``__init__``, as :mod:`vllm_sides` does): the sides
without the plugin first, with vLLM's own functions; then the plugin is installed as vLLM loads it
(``dsv4sel.vllm_plugin.install()``, the shipped rules) and the other sides are built through it. Right
after each build the side's NIXL compatibility hash is computed by the name NIXL's worker calls
(``nixl.base_worker.compute_nixl_compatibility_hash``: the plugin's once installed).

- a pair meets as NIXL's pull worker meets a remote: vLLM's own ``NixlBaseConnectorWorker._nixl_handshake``
  runs on decode's side against a socket that answers with prefill's handshake payload; ``passes`` once
  it reads past the hash check (the agent metadata, which this payload leaves out), else vLLM's error;
  the same with ``enforce_handshake_compat`` off (``escape_hatch``);
- ranks meet as the engine core meets its workers: vLLM's ``EngineCore._initialize_kv_caches`` (the
  plugin's, once installed) on an engine core whose executor runs each worker's function with that
  worker's decision in place (``collective_rpc``) and stops at its spec request; then vLLM's
  ``get_global_kv_cache_groups`` on the workers' sliding-window cache specs, in the context the first
  leaves. Each gives ``passes`` or the error it raises.

Prints ``{"sides": {id: {...}}, "pairs": {id: {...}}, "ranks": {id: {...}}}`` as JSON.
"""
from __future__ import annotations

import json
import sys
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "vllm33"))
sys.path.insert(0, str(HERE))

import stubs  # noqa: E402

LAYER = "model.layers.0.attn.swa_cache"
_built: dict = {}


class PastTheChecks(Exception):
    """vLLM read past the checks under test."""


def _build(n: int, side: dict) -> dict:
    import layers
    import oracle
    from vllm.config import set_current_vllm_config

    from dsv4sel.vllm_plugin.state import _state

    from dsv4sel import SelectionError

    stubs.set_device(side["capability"], "cuda")
    oracle._MEGA["available"] = side["mega"]
    stubs.set_flashinfer_sm120(True)
    try:
        cls = oracle._layer_class(side["model"], "cuda", oracle.vllm_config(side["backend"], side["kv"],
                                                                            model=side["model"]))
    except SelectionError as exc:  # the plugin refuses the side (at config time in `vllm serve`)
        return {"refused": str(exc)}
    layers.prepare()
    cfg = layers.vllm_config(side["backend"], side["kv"], layers._quant_config(oracle._cls_path(cls), "cuda"))
    _state["selection"] = None
    with set_current_vllm_config(cfg):
        layer = cls(cfg, prefix=f"model.layers.{n}.attn", topk_indices_buffer=None, aux_stream_list=None)
        spec = layer.swa_cache_layer.get_kv_cache_spec(cfg)
    compat = _hash(cfg, side["model_path"], layer.swa_cache_layer.backend_cls.get_name())
    _built[side["id"]] = {"selection": _state.get("selection"), "specs": {LAYER: spec}, "cfg": cfg}
    return {"class": oracle._cls_path(cls), "cache_dtype": str(cfg.cache_config.cache_dtype), "hash": compat}


def _hash(cfg, model_path: str, backend_name: str) -> str:
    """The side's NIXL compatibility hash, by the name NIXL's worker calls (``register_kv_caches``), over
    the side's config as far as the hash reads it (the model path it names; the first layer's backend
    name, the sliding-window cache's, as vLLM's worker takes it)."""
    import torch
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker

    standin = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model=model_path, dtype=torch.bfloat16, get_total_num_kv_heads=lambda: 1,
                                           get_head_size=lambda: 512, get_total_num_hidden_layers=lambda: 43),
        cache_config=cfg.cache_config, scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        speculative_config=None)
    return base_worker.compute_nixl_compatibility_hash(standin, backend_name, transfer_mode="pull")


class _Socket:
    """A REQ socket whose every answer is the remote's handshake payload."""

    def __init__(self, payload: bytes):
        self.payload = payload

    def setsockopt(self, *args):
        pass

    def send(self, msg):
        pass

    def recv_multipart(self):
        import msgspec

        return [self.payload, msgspec.msgpack.encode(time.perf_counter())]


def _handshake(local_hash: str, remote_hash: str, enforce: bool) -> str:
    import contextlib

    import msgspec
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import base_worker
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.metadata import NixlHandshakePayload

    payload = msgspec.msgpack.encode(NixlHandshakePayload(compatibility_hash=remote_hash, agent_metadata_bytes=b"\xc1"))
    worker = types.SimpleNamespace(_is_csa_linear=False, use_host_buffer=True, compat_hash=local_hash,
                                   enforce_compat_hash=enforce,
                                   transfer_topo=types.SimpleNamespace(handshake_target_ranks=lambda tp, dcp: [0]))
    base_worker.zmq_ctx = lambda kind, path: contextlib.nullcontext(_Socket(payload))
    try:
        base_worker.NixlBaseConnectorWorker._nixl_handshake(worker, "prefill", 5600, 1, "prefill-engine")
    except RuntimeError as exc:
        if str(exc).startswith("Failed to decode NixlAgentMetadata"):
            return "passes"  # past the hash check: this payload carries no agent metadata
        return f"RuntimeError: {exc}"
    return "passes"


def _pair(pair: dict, sides: dict) -> dict:
    prefill, decode = sides[pair["prefill"]], sides[pair["decode"]]
    return {"verdict": _handshake(decode["hash"], prefill["hash"], True),
            "escape_hatch": _handshake(decode["hash"], prefill["hash"], False)}


class _Executor:
    """An executor whose workers are built sides: ``collective_rpc`` runs the function in each with
    that side's decision in place; the spec request is where the checks under test are passed."""

    def __init__(self, workers: list[str]):
        self.workers = workers

    def collective_rpc(self, method, *args, **kwargs):
        """As vLLM's multiprocess executor sends a function to its workers (cloudpickle) and each worker
        runs it (vLLM's ``run_method``); the answers come back pickled."""
        import pickle

        import cloudpickle
        from vllm.v1.serial_utils import run_method

        from dsv4sel.vllm_plugin.state import _state

        sent = cloudpickle.dumps(method, protocol=pickle.HIGHEST_PROTOCOL)
        out = []
        for rank, name in enumerate(self.workers):
            _state["selection"] = _built[name]["selection"]
            out.append(pickle.loads(pickle.dumps(run_method(types.SimpleNamespace(rank=rank), sent, (), {}))))
        _state["selection"] = None
        return out

    def get_kv_cache_specs(self):
        raise PastTheChecks("get_kv_cache_specs")


class _MergedModel(types.SimpleNamespace):
    """The model config as vLLM's merge reads it; the first question after the merge is where its
    checks are passed."""

    @property
    def supports_kv_cache_grouping(self):
        raise PastTheChecks("supports_kv_cache_grouping")


def _attempt(fn) -> str:
    try:
        fn()
    except PastTheChecks:
        return "passes"
    except Exception as exc:  # noqa: BLE001 - the refusal is the observation
        return f"{type(exc).__name__}: {exc}"
    return "passes"


def _ranks(job: dict) -> dict:
    from vllm.v1.engine import core

    from dsv4sel.vllm_plugin import ranks
    from dsv4sel.vllm_plugin.state import _state

    workers = job["workers"]
    cfg = _built[workers[0]]["cfg"]
    engine = types.SimpleNamespace(model_executor=_Executor(workers))
    start = _attempt(lambda: core.EngineCore._initialize_kv_caches(engine, cfg))
    decisions = _Executor(workers).collective_rpc(ranks.worker_decision)
    _state["ranks"] = decisions  # the context _initialize_kv_caches leaves for the merge
    model_config = cfg.model_config
    object.__setattr__(cfg, "model_config", _MergedModel(**vars(model_config)))
    try:
        merge = _attempt(lambda: core.get_global_kv_cache_groups(cfg, [_built[w]["specs"] for w in workers]))
    finally:
        _state["ranks"] = None
        object.__setattr__(cfg, "model_config", model_config)
    return {"start": start, "merge": merge}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    import importlib

    import oracle

    oracle.prepare("cuda")
    # a module the layers import reads the capability at its import and, on SM90, the attributes of triton
    # configs the CPU environment lacks: import it once as another GPU (it decides nothing here)
    stubs.set_device("10.0", "cuda")
    importlib.import_module("vllm.model_executor.layers.mamba.mamba_mixer2")
    importlib.import_module("vllm.distributed.kv_transfer.kv_connector.v1.nixl.base_worker")
    sides: dict = {}
    order = sorted(job["sides"], key=lambda s: s["plugin"])  # vLLM's own sides before the plugin is installed
    for n, side in enumerate(order):
        if side["plugin"] and not sides.get("_installed"):
            import dsv4sel.vllm_plugin as plugin
            from dsv4sel.dsv4 import alternatives

            alternatives.nearest = lambda rules, query, limit=alternatives.LIMIT: ()
            plugin.install()
            oracle.clear_configs()  # AttentionConfig objects built from now on pass the patched __post_init__
            sides["_installed"] = True
        sides[side["id"]] = _build(n, side)
    sides.pop("_installed", None)
    out = {"sides": sides, "pairs": {p["id"]: _pair(p, sides) for p in job["pairs"]},
           "ranks": {r["id"]: _ranks(r) for r in job["ranks"]}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
