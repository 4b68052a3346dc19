"""SGLang 0.5.23's vocabulary mapped onto the shipped rules, declared as data.

One SGLang input (the host space of ``rules/compat/sglang-0.5.23/vocabulary.yaml``: model,
platform, capability, ``--dsv4-attn-backend``, ``--kv-cache-dtype``, ``SGLANG_DSV4_KV_LAYOUT``,
the deployment and ``SGLANG_HACK_FLASHMLA_BACKEND``) is decided in three steps, each a table below:

1. :data:`REFUSE` - host inputs dsv4sel refuses before asking the rules (first hit), each with
   the SGLang behaviour it replaces;
2. :data:`BACKEND` / :data:`KV` / :func:`query` - the dsv4sel query the input means;
3. the shipped rules decide; the selected rule's ``hosts: {sglang: ...}`` entry (its class and
   ``settings``, :meth:`Selection.host_class` / :meth:`Selection.settings_for`) says what SGLang
   must be told to build it, and a selection with no such entry is refused. A set
   ``SGLANG_DSV4_KV_LAYOUT`` other than the decided layout is refused (the layout is decided,
   never left to the variable).

:func:`decide` returns a :class:`HostDecision` (the settings and the deciding rule) or raises
:class:`dsv4sel.SelectionError`. It never imports SGLang.
"""
from __future__ import annotations

from typing import Any

from ..errors import SelectionError
from ..record import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..dsv4.selection import Selection

HOST = "sglang"
VERSIONS = ">=0.5.23,<0.5.24"
#: (fix, when, reason): the first row whose ``when`` holds refuses. ``when`` maps an input to a
#: value or a tuple of values; a leading "!" negates one value.
REFUSE: tuple[tuple[str, dict, str], ...] = (
    ("S1", {"deployment": "attention_backend_other"},
     "--attention-backend names a backend that is not DeepSeek-V4's; SGLang 0.5.23 replaces it with "
     "dsv4 (logged at info only). Choose the DeepSeek-V4 kernel with --dsv4-attn-backend "
     "{{auto, flashmla, flashmla_mega, trtllm}} instead."),
    ("S1", {"deployment": "prefill_backend_other"},
     "--prefill-attention-backend names a backend that is not DeepSeek-V4's; SGLang 0.5.23 keeps it and "
     "builds a hybrid backend whose prefill half cannot read the DeepSeek-V4 cache. Drop it and choose "
     "the kernel with --dsv4-attn-backend."),
    ("-", {"kv_cache_dtype": ("bf16", "mxfp8", "nvfp4", "fp4_mx_block16")},
     "kv-cache dtype {kv_cache_dtype} is not a DeepSeek-V4 cache in SGLang 0.5.23 (it refuses it too, "
     "with an assert); use --kv-cache-dtype auto or fp8_e4m3."),
    ("-", {"model": "deepseek_v4_1", "deployment": "eagle"},
     "DeepSeek-V4.1 takes DSpark speculative decoding only, not EAGLE (SGLang 0.5.23 refuses it too)."),
    ("-", {"model": "deepseek_v4_1", "hip_kernel": "unified_kv_triton"},
     "DeepSeek-V4.1 does not support SGLang's unified KV pool (SGLang 0.5.23 refuses it too)."),
    ("S2", {"hip_kernel": "unified_kv_triton"},
     "SGLANG_HACK_FLASHMLA_BACKEND=unified_kv_triton stores bf16 rows in SGLang's unified pool, a cache no "
     "dsv4sel rule selects on ROCm; unset it (the default kernel reads the fp8_ds_mla record)."),
    ("S2", {"hip_kernel": "aiter_sparse", "capability": "!gfx950"},
     "SGLANG_HACK_FLASHMLA_BACKEND=aiter_sparse needs gfx950; SGLang 0.5.23 accepts it on {capability} and "
     "fails at the first forward. Unset it."),
    ("-", {"dsv4_attn_backend": "trtllm", "deployment": ("pd", "prefill_cp")},
     "--dsv4-attn-backend trtllm does not support PD disaggregation or context parallelism (SGLang 0.5.23 "
     "refuses it too)."),
    ("-", {"platform": "rocm", "model": "deepseek_v4_1", "deployment": "prefill_cp"},
     "prefill context parallelism on ROCm does not support DeepSeek-V4.1 (SGLang 0.5.23 refuses it too)."),
    ("S2", {"dsv4_attn_backend": "trtllm", "capability": ("!10.0", "!10.3")},
     "--dsv4-attn-backend trtllm runs TRT-LLM-gen kernels built for SM100/SM103 only, not {platform} "
     "{capability}."),
)

