"""A rule served by dsv4sel's vLLM pack layer: proved, per rule, to fit the vLLM layer that hosts its impl.

A select rule whose ``hosts: vllm`` class is the pack layer
(:data:`~dsv4sel.dsv4.vllm_hosting.PACK_LAYER`) is built by the vLLM plugin as vLLM's own DeepSeek-V4
layer with the rule's impl as its sparse decode (:mod:`dsv4sel.dsv4.vllm_hosting` says which layer,
per vLLM release, model, platform and GPU generation). Over the inputs the rule wins (its table's
scan, split by model, platform, capability and the inputs the layer needs), for each vLLM release
its ``versions:`` admit, one error (DSV415, at the rule's ``file:line``) for each way it does not fit:

* vLLM has no layer there that can host an impl (another platform, a fixed class, an unknown GPU);
* the layer stores another layout, bytes per token or block size than the rule selects;
* the impl does not read the layout the layer hands it (an ``fp8_ds_mla`` cache to an impl that
  reads bf16 rows);
* the layer's own ``__init__`` needs an input at another value (FlashInfer's SM120 layer asks for
  FlashInfer's SM120 specialization, ``flashinfer_sm120: available``);
* no prefill path: the impl writes no prefill hook and vLLM's own prefill kernel of that layer does
  not run on the rule's GPU.
"""

from __future__ import annotations

from .._version import DOCS_URL

from typing import Any, Iterator

from ..dsv4.profile import PROFILE
from .context import CheckContext
from .findings import ERROR, Finding
from .outcomes import placeholders, render_fields

#: the inputs that pick vLLM's layer (and those its ``__init__`` needs), when declared
_SPLIT = ("model", "platform", "capability", "flashinfer_sm120")


def _pack_versions(rule) -> str | None:
    """The ``versions:`` of a select rule whose vLLM host class is the pack layer, or None."""
    from ..dsv4.vllm_hosting import PACK_LAYER

    if rule.outcome.kind != "select":
        return None
    for host, cls, versions in rule.outcome.field("hosts") or ():
        if host == "vllm" and cls == PACK_LAYER:
            return versions
    return None


def pack_layer_findings(ctx: CheckContext) -> Iterator[Finding]:
    """DSV415 for each way a rule served by the pack layer does not fit vLLM's hosting layer."""
    impls: dict[str, Any] = {}
    for table in ctx.flow.tables.values():
        positions = [i for i, rule in enumerate(table.rules) if _pack_versions(rule) is not None]
        if not positions:
            continue
        scan = ctx.flow.table_scan(table, None, detail=True)
        start = table.backends[0] if table.backends else None
        for position in positions:
            rule = table.rules[position]
            found: dict[str, tuple[list[str], Any]] = {}
            for box in scan.regions.get(position, ()):
                _rule_problems(ctx, rule, box, impls, found)
            for template, (releases, sub) in found.items():
                message = template.replace("{REL}", " and ".join(releases))
                yield ctx.finding(ERROR, "host-layer", f"rule {rule.ref.id}: {message}", rule.ref,
                                  rules=(rule.ref,), counterexample=ctx.input(sub, start), table=table.name)


def _rule_problems(ctx: CheckContext, rule, box, impls: dict[str, Any], found: dict) -> None:
    from ..dsv4.vllm_hosting import releases_of

    versions = _pack_versions(rule) or ""
    names = [n for n in (*_SPLIT, *sorted(placeholders(rule) - {"backend"})) if n in ctx.program.inputs]
    for assignment, sub in ctx.space.split_by(box, names):
        fields, _ = render_fields(rule, dict(assignment, backend=""))
        impl = _impl_class(ctx, fields["impl"], impls)
        for release in releases_of(versions):
            for template in _problems(release, assignment, fields, impl):
                slot = found.setdefault(template, ([], sub))
                if release not in slot[0]:
                    slot[0].append(release)


def _impl_class(ctx: CheckContext, impl: str, memo: dict[str, Any]) -> Any:
    """The impl class, or None when it does not resolve (DSV406 says why)."""
    if impl not in memo:
        from ..engine.values import load_impl_class
        from ..errors import ImplLoadError

        try:
            memo[impl] = load_impl_class(impl, tuple(ctx.program.allowed_impl_modules), PROFILE.impl_base)
        except ImplLoadError:
            memo[impl] = None
    return memo[impl]


def _problems(release: str, at: dict[str, str], fields: dict[str, Any], impl: Any) -> list[str]:
    """The DSV415 messages of one selection at one (model, platform, capability), for ``release``
    (written as ``{REL}`` in the text, so that releases with the same problem share a finding)."""
    from ..dsv4.vllm_hosting import host_layer

    model, platform, capability = at.get("model", ""), at.get("platform", ""), at.get("capability")
    where = _where(model, platform, capability)
    row = host_layer(release, model, platform, capability)
    if row is None:
        return [f"names dsv4sel's pack layer for vLLM, but vLLM {{REL}} has no DeepSeek-V4 layer that can serve "
                f"an impl for {where} (the pack layer hosts impls in vLLM's FlashMLA and FlashInfer SM120 layers, "
                "CUDA only); reject these inputs, or name another vLLM class for them"]
    base = f"vLLM {{REL}}'s {row.base_name} (which serves {where} through the pack layer)"
    out = [*_cache_spec(base, row, fields), *_layout_read(base, row, fields, impl)]
    out += [f"{base} refuses to be built with {name}={at[name]} (its own __init__ needs {value}); "
            f"reject {name}={at[name]} before this rule" for name, value in row.requires if at.get(name, value) != value]
    return out + _prefill_path(where, row, capability, impl)


def _where(model: str, platform: str, capability: str | None) -> str:
    """The input, one finding per GPU generation (not per capability value)."""
    from ..dsv4.vllm_hosting import major_of

    major = major_of(capability)
    if platform != "cuda":
        return f"{model} on {platform}"
    return f"{model} on cuda " + (f"SM{major}x" if major is not None else "(capability unknown)")


def _cache_spec(base: str, row, fields: dict[str, Any]) -> list[str]:
    wrong = [f"{name} {fields[name]!r} (the layer: {want!r})" for name, want in (
        ("layout", row.layout), ("bytes_per_token", row.bytes_per_token), ("block_size", row.block_size))
        if fields[name] != want]
    return [f"{base} stores {row.layout} pages of {row.bytes_per_token} B/token in blocks of {row.block_size}, but "
            "the rule selects " + ", ".join(wrong)] if wrong else []


def _layout_read(base: str, row, fields: dict[str, Any], impl: Any) -> list[str]:
    supported = getattr(impl, "supported_layouts", None)
    if isinstance(supported, (set, frozenset)) and supported and row.layout not in supported:
        return [f"{base} hands the impl {row.layout} pages, but {fields['impl'].rpartition(':')[2]} reads "
                + ", ".join(sorted(supported))]
    return []


def _prefill_path(where: str, row, capability: str | None, impl: Any) -> list[str]:
    from ..dsv4.vllm_hosting import major_of

    has_prefill = getattr(impl, "has_prefill", None)
    if (callable(has_prefill) and has_prefill()) or major_of(capability) in row.prefill_majors:
        return []
    gpus = ", ".join(f"SM{m}x" for m in sorted(row.prefill_majors))
    return [f"leaves {where} with no prefill path: {row.base_name}'s own prefill ({row.prefill_kernel}) runs on "
            f"{gpus} only, and the impl writes no prefill hook (prefill_library, {DOCS_URL}/kernels.md)"]
