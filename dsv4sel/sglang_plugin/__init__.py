"""dsv4sel in SGLang 0.5.23: DeepSeek-V4 attention decided by the rules, at config time.

Entry point ``dsv4sel`` in SGLang's group ``sglang.srt.plugins`` (enable with
``SGLANG_PLUGINS=dsv4sel``). :func:`register` wraps SGLang's resolution step
``handle_model_specific_adjustments`` (its official ``register_resolution_hook``) with
:func:`decide`, which, for ``DeepseekV4ForCausalLM`` only:

1. reads the user's raw values (``resolving_view``: still unresolved here), the model type,
   SGLang's platform and the GPU, and the environment variables SGLang decides with;
2. decides them with :func:`dsv4sel.sglang_plugin.translation.decide` (the shipped rules), raising
   :class:`dsv4sel.SelectionError` before anything is loaded;
3. declares the rule's ``--dsv4-attn-backend`` and kv-cache dtype (``declare_resolution``) and
   sets ``SGLANG_DSV4_KV_LAYOUT`` to the decided layout (the scheduler processes, spawned after
   resolution, inherit it);
4. runs SGLang's own step, then checks that SGLang resolved the rule's values
   (``attention_backend`` dsv4, ``page_size`` 256, ``dsv4_attn_backend``, ``kv_cache_dtype``)
   and raises if not.

After a decision the hook publishes it for the scheduler processes
(:mod:`dsv4sel.sglang_plugin.scheduler`), whose guards check the layout and the class SGLang
actually builds after the weights load, with the KV contract of what SGLang builds, which the
PD handshake then carries and compares (:mod:`dsv4sel.sglang_plugin.handshake`).

On NPU and XPU dsv4sel decides nothing: no rule names an SGLang class there. The hook logs one
WARNING saying so (:data:`NOT_DECIDED`) and runs SGLang's own step unchanged. On an NPU no
scheduler guard is registered either.

SGLang logs and swallows exceptions raised while a plugin loads, so the version gate acts inside
the hook: on any SGLang other than 0.5.23 (as its distribution metadata or ``sglang.__version__``
reports it), and wherever the version cannot be read at all (no metadata, no ``sglang.version``,
a version that is not PEP 440), :func:`register` only registers a hook that raises
:class:`PluginError`, and patches nothing else: SGLang never decides alone when the user asked
for dsv4sel.
"""
from __future__ import annotations

import logging
import os

from ..errors import SelectionError
from ..engine.hosts import version_matches
from . import handshake, scheduler
from .translation import VERSIONS, HostDecision, decide as decide_point, translation as sglang_translation

logger = logging.getLogger(__name__)
STEP = "handle_model_specific_adjustments"
ARCH = "DeepseekV4ForCausalLM"
MODEL_TYPES = {"deepseek_v4": "deepseek_v4", "deepseek_v41": "deepseek_v4_1"}


#: The one line the hook logs on a device dsv4sel does not decide for (SGLang's platform name).
NOT_DECIDED = ("dsv4sel: DeepSeek-V4 attention on %s is not decided by dsv4sel (no rule names an SGLang class "
               "there); SGLang 0.5.23 decides alone, unchecked. Unset SGLANG_PLUGINS=dsv4sel to silence this.")


class PluginError(RuntimeError):
    """The installed SGLang is not one this plugin is written for."""


def _sglang_versions() -> tuple[str, ...]:
    """The installed SGLang's version as its distribution metadata says and as SGLang reports it
    (``sglang.version.__version__``); both must be supported."""
    from importlib import metadata

    from sglang.version import __version__

    return tuple(dict.fromkeys((metadata.version("sglang"), __version__)))


def _unsupported() -> str | None:
    """Why this SGLang is not one the plugin is written for (None: it is). Any failure to read the
    version is a reason, never an exception: an exception in ``register()`` would be swallowed and
    SGLang would decide alone."""
    try:
        versions = _sglang_versions()
    except Exception as exc:  # noqa: BLE001 - whatever reading the host fails with, the plugin refuses
        return f"the installed SGLang's version cannot be read ({type(exc).__name__}: {str(exc)[:200]})"
    for version in versions:
        try:
            ok = version_matches(version, VERSIONS)
        except (TypeError, ValueError):
            return f"the installed SGLang reports version {version!r}, which is not a PEP 440 version"
        if not ok:
            return f"this is sglang {version}"
    return None