#: (when, dsv4sel backend): --dsv4-attn-backend in the rules' names (None: the rules' default)
BACKEND: tuple[tuple[dict, str | None], ...] = (
    ({"dsv4_attn_backend": "auto"}, None),
    ({"dsv4_attn_backend": "flashmla_mega"}, "FLASHMLA_MEGA_ATTN_DSV41"),
    ({"dsv4_attn_backend": "trtllm", "model": "deepseek_v4"}, "FLASHINFER_MLA_SPARSE_DSV4"),
    ({"dsv4_attn_backend": "trtllm"}, "FLASHINFER_MLA_SPARSE_DSV41"),
    # flashmla means FlashInfer's SM120 kernel on SM12x and the HipRadix port on ROCm
    ({"platform": "rocm", "model": "deepseek_v4"}, "ROCM_FLASHMLA_SPARSE_DSV4"),
    ({"platform": "rocm"}, "ROCM_FLASHMLA_SPARSE_DSV41"),
    ({"capability": ("12.0", "12.1"), "model": "deepseek_v4"}, "FLASHINFER_MLA_SPARSE_DSV4"),
    ({"capability": ("12.0", "12.1")}, "FLASHINFER_MLA_SPARSE_DSV41"),
    ({"model": "deepseek_v4"}, "FLASHMLA_SPARSE_DSV4"),
    ({}, "FLASHMLA_SPARSE_DSV41"),
)

#: SGLang's kv-cache dtype in the rules' words: fp8_e4m3 is e4m3 data, which the rules spell
#: ``fp8`` for the packed records; trtllm's rows are e4m3 for ``auto`` too (SGLang makes it fp8).
KV = {"auto": "auto", "fp8_e4m3": "fp8", "bfloat16": "bfloat16", "fp8_e5m2": "fp8_e5m2"}
KV_TRTLLM = {"auto": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "bfloat16": "bfloat16", "fp8_e5m2": "fp8_e5m2"}

class HostDecision(Frozen):
    """What SGLang must be told (``settings``: ``dsv4_attn_backend``, ``kv_layout``,
    ``kv_cache_dtype``, ``page_size``, ``kv_pool``), the class it then builds, and the
    dsv4sel selection that decided (its rule is ``selection.rule``)."""

    __slots__ = ("cls", "settings", "selection")
    cls: str
    settings: dict[str, Any]
    selection: Selection


def _holds(when: dict, point: dict) -> bool:
    for name, want in when.items():
        have = point.get(name)
        wants = want if isinstance(want, tuple) else (want,)
        if all(w.startswith("!") for w in wants):
            if have in {w[1:] for w in wants}:
                return False
        elif have not in wants:
            return False
    return True


def _refuse(point: dict, reason: str, fix: str) -> SelectionError:
    text = reason.format(**point)
    tag = f" [dsv4sel SGLang fix {fix}]" if fix != "-" else ""
    return SelectionError(f"DeepSeek-V4 attention in SGLang: {text}{tag}")


def query(point: dict) -> dict[str, Any]:
    """The dsv4sel query (keywords of :func:`dsv4sel.select`) an unrefused input means."""
    backend = next(b for when, b in BACKEND if _holds(when, point))
    kv = (KV_TRTLLM if point["dsv4_attn_backend"] == "trtllm" else KV)[point["kv_cache_dtype"]]
    q: dict[str, Any] = dict(platform=point["platform"], capability=point["capability"], backend=backend,
                             kv_cache_dtype=kv, model=point["model"])
    if point["platform"] == "cuda":
        # SGLang's mega kernel pads the heads per rank, so it serves any tensor-parallel size when
        # asked for; its default keeps attention-TP on FlashMLA, and so does this.
        explicit = point["dsv4_attn_backend"] == "flashmla_mega"
        q["mega_attn"] = "available" if explicit or point["deployment"] != "attention_tp" else "unavailable"
        # SGLang pads the heads for FlashInfer's SM120 kernel instead of needing a specialization
        q["flashinfer_sm120"] = "available"
    return q


def decide(point: dict, rules=None) -> HostDecision:
    """Decide one SGLang input with the shipped rules (or ``rules``); raises SelectionError."""
    import dsv4sel

    for fix, when, reason in REFUSE:
        if _holds(when, point):
            raise _refuse(point, reason, fix)
    q = query(point)
    sel = (rules or dsv4sel.default_rules()).select(**{k: v for k, v in q.items() if k in (
        "platform", "capability", "backend", "kv_cache_dtype", "model")},
        extra={k: v for k, v in q.items() if k in ("mega_attn", "flashinfer_sm120")})
    built = sel.host_class(HOST)
    settings = sel.settings_for(HOST)
    if built is None or not settings:
        raise SelectionError(
            f"DeepSeek-V4 attention in SGLang: the rules select {sel.backend} with the {sel.layout} cache "
            f"({sel.rule.location}), which SGLang 0.5.23 cannot build; choose another --kv-cache-dtype or "
            "--dsv4-attn-backend. [dsv4sel SGLang fix S2]")
    layout = settings["kv_layout"]
    env = point.get("kv_layout_env", "unset")
    if env not in ("unset", "auto", layout):
        raise SelectionError(
            f"DeepSeek-V4 attention in SGLang: SGLANG_DSV4_KV_LAYOUT={env} asks for another KV record than the "
            f"one the rules decide ({layout}, {sel.rule.location}); unset it. [dsv4sel SGLang fix S4]")
    order = ("dsv4_attn_backend", "kv_layout", "kv_cache_dtype", "page_size", "kv_pool")
    settings = {**{k: settings[k] for k in order if k in settings}, **settings}
    return HostDecision(built[0], settings, sel)
