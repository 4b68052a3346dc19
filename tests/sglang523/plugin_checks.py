"""The dsv4sel SGLang plugin in the real SGLang 0.5.23, one scenario per process.

Each scenario loads the plugin as SGLang does (``SGLANG_PLUGINS=dsv4sel``, SGLang's own
``load_plugins()``: entry point, then its HookRegistry) in a process stubbed as one GPU
(:mod:`stubs`) and returns what it observed. :func:`run` runs one in a process that has SGLang
imported already (differential.py forks one child per scenario: what a scenario patches dies with
its child):

- ``gate-metadata``: the installed SGLang's distribution metadata says 0.5.24 (a
  ``sglang-0.5.24.dist-info`` ahead of site-packages on ``sys.path``, as another install would be);
- ``gate-version``: ``sglang.version.__version__`` says 0.5.22;
- ``guards``: the scheduler guards on the process's platform (CUDA or ROCm), on SGLang's real
  layout function and backend factory, after a resolution the plugin decided, first untouched,
  then with the layout variable or the published decision changed;
- ``xpu``: a DeepSeek-V4 model served with ``--device xpu`` in a CUDA-stubbed process;
- ``roles``: with a pack that decides by the role under disaggregation (``tests/packs/pd_roles``),
  DeepSeek-V4 on SM100 alone and under PD (``--disaggregation-mode prefill``).

``npu`` needs a process of its own, stubbed as an Ascend NPU before SGLang is imported (SGLang
reads ``is_npu()`` into module constants at import):

    .venv-sglang/bin/python tests/sglang523/plugin_checks.py npu
"""
from __future__ import annotations

import json
import logging
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import oracle
import stubs


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


def gate(o: oracle.Oracle, how: str, other_sglang: str | None = None) -> dict:
    if how == "metadata":
        # importlib.metadata searches sys.path in order at each call: this dist-info is found first
        sys.path.insert(0, str(other_sglang))
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


def roles(o: oracle.Oracle) -> dict:
    """The pack's rule reads the role SGLang's ``--disaggregation-mode`` gives: under PD it sends
    V4.0 on SM100 to FlashInfer's bf16 rows, which SGLang cannot build (one refusal)."""
    import dsv4sel.api
    from dsv4sel.sglang_plugin import scheduler

    os.environ["DSV4SEL_RULES_PATH"] = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                    "packs", "pd_roles", "rules")
    dsv4sel.api._default = None  # the parent loaded the shipped rules; this child loads them with the pack
    _load_plugin()
    out = {}
    for deployment in ("single", "pd"):
        got = o.decide(_point(model="deepseek_v4", deployment=deployment))
        out[deployment] = {"stage": got.stage, "error": got.error, "message": got.message,
                           "published": scheduler.published()}
    return out


def _attempt(fn) -> dict:
    from dsv4sel import SelectionError

    try:
        out = fn()
    except SelectionError as exc:
        return {"error": "SelectionError", "message": str(exc)}
    except Exception as exc:  # noqa: BLE001 - SGLang's own refusal: not the guard's
        return {"error": type(exc).__name__, "message": str(exc)[:300]}
    return {"ok": repr(out)}


def guards(o: oracle.Oracle) -> dict:
    from dsv4sel.sglang_plugin import scheduler

    platform = o.platform
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
    return out


def device_xpu(o: oracle.Oracle) -> dict:
    """A launch with ``--device xpu`` in ``o``'s (CUDA-stubbed) process."""
    _load_plugin()
    seen = _keep_dsv4sel_log()
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


ASCEND = ("sglang.srt.hardware_backend.npu.attention.ascend_dsv4_backend", "DeepseekV4AscendAttnBackend")


def device_npu() -> dict:
    """A DeepSeek-V4 launch in a process stubbed as one Ascend NPU (``torch.npu``; ``torch_npu`` and
    Ascend's kernel packages stubbed), the plugin loaded: SGLang's own NPU branch resolves (page size
    128, bf16 cache, dsv4 for both phases) and its factory builds the Ascend class; dsv4sel logs its
    WARNING, declares and publishes nothing."""
    import importlib

    stubs.install("npu")
    from sglang.srt.arg_groups.overrides import resolution_result
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS
    from sglang.srt.runtime_context import get_platform, publish
    from sglang.srt.server_args import ServerArgs

    cls = getattr(importlib.import_module(ASCEND[0]), ASCEND[1])
    cls.__init__ = lambda self_, *a, **k: None  # its constructor allocates device buffers
    seen = _keep_dsv4sel_log()
    failed: list = []

    class Failed(logging.Handler):
        def emit(self, record):
            failed.append(record.getMessage())
    logging.getLogger("sglang.srt.plugins.hook_registry").addHandler(Failed(logging.ERROR))
    _load_plugin()
    sa = ServerArgs(model_path=oracle._model_dir("deepseek_v4"), skip_tokenizer_init=True)
    sa.resolve_once()
    from dsv4sel.sglang_plugin import scheduler

    declared = [src for src, _ in getattr(sa, "_resolved_overrides", ()) if src == "dsv4sel"]
    out = {**_patched_state(), "hook_errors": failed, "is_npu": get_platform().is_npu,
           "device": resolution_result(sa, "device"), "logged": seen,
           "declared": declared, "published": scheduler.published(),
           **{f: resolution_result(sa, f) for f in RESOLVED}}
    publish(sa, role="scheduler")
    built = ATTENTION_BACKENDS["dsv4"](oracle._Runner(sa))
    out["class"] = f"{type(built).__module__}:{type(built).__qualname__}"
    return out


RESOLVED = ("attention_backend", "prefill_attention_backend", "decode_attention_backend", "page_size",
            "kv_cache_dtype", "dsv4_attn_backend")


def _keep_dsv4sel_log() -> list:
    """dsv4sel's log records, as (level, message), from now on."""
    logging.disable(logging.NOTSET)
    seen: list = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.name.startswith("dsv4sel"):
                seen.append((record.levelname, record.getMessage()))
    logging.getLogger("dsv4sel").addHandler(Keep())
    return seen


def run(scenario: str, o: oracle.Oracle, other_sglang: str | None = None) -> dict:
    """One scenario in ``o``'s process (which it changes: run it in a child of its own)."""
    runs = {"gate-metadata": lambda: gate(o, "metadata", other_sglang), "gate-version": lambda: gate(o, "version"),
            "guards": lambda: guards(o), "xpu": lambda: device_xpu(o), "roles": lambda: roles(o)}
    return runs[scenario]()


def main() -> int:
    if sys.argv[1:] != ["npu"]:
        raise SystemExit(f"usage: {sys.argv[0]} npu")
    print(json.dumps(device_npu()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