def _device(cfg) -> tuple[str, str] | None:
    """(platform, capability) in the rules' words, or None on a device dsv4sel does not decide for."""
    import torch
    from sglang.srt.runtime_context import get_platform

    if get_platform().is_hip:
        return "rocm", torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
    if cfg.device == "cuda":
        major, minor = torch.cuda.get_device_capability()
        return "cuda", f"{major}.{minor}"
    return None


def _deployment(cfg) -> str:
    """The host space's deployment value of SGLang's raw arguments (one deviation at most)."""
    # in this order: a refused flag (another attention backend) decides whatever else is set
    found = [*_backend_deviations(cfg), *_speculative_deviations(cfg), *_parallel_deviations(cfg)]
    return found[0] if found else "single"


def _backend_deviations(cfg) -> list[str]:
    """An attention backend other than DeepSeek-V4's, for both phases or for one."""
    found = ["attention_backend_other"] if cfg.attention_backend not in (None, "dsv4") else []
    found += ["prefill_backend_other" for split in ("prefill_attention_backend", "decode_attention_backend")
              if getattr(cfg, split) not in (None, "dsv4")]
    return found


def _speculative_deviations(cfg) -> list[str]:
    """EAGLE or DSPARK speculative decoding; another algorithm is refused here, as SGLang refuses it."""
    algorithm = cfg.speculative_algorithm
    if algorithm is None:
        return []
    if algorithm not in ("EAGLE", "DSPARK"):
        raise SelectionError(f"DeepSeek-V4 attention in SGLang: speculative algorithm "
                             f"{algorithm} is not EAGLE or DSPARK (SGLang 0.5.23 refuses it too).")
    return [algorithm.lower()]


def _parallel_deviations(cfg) -> list[str]:
    """Prefill context parallelism, PD disaggregation or attention tensor parallelism (the first that holds)."""
    if cfg.enable_prefill_cp:
        return ["prefill_cp"]
    if cfg.disaggregation_mode not in (None, "null"):
        return ["pd"]
    if (cfg.tp_size or 1) > 1 and (cfg.attn_dp_size or 1) < cfg.tp_size:
        return ["attention_tp"]
    return []


#: SGLang's --disaggregation-mode values, as roles (:mod:`dsv4sel.dsv4.roles`)
DISAGGREGATION_MODES = {None: "none", "null": "none", "prefill": "prefill", "decode": "decode"}


def role(server_args) -> str:
    """The process's role under disaggregation, from ``--disaggregation-mode``; a mode the
    plugin does not know is one refusal (never a guess)."""
    from sglang.srt.arg_groups.model_override_base import resolving_view

    mode = resolving_view(server_args).disaggregation_mode
    if not isinstance(mode, (str, type(None))) or mode not in DISAGGREGATION_MODES:
        raise SelectionError(f"DeepSeek-V4 attention in SGLang: --disaggregation-mode {mode!r} is not one the "
                             "dsv4sel plugin knows (null, prefill, decode); dsv4sel decides nothing for it.")
    return DISAGGREGATION_MODES[mode]


def host_point(server_args) -> dict | None:
    """SGLang's raw inputs as a point of the host space (None on a device dsv4sel does not decide for)."""
    from sglang.srt.arg_groups.model_override_base import model_config_of, resolving_view

    cfg = resolving_view(server_args)
    model_type = model_config_of(server_args).hf_config.model_type
    device = _device(cfg)
    if device is None:
        return None
    platform, capability = device
    point = {"model": MODEL_TYPES.get(model_type, model_type), "platform": platform, "capability": capability,
             "dsv4_attn_backend": cfg.dsv4_attn_backend, "kv_cache_dtype": cfg.kv_cache_dtype,
             "kv_layout_env": os.environ.get("SGLANG_DSV4_KV_LAYOUT", "unset").lower() or "unset",
             "deployment": _deployment(cfg)}
    if platform == "rocm":
        point["hip_kernel"] = os.environ.get("SGLANG_HACK_FLASHMLA_BACKEND", "auto")
    return point


