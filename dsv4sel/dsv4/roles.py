"""A process's role under prefill/decode disaggregation, as an input a rule set may declare.

Disaggregation changes what the engines decide on their own (SGLang's DeepSeek-V4.1 default on
SM100 under PD; vLLM ROCm's V4.0 kernel with a KV connector), so it is an input that decides.
The shipped rules do not declare it: a prefill pool and a decode pool started with the same
flags get the same decision, and so the same KV wire contract, which is what lets them exchange
cache bytes. A rule pack whose decision depends on the role (a kernel that serves one pool, a
site's policy for its PD pools) declares it in a vocabulary file::

    kind: vocabulary
    inputs:
      disaggregation:
        default: none
        values: [none, prefill, decode, both]

with exactly these values and this default (the compiler holds a declaration to it, DSV305:
every host sends each of them). Each host fills it from its own configuration, for a rule set
that declares it and only then:

* vLLM: ``--kv-transfer-config``'s ``kv_role`` (``kv_producer`` prefill, ``kv_consumer``
  decode, ``kv_both`` both: the usual NIXL setting, where one process may do either); no
  ``kv_transfer_config``: none;
* SGLang: ``--disaggregation-mode`` (``prefill``, ``decode``; ``null``: none);
* ``dsv4sel fleet``: a side's ``disaggregation:`` (absent: none).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:  # the serving path does not import typing
    from typing import Any

#: the input's name in rule files and queries
INPUT = "disaggregation"
#: every value a host sends, in this order; ``none``: not disaggregated (the default)
ROLES = ("none", "prefill", "decode", "both")
DEFAULT = "none"


def with_role(query: dict[str, Any], declared: tuple[str, ...], role: str | None) -> dict[str, Any]:
    """``query`` (keywords of :func:`dsv4sel.select`, with its ``extra`` dict) given ``role`` as the
    :data:`INPUT` input when ``declared`` (the rule set's plain inputs) holds it; unchanged
    otherwise, so a rule set that does not read the role decides as it always has. ``role``
    None: the host read no role, which is :data:`DEFAULT`."""
    if INPUT in declared:
        query["extra"] = {**query.get("extra", {}), INPUT: role or DEFAULT}
    return query
