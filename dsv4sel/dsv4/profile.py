"""The DeepSeek-V4 profile: what the engine's inputs and select fields mean.

Everything DeepSeek-V4 that the generic engine needs, as data
(:class:`dsv4sel.engine.profile.Profile`): the inputs every vocabulary
declares and their order in the lookup key, the fields a selection carries,
the field that restates the ``--kv-cache-dtype`` input, the words messages
use, the rule schema, and the modules impl classes may come from.
"""

from __future__ import annotations

import os

from ..engine.profile import Profile, declared_fields
from . import roles

#: Impl classes are imported only from these module prefixes (and their submodules).
DEFAULT_ALLOWED_IMPL_MODULES: tuple[str, ...] = ("dsv4sel.kernels",)
#: The class every impl subclasses (the kernels' extension API, docs/kernels.md "Writing an impl"):
#: any other name an allowed module exposes is refused by ``check`` and ``load_impl()``.
IMPL_BASE = "dsv4sel.kernels.base:SparseMLAImpl"

def _capability_spelling(text: str) -> str | None:
    """The canonical capability ``text`` spells (``sm90`` -> ``9.0``), or None; imported on
    the compiler's error path only, so the serving path never loads the spelling parser."""
    from .capability import canonical

    return canonical(text)


class SelectFields:
    """The fields a DeepSeek-V4 selection carries, in the order a compiled row stores them:
    the one list of them. :data:`PROFILE` reads it (:func:`~dsv4sel.engine.profile.declared_fields`);
    :class:`~dsv4sel.dsv4.selection.Selection` inherits it, so the type checker knows each
    field's type, and reads each from its compiled row. Adding a field here (and to the
    schema's ``select`` outcome) is the whole change to the Python side."""

    __slots__ = ()
    impl: str  # the impl class, "module:Class"
    layout: str  # the KV-cache layout id
    cache_dtype: str  # the --kv-cache-dtype the engine carries from now on
    torch_dtype: str  # the cache tensor's torch dtype, by name
    bytes_per_token: int
    block_size: int


#: The inputs a Query names and normalizes itself (dsv4/selection.py); today the whole key.
_NORMALIZED = ("model", "platform", "capability", "backend", "kv_cache_dtype")

#: The vLLM host class dsv4sel ships (its pack layer: vLLM's own DeepSeek-V4 layer with the rule's
#: impl as its sparse decode; ``dsv4sel.vllm_plugin.pack_layer``, :mod:`.vllm_hosting`).
PACK_LAYER = "dsv4sel.vllm_plugin.pack_layer:PackImplAttention"

PROFILE = Profile(
    subject="DeepSeek-V4 attention",
    key=_NORMALIZED,
    # an input added to `key` beyond these needs only a `default:` in the vocabulary
    normalized=_NORMALIZED,
    select_fields=declared_fields(SelectFields),
    # the cache dtype string is left out: `auto` and `bfloat16` on a bf16-row
    # backend keep different strings for the same bytes
    same_result=("backend", "impl", "layout", "torch_dtype", "bytes_per_token", "block_size"),
    # `cache_dtype` is the engine's --kv-cache-dtype as it stands after selection
    restates=(("cache_dtype", "kv_cache_dtype"),),
    schema=os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "schema", "rules.schema.json"),
    allowed_impl_modules=DEFAULT_ALLOWED_IMPL_MODULES,
    impl_base=IMPL_BASE,
    spellings=(("capability", _capability_spelling),),
    host_classes=(("vllm", (PACK_LAYER,)),),
    # a pack may declare a process's role under disaggregation; the hosts fill it (dsv4/roles.py)
    host_inputs=((roles.INPUT, roles.ROLES, roles.DEFAULT),),
)