def decide(server_args, previous) -> HostDecision | None:
    """The resolution hook (see the module docstring). Returns the decision (None for another model)."""
    from sglang.srt.arg_groups.model_override_base import model_config_of
    from sglang.srt.arg_groups.overrides import declare_resolution, resolution_result

    scheduler.forget()
    if model_config_of(server_args).hf_config.architectures[0] != ARCH:
        previous(server_args)
        return None
    point = host_point(server_args)
    if point is None:
        from sglang.srt.arg_groups.model_override_base import resolving_view

        logger.warning(NOT_DECIDED, resolving_view(server_args).device)
        previous(server_args)
        return None
    sglang_translation().check_point(point)  # a value outside SGLang's space: one refusal naming it
    decision = decide_point(point, role=role(server_args))
    s, rule = decision.settings, decision.selection.rule
    declare_resolution(server_args, "dsv4sel", dsv4_attn_backend=s["dsv4_attn_backend"],
                       kv_cache_dtype=s["kv_cache_dtype"])
    os.environ["SGLANG_DSV4_KV_LAYOUT"] = s["kv_layout"]
    previous(server_args)
    got = {f: resolution_result(server_args, f) for f in ("attention_backend", "page_size",
                                                           "dsv4_attn_backend", "kv_cache_dtype")}
    want = {"attention_backend": "dsv4", "page_size": s["page_size"],
            "dsv4_attn_backend": s["dsv4_attn_backend"], "kv_cache_dtype": s["kv_cache_dtype"]}
    if got != want:
        raise SelectionError(f"DeepSeek-V4 attention in SGLang: SGLang resolved {got}, not the rule's {want} "
                             f"({rule.location}).")
    publish(decision)
    logger.info("dsv4sel: --dsv4-attn-backend %s, KV layout %s, kv-cache dtype %s, page size %d -> %s, "
                "decided by %s (%s)", s["dsv4_attn_backend"], s["kv_layout"], s["kv_cache_dtype"],
                s["page_size"], decision.cls.rpartition(":")[2], rule.id, rule.location)
    return decision


def publish(decision: HostDecision) -> None:
    """Publish a decision for the scheduler processes (:func:`scheduler.publish
    <dsv4sel.sglang_plugin.scheduler.publish>`), with the KV contract this SGLang builds for it in
    this environment (:func:`handshake.contract_tag <dsv4sel.sglang_plugin.handshake.contract_tag>`)."""
    rule = decision.selection.rule
    scheduler.publish(decision.cls, decision.settings, rule.id, rule.location,
                      handshake.contract_tag(decision, _sglang_versions()[0], handshake.engine_env()))


def register() -> None:
    """The ``sglang.srt.plugins`` entry point: wrap the config-time step and guard the scheduler's
    builders, or, on an SGLang this plugin is not written for, register only a hook that refuses
    (an exception here would be swallowed) and patch nothing else."""
    from sglang.srt.arg_groups.resolution_hooks import register_resolution_hook

    why = _unsupported()
    if why is not None:
        def refuse(server_args, previous):
            raise PluginError(f"dsv4sel's SGLang plugin supports sglang {VERSIONS}; {why}. Unset "
                              "SGLANG_PLUGINS=dsv4sel or install a supported SGLang.")
        register_resolution_hook(STEP)(refuse)
        return

    import sglang.srt.arg_groups.overrides  # noqa: F401  SGLang's own providers register first

    def hook(server_args, previous):
        decide(server_args, previous)
    register_resolution_hook(STEP)(hook)
    from sglang.srt.runtime_context import get_platform

    if not get_platform().is_npu:
        # the guards check CUDA's and ROCm's builders: an NPU builds its own class (and its
        # processes need not import those modules, whose patching SGLang would log as failed)
        scheduler.register_guards()
        handshake.register()  # the KV contract at SGLang's PD handshake
