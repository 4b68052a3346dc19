"""The dsv4sel SGLang plugin in the real SGLang 0.5.23, one scenario per process (run in .venv-sglang).

    .venv-sglang/bin/python tests/sglang523/plugin_checks.py SCENARIO

Each scenario loads the plugin as SGLang does (``SGLANG_PLUGINS=dsv4sel``, SGLang's own
``load_plugins()``: entry point, then its HookRegistry) in a process stubbed as one GPU
(:mod:`stubs`), and prints one JSON line of what it observed:

- ``gate-metadata``: the installed SGLang's distribution metadata says 0.5.24 (a
  ``sglang-0.5.24.dist-info`` ahead of site-packages on ``PYTHONPATH``, as another install would);
- ``gate-version``: ``sglang.version.__version__`` says 0.5.22;
- ``guards-cuda`` / ``guards-rocm``: the scheduler guards, on SGLang's real layout function and
  backend factory, after a resolution the plugin decided, first untouched, then with the layout
  variable or the published decision changed; on CUDA then also (key ``xpu``) a DeepSeek-V4
  model served with ``--device xpu`` (one process fewer: the plugin loads once per process).
"""
from __future__ import annotations

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oracle


def _load_plugin() -> None:
    from sglang.srt.plugins import load_plugins

    os.environ["SGLANG_PLUGINS"] = "dsv4sel"
    load_plugins()


def _patched_state() -> dict:
    from sglang.srt.arg_groups.resolution_hooks import _HOOKS
    from sglang.srt.plugins.hook_registry import HookRegistry

    from dsv4sel.sglang_plugin import STEP, scheduler

    ours = (scheduler.LAYOUT_TARGET, scheduler.FACTORY_TARGET, scheduler.HIP_TARGET)
    return {"resolution_hooks": [fn.__qualname__ for fn in _HOOKS.get(STEP, ())],
            "registered": sorted(t for t in HookRegistry._hooks if t in ours),
            "patched": sorted(t for t in HookRegistry._patched if t in ours)}


def _point(**over) -> dict:
    point = {"model": "deepseek_v4_1", "platform": "cuda", "capability": "10.0", "dsv4_attn_backend": "auto",
             "kv_cache_dtype": "auto", "kv_layout_env": "unset", "deployment": "attention_tp"}
    return {**point, **over}


def gate(how: str) -> dict:
    o = oracle.Oracle("cuda")
    if how == "version":
        import sglang.version

        sglang.version.__version__ = "0.5.22"
    logging.disable(logging.NOTSET)
    _load_plugin()
    state = _patched_state()
    got = o.decide(_point(kv_layout_env="v41"))
    declared = [src for src, _ in getattr(o.last_args, "_resolved_overrides", ()) if src == "dsv4sel"]
    from dsv4sel.sglang_plugin import scheduler

    return {**state, "stage": got.stage, "error": got.error, "message": got.message, "declared": declared,
            "layout_env": os.environ.get("SGLANG_DSV4_KV_LAYOUT"), "published": scheduler.published()}


def _attempt(fn) -> dict:
    from dsv4sel import SelectionError

    try:
        out = fn()
    except SelectionError as exc:
        return {"error": "SelectionError", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - SGLang's own refusal: not the guard's
        return {"error": type(exc).__name__, "message": str(exc)[:300]}
    return {"ok": repr(out)}


def guards(platform: str) -> dict:
    from dsv4sel.sglang_plugin import scheduler

    o = oracle.Oracle(platform)
    _load_plugin()
    # on ROCm, gfx950 with aiter_sparse: the one place SGLang itself builds either record
    point = _point() if platform == "cuda" else _point(platform="rocm", capability="gfx950", model="deepseek_v4",
                                                       deployment="single", hip_kernel="aiter_sparse")
    first = o.decide(point)  # the plugin decides, SGLang builds (guards pass)
    decided = scheduler.published()
    sa = o.last_args
    o.publish(sa, role="scheduler")
    out: dict = {**_patched_state(), "untouched": first.as_dict(), "decided": decided}
    # the scheduler's environment asks for another record than the one decided
    os.environ["SGLANG_DSV4_KV_LAYOUT"] = "v4" if decided["kv_layout"] != "v4" else "v41"
    out["layout_changed"] = _attempt(o.pool.select_dsv4_kv_layout)
    os.environ["SGLANG_DSV4_KV_LAYOUT"] = decided["kv_layout"]
    out["layout_restored"] = _attempt(lambda: o.pool.select_dsv4_kv_layout()[0].name)
    # the published decision names another class than the one the factory builds
    other = "sglang.srt.layers.attention.deepseek_v4_mega_backend:DeepseekV4MegaAttnBackend"
    os.environ[scheduler.DECISION_ENV] = json.dumps({**decided, "class": other})
    out["class_changed"] = _attempt(lambda: o.factory(oracle._Runner(sa)))
    if platform == "cuda":
        out["xpu"] = device_xpu(o)
    return out


def device_xpu(o: oracle.Oracle) -> dict:
    """A launch with ``--device xpu`` in ``o``'s process, the plugin already loaded."""
    logging.disable(logging.NOTSET)
    seen = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.name.startswith("dsv4sel"):
                seen.append((record.levelname, record.getMessage()))
    logging.getLogger("dsv4sel").addHandler(Keep())
    sa = o.ServerArgs(model_path=o.models["deepseek_v4"], skip_tokenizer_init=True, device="xpu")
    try:
        sa.resolve_once()
        error = None
    except Exception as exc:  # noqa: BLE001 - SGLang's own outcome is the observation
        error = f"{type(exc).__name__}: {exc}"[:300]
    declared = [src for src, _ in getattr(sa, "_resolved_overrides", ()) if src == "dsv4sel"]
    from dsv4sel.sglang_plugin import scheduler

    return {"logged": seen, "error": error, "declared": declared, "published": scheduler.published(),
            "dsv4_attn_backend": o.result(sa, "dsv4_attn_backend") if error is None else None}


def main() -> int:
    scenario = sys.argv[1]
    runs = {"gate-metadata": lambda: gate("metadata"), "gate-version": lambda: gate("version"),
            "guards-cuda": lambda: guards("cuda"), "guards-rocm": lambda: guards("rocm")}
    print(json.dumps(runs[scenario]()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
