"""What each side of a deployment hands vLLM 0.33's own checks (runs in .venv-vllm only).

Usage: ``python vllm_sides.py SIDES.json`` with ``{"platform": P, "sides": [{"id", "model",
"capability", "backend", "kv", "mega", "model_path", "version"}]}`` (one platform per process: vLLM
fixes its platform at import). For each side it builds the DeepSeek-V4 attention layer vLLM chooses
(vLLM's own ``_select_dsv4_attn_cls``, the layer's whole ``__init__``, as the differential suite does,
:mod:`tests/vllm33`), then reads, all from vLLM's own code:

- ``cache_dtype``: ``cache_config.cache_dtype`` after the layer's resolution (what the NIXL hash reads);
- ``hash``: ``compute_nixl_compatibility_hash`` of the side (the model path and version it names; the
  first layer's backend name, the sliding-window cache's, as vLLM's worker takes it);
- ``block_size``: the cache block size the platform sets; ``swa_page``: the sliding-window cache
  spec's ``page_size_bytes`` (one NIXL region's block length); ``spec``: that spec's fields, as the
  engine core compares them across workers;
- ``fp8_dtype``: the platform's fp8 dtype (``current_platform.fp8_dtype()``: e4m3fnuz on gfx942).

Prints ``{id: {...}}`` as JSON; a side vLLM refuses gets ``{"error": ...}``.
"""
from __future__ import annotations

import dataclasses
import json
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "vllm33"))

import stubs  # noqa: E402


def _hash(cfg, side: dict, backend_name: str) -> str:
    import torch
    import vllm
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl import metadata

    standin = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model=side["model_path"], dtype=torch.bfloat16,
                                           get_total_num_kv_heads=lambda: 1, get_head_size=lambda: 512,
                                           get_total_num_hidden_layers=lambda: 43),
        cache_config=cfg.cache_config, scheduler_config=types.SimpleNamespace(disable_hybrid_kv_cache_manager=False),
        speculative_config=None)
    real = (vllm.__version__, metadata.NIXL_CONNECTOR_VERSION)
    if side["version"] != vllm.__version__:
        # a side of another release: this release's hash function fed with that release's version strings
        # (vLLM 0.34's NIXL connector is version 16, shared/fleet.md)
        vllm.__version__, metadata.NIXL_CONNECTOR_VERSION = side["version"], {"0.34": 16}[side["version"][:4]]
    try:
        return metadata.compute_nixl_compatibility_hash(standin, backend_name)
    finally:
        vllm.__version__, metadata.NIXL_CONNECTOR_VERSION = real


def _side(platform: str, n: int, side: dict) -> dict:
    import layers
    import oracle
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform

    stubs.set_device(side["capability"], platform)
    oracle._MEGA["available"] = side["mega"]
    stubs.set_flashinfer_sm120(True)
    cls = oracle._layer_class(side["model"], platform, oracle.vllm_config(side["backend"], side["kv"],
                                                                           model=side["model"]))
    layers.prepare()
    cfg = layers.vllm_config(side["backend"], side["kv"], layers._quant_config(oracle._cls_path(cls), platform))
    with set_current_vllm_config(cfg):
        layer = cls(cfg, prefix=f"model.layers.{n}.attn", topk_indices_buffer=None, aux_stream_list=None)
        spec = layer.swa_cache_layer.get_kv_cache_spec(cfg)
        current_platform.update_block_size_for_backend(cfg)
    fields = {f.name: str(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
    return {"class": oracle._cls_path(cls), "cache_dtype": str(cfg.cache_config.cache_dtype),
            "hash": _hash(cfg, side, layer.swa_cache_layer.backend_cls.get_name()),
            "block_size": cfg.cache_config.block_size, "swa_page": spec.page_size_bytes, "spec": fields,
            "fp8_dtype": str(current_platform.fp8_dtype()).removeprefix("torch.")}


def main() -> None:
    job = json.loads(Path(sys.argv[1]).read_text())
    platform = job["platform"]
    import oracle

    oracle.prepare(platform)
    if platform == "cuda":
        # a module the layers import reads the capability at its import and, on SM90, the attributes of
        # triton configs the CPU environment lacks: import it once as another GPU (it decides nothing here)
        import importlib

        stubs.set_device("10.0", platform)
        importlib.import_module("vllm.model_executor.layers.mamba.mamba_mixer2")
    out = {}
    for n, side in enumerate(job["sides"]):
        try:
            out[side["id"]] = _side(platform, n, side)
        except Exception as exc:  # noqa: BLE001 - reported per side; the test says which it expected
            out[side["id"]] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
