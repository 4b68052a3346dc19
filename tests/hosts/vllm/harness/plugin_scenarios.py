"""The dsv4sel plugin as a vLLM release loads it, one scenario per process (runs in its vLLM environment only).

    DSV4SEL_TEST_PLATFORM=cuda VENV/bin/python tests/hosts/vllm/harness/plugin_scenarios.py load
    ... plugin_scenarios.py config MODEL_DIR [--kv-cache-dtype D] [--attention-backend B]
    ... plugin_scenarios.py model DIR ARCH [DIR ARCH ...]  # writes tiny HF configs (no weights)

``load`` applies vLLM's own default logging configuration (``vllm.logger.configure_logging``
with a default ``LoggingConfig``, what ``vllm serve`` does), then runs vLLM's real
``load_general_plugins()``: the plugin is found through its installed entry point.
``config`` then builds the engine configuration as ``vllm serve`` does
(``EngineArgs(...).create_engine_config()``: ``VllmConfig`` validation, where the plugin decides)
and prints one JSON line: ``{"ok": true}`` or the exception's type and first line.
The platform is stubbed (:mod:`stubs`) when ``DSV4SEL_TEST_PLATFORM`` is set (capability from
``DSV4SEL_TEST_CAPABILITY``); unset, vLLM finds no platform on this machine.
``DSV4SEL_TEST_FAKE_VERSION`` makes ``vllm.__version__`` that string (a vLLM the plugin is not
written for), set before the plugins load.
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _platform() -> None:
    platform = os.environ.get("DSV4SEL_TEST_PLATFORM")
    if platform:
        import stubs

        stubs.setup(platform)
        stubs.set_device(os.environ.get("DSV4SEL_TEST_CAPABILITY", "9.0"), platform)


def load() -> None:
    _platform()
    import vllm
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    if os.environ.get("DSV4SEL_TEST_FAKE_VERSION"):
        vllm.__version__ = os.environ["DSV4SEL_TEST_FAKE_VERSION"]
    configure_logging(LoggingConfig())
    from vllm.plugins import load_general_plugins

    load_general_plugins()


def config(model_dir: str, args: list[str]) -> None:
    """One engine configuration per ``MODEL_DIR [--flag value ...]`` group (groups separated by
    ``+``), in order, in this one process: one JSON line each."""
    load()
    group: list[str] = []
    for arg in [model_dir, *args, "+"]:
        if arg == "+":
            _one_config(group[0], group[1:])
            group = []
        else:
            group.append(arg)


def _one_config(model_dir: str, args: list[str]) -> None:
    from vllm.engine.arg_utils import EngineArgs

    kw = {"model": model_dir, "skip_tokenizer_init": True, "load_format": "dummy", "max_model_len": 1024}
    it = iter(args)
    for flag in it:
        key, value = flag.lstrip("-").replace("-", "_"), next(it)
        # a JSON flag (--kv-transfer-config) as vLLM's CLI parses it
        kw[key] = json.loads(value) if key == "kv_transfer_config" else value
    print(f"== config {model_dir} {' '.join(args)}", file=sys.stderr, flush=True)
    try:
        EngineArgs(**kw).create_engine_config()
    except Exception as exc:  # noqa: BLE001 - whatever vLLM raises is the scenario's observation
        cause = exc
        # pydantic wraps a validator's ValueError; report the one the plugin raised
        errors = getattr(exc, "errors", None)
        if callable(errors):
            ctx = (errors() or [{}])[0].get("ctx", {}).get("error")
            cause = ctx if isinstance(ctx, BaseException) else exc
        # "text": the exception's last traceback line as `vllm serve` prints it
        print(json.dumps({"ok": False, "error": type(cause).__name__, "wrapped_in": type(exc).__name__,
                          "message": str(cause).strip()[:3000],
                          "text": f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"}), flush=True)
        return
    print(json.dumps({"ok": True}), flush=True)


def model(out: str, arch: str) -> None:
    from transformers import AutoConfig

    model_type = {"DeepseekV4ForCausalLM": "deepseek_v4", "LlamaForCausalLM": "llama"}[arch]
    extra = ({"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64}
             if model_type == "deepseek_v4" else {"intermediate_size": 128, "num_key_value_heads": 4})
    AutoConfig.for_model(model_type, vocab_size=1024, hidden_size=256, num_hidden_layers=2, num_attention_heads=64,
                         architectures=[arch], max_position_embeddings=4096, **extra).save_pretrained(out)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "load":
        load()
    elif what == "config":
        config(sys.argv[2], sys.argv[3:])
    elif what == "model":  # DIR ARCH [DIR ARCH ...]
        for i in range(2, len(sys.argv), 2):
            model(sys.argv[i], sys.argv[i + 1])
    else:
        raise SystemExit(f"unknown scenario {what!r}")
