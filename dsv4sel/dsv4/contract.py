"""The KV wire contract of a decision: the facts another process needs to read its cache bytes.

A DeepSeek-V4 deployment is many processes that write and read each other's KV cache: the ranks
of one instance and, under prefill/decode disaggregation, a prefill pool and a decode pool. Two
of them exchange KV bytes correctly exactly when their contracts are equal. A
:class:`KVContract` holds:

- ``model``: the model family (``deepseek_v4``, ``deepseek_v4_1``);
- ``engine`` and ``release``: the serving engine and its version, where known (None for a bare
  :func:`dsv4sel.select`, whose fields are the decision's own: the record dsv4sel's kernels and
  its vLLM plugin write);
- ``block_size``: the tokens of one KV block (vLLM's cache block, SGLang's page) the engines'
  block tables address;
- ``pools``: one :class:`CachePool` per cache a layer keeps, ``main`` (the sliding-window cache
  every layer has) and ``compressed`` (the C4A/C128A caches, one entry per 4 or 128 tokens in
  DeepSeek-V4; V4.1's ratio-1 and ratio-2 caches), each with its record, its bytes per token
  *per layer*, what the bytes hold, how a page orders them and the fp8 flavour (``ocp``: e4m3fn;
  ``fnuz``: e4m3fnuz, what ROCm gfx942 reads; ``none``: no fp8 values; ``unknown``: a ROCm arch
  the query does not name).

The cache dtype *string* is not part of it: ``fp8`` and ``fp8_e4m3`` on FlashInfer's rows are the
same bytes (vLLM's NIXL hash refuses them for the spelling). The records' sizes and encodings are
read from the kernels' record table (``kernels/record.py``: plain data, no imports; the kernels'
tests hold it to their layouts); the engine facts below (how SGLang's ``kv_layout`` setting maps
to records, which pools are FNUZ on gfx942) are cited where they were read.

:attr:`KVContract.fingerprint` is ``kv1-`` and the first 16 hex digits of the SHA-256 of
:meth:`KVContract.canonical` (the contract's fields as JSON, keys sorted, no spaces, ASCII):
equal contracts have equal fingerprints on every machine and Python version. docs/deployments.md
documents every field.
"""

from __future__ import annotations

from ..record import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Mapping

#: Bumped when a field is added, removed or changes meaning: it is part of the fingerprint.
CONTRACT_VERSION = 1
FINGERPRINT_PREFIX = "kv1-"
#: What starts a contract's :meth:`~KVContract.wire` form in a handshake string: the words say
#: where the part comes from, so a peer's message that lacks it shows a side without dsv4sel.
WIRE_PREFIX = "dsv4sel contract "
POOLS = ("main", "compressed")
#: The fp8 flavours a pool may hold.
FP8_FLAVOURS = ("ocp", "fnuz", "none", "unknown")

#: SGLang 0.5.23's ``kv_layout`` setting (``SGLANG_DSV4_KV_LAYOUT``; the main part of its PD
#: layout string) -> (main record, its arrangement), for its single pool (``kv_pool: single``).
#: ``v41`` is V4.1's 528-byte record in block-split pages (FlashMLA's legacy kernels), ``v41_new``
#: the same record interleaved per token (``sglang/kernels/ops/attention/dsv4/kv_layout.py:18-140``;
#: shared/sglang-0.5.23.md §5). The TRT-LLM pool (``kv_pool: uniform_fp8``) holds plain e4m3 rows.
SGLANG_MAIN = {
    "v4": ("fp8_ds_mla", "block-split"),
    "v41": ("fp8_ds_mla_v41", "block-split"),
    "v41_new": ("fp8_ds_mla_v41", "token-interleaved"),
}


#: Records only an engine writes, which dsv4sel's kernels have no layout for (fields as
#: ``kernels/record.py``'s): SGLang 0.5.23's unified HIP pool with ``SGLANG_DSV4_UNIFIED_KV_FP8`` on
#: gfx95, a 512-byte fp8 NoPE row with its tile scales and a 64-value bf16 RoPE row in a second
#: pool (``sglang/srt/mem_cache/deepseek_v4_memory_pool.py:836-849``,
#: ``layers/attention/dsv4/unified_kv_gate.py:19-34``).
ENGINE_RECORDS = {
    "sglang_unified_fp8": (640, 512, "fp8 e4m3 NoPE with E8M0 tile scales in a 512-byte row, 64 bf16 RoPE "
                           "in a second pool", "two-pool", True),
}


class CachePool(Frozen):
    """One cache a layer keeps: its record and how its bytes are laid out (see the module doc)."""

    __slots__ = ("name", "record", "bytes_per_token", "encoding", "arrangement", "fp8")
    name: str
    record: str
    #: content bytes of one token's entry in one layer
    bytes_per_token: int
    encoding: str
    arrangement: str
    fp8: str

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}


class KVContract(Frozen):
    """The canonical facts another process needs to read a decision's KV bytes (module doc)."""

    __slots__ = ("model", "engine", "release", "block_size", "pools")
    model: str
    engine: str | None
    release: str | None
    block_size: int
    pools: tuple[CachePool, ...]

    def pool(self, name: str) -> CachePool:
        """The pool called ``name`` (``main``, ``compressed``); KeyError for another name."""
        for pool in self.pools:
            if pool.name == name:
                return pool
        raise KeyError(name)

    def fields(self) -> dict[str, Any]:
        """Every field by a flat name (``model``, ``main.record``, ``compressed.fp8``...): what two
        contracts are compared on, in a fixed order."""
        out: dict[str, Any] = {"model": self.model, "engine": self.engine, "release": self.release,
                               "block_size": self.block_size}
        for pool in self.pools:
            out.update({f"{pool.name}.{k}": v for k, v in pool.as_dict().items() if k != "name"})
        return out

    def _data(self) -> dict[str, Any]:
        return {"version": CONTRACT_VERSION, "model": self.model, "engine": self.engine, "release": self.release,
                "block_size": self.block_size, "pools": [pool.as_dict() for pool in self.pools]}

    def canonical(self) -> str:
        """The serialization the fingerprint hashes: JSON, keys sorted, no spaces, ASCII."""
        import json

        return json.dumps(self._data(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)

    @property
    def fingerprint(self) -> str:
        """``kv1-`` + the first 16 hex digits of SHA-256(:meth:`canonical`)."""
        import hashlib

        return FINGERPRINT_PREFIX + hashlib.sha256(self.canonical().encode("ascii")).hexdigest()[:16]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: the canonical fields and the fingerprint."""
        return {**self._data(), "fingerprint": self.fingerprint}

    def wire(self) -> str:
        """The contract as the plugins carry it in an engine's own handshake string (SGLang's PD
        ``kv_layout``, vLLM's NIXL compatibility hash): :data:`WIRE_PREFIX`, the fingerprint, then
        every field of :meth:`fields` but the pools' ``encoding`` (the record implies it; the
        fingerprint covers it) as ``name=value``, space-separated. Two handshake strings are equal
        exactly when the contracts are, and an engine that prints both shows which field differs,
        or that one side carries no dsv4sel contract at all. :func:`wire_fields` reads it back."""
        shown = " ".join(f"{name}={'-' if value is None else value}" for name, value in self.fields().items()
                         if not name.endswith(".encoding"))
        return f"{WIRE_PREFIX}{self.fingerprint} {shown}"


def wire_fields(text: str) -> dict[str, str] | None:
    """The fields of the :meth:`KVContract.wire` form found in ``text`` (a handshake string that
    may carry the engine's own part before it), ``fingerprint`` included; None when ``text``
    carries no dsv4sel contract."""
    _, found, rest = text.partition(WIRE_PREFIX)
    if not found:
        return None
    fingerprint, *pairs = rest.split(" ")
    fields = {"fingerprint": fingerprint}
    fields.update(pair.partition("=")[::2] for pair in pairs if "=" in pair)
    return fields


# ------------------------------------------------------------------ building

def _record(name: str) -> dict[str, Any]:
    """The kernels' record table entry for layout ``name`` (``kernels/record.py``: plain data)."""
    from ..kernels.record import RECORD_FIELDS, RECORDS

    return dict(zip(RECORD_FIELDS, RECORDS[name] if name in RECORDS else ENGINE_RECORDS[name]))


def fp8_flavour(engine: str | None, platform: str, capability: str, pool: str) -> str:
    """How a pool's fp8 values are encoded on this machine: ``fnuz`` on ROCm gfx942 (its
    e4m3fnuz, max 224), ``unknown`` on a ROCm arch not named, else ``ocp`` (e4m3fn).

    vLLM 0.33 on gfx942 reads the sliding-window cache as FNUZ (``use_fnuz=is_fp8_fnuz()``) but
    the compressed cache as OCP on every platform (``vllm/models/deepseek_v4/amd/rocm.py:1662``,
    ``:1683``); SGLang 0.5.23's HIP backend reads its whole DeepSeek-V4 cache as e4m3fnuz there
    (``sglang/srt/layers/attention/hip_flash_mla.py:11``, ``:311``, ``:330``). A contract without
    an engine is the decision's own, as dsv4sel's vLLM plugin builds it: vLLM's."""
    if platform != "rocm":
        return "ocp"
    if engine != "sglang" and pool == "compressed":
        return "ocp"
    if capability == "unknown":
        return "unknown"
    return "fnuz" if capability == "gfx942" else "ocp"


def _pool(name: str, record: str, arrangement: str | None, engine: str | None, platform: str,
          capability: str) -> CachePool:
    facts = _record(record)
    flavour = fp8_flavour(engine, platform, capability, name) if facts["has_fp8"] else "none"
    return CachePool(name, record, facts["bytes_per_token"], facts["encoding"],
                     arrangement or facts["arrangement"], flavour)


def _decided_records(layout: str, cache_dtype: str) -> tuple[tuple[str, str | None], tuple[str, str | None]]:
    """The (record, arrangement) of the main and compressed pools as the decision states them:
    the compressed cache is NVFP4 when the cache dtype is ``nvfp4_ds_mla`` and the main record
    otherwise (``vllm/models/deepseek_v41/attention.py:521-527``)."""
    main: tuple[str, str | None] = (layout, None)
    compressed: tuple[str, str | None] = ("nvfp4_ds_mla", None) if cache_dtype == "nvfp4_ds_mla" else main
    return main, compressed


def _sglang_records(model: str, layout: str, capability: str, settings: Mapping[str, Any],
                    env: Mapping[str, str]) -> tuple[tuple[str, str | None], ...]:
    """SGLang's pools from the settings it is told and its environment: ``kv_layout`` names the main
    record (:data:`SGLANG_MAIN`); the unified HIP pool (``kv_pool: unified``) holds the decided
    ``layout``'s bf16 rows, or with ``SGLANG_DSV4_UNIFIED_KV_FP8=1`` on gfx950 its fp8 two-pool
    rows. Next to a V4.1 main record the compressed caches are V4.1's NVFP4 record for ratios 1
    and 2 (DeepSeek-V4.1's) and the main record for ratios 4 and 128 (DeepSeek-V4's), or as
    ``SGLANG_DSV4_COMPRESSED_KV_LAYOUT`` (fp8, fp4) says, in the main record's arrangement
    (``resolve_compressed_kv_layout``, ``sglang/srt/mem_cache/deepseek_v4_memory_pool.py:174-196``)."""
    pool = settings.get("kv_pool")
    if pool in ("unified", "uniform_fp8"):
        fp8 = env.get("SGLANG_DSV4_UNIFIED_KV_FP8") == "1" and capability == "gfx950" and pool == "unified"
        main: tuple[str, str | None] = ("sglang_unified_fp8", None) if fp8 else (layout, None)
        return main, main
    record, arrangement = SGLANG_MAIN[str(settings.get("kv_layout", "v4"))]
    main = (record, arrangement)
    option = env.get("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "auto")
    if record == "fp8_ds_mla_v41" and (option == "fp4" or (option == "auto" and model == "deepseek_v4_1")):
        return main, ("nvfp4_ds_mla", arrangement)
    return main, main


def sglang_pool_problem(settings: Mapping[str, Any], env: Mapping[str, str]) -> str | None:
    """Why SGLang 0.5.23 fails to build the pool these settings and this environment ask for
    (an assert when the scheduler builds it, after the weights load), or None."""
    option = env.get("SGLANG_DSV4_COMPRESSED_KV_LAYOUT", "auto")
    if option != "fp4" or settings.get("kv_pool") == "unified":
        return None
    if settings.get("kv_pool") == "uniform_fp8":
        return ("SGLANG_DSV4_COMPRESSED_KV_LAYOUT=fp4 with --dsv4-attn-backend trtllm: its uniform fp8 pool takes "
                "auto or fp8 only, and SGLang 0.5.23 asserts when it builds the pool, after the weights load "
                "(sglang/srt/mem_cache/deepseek_v4_memory_pool.py:206-209)")
    if settings.get("kv_layout") == "v4":
        return ("SGLANG_DSV4_COMPRESSED_KV_LAYOUT=fp4 needs a V4.1 main cache; with the V4 record SGLang 0.5.23 "
                "asserts when it builds the pool, after the weights load "
                "(sglang/srt/mem_cache/deepseek_v4_memory_pool.py:186-187)")
    return None


def contract_of(*, model: str, platform: str, capability: str, layout: str, cache_dtype: str, block_size: int,
                engine: str | None = None, release: str | None = None,
                settings: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> KVContract:
    """The contract of a decision (its model, machine, layout, cache dtype and block size) as
    ``engine`` (``vllm``, ``sglang`` or None: the decision's own) builds it; ``settings`` are what
    SGLang is told (``kv_layout``, ``page_size``, ``kv_pool``) and ``env`` its environment variables
    (``SGLANG_DSV4_COMPRESSED_KV_LAYOUT``, ``SGLANG_DSV4_UNIFIED_KV_FP8`` as 0 or 1), read when
    ``engine`` is ``sglang``. :attr:`Selection.contract <dsv4sel.dsv4.selection.Selection.contract>`
    is the usual door."""
    if engine == "sglang":
        settings = settings or {}
        records = _sglang_records(model, layout, capability, settings, env or {})
        block = int(settings.get("page_size", block_size))
    else:
        # a host release may build another block size than the rule's (``hosts: vllm`` settings)
        records, block = _decided_records(layout, cache_dtype), int((settings or {}).get("block_size", block_size))
    pools = tuple(_pool(name, record, arrangement, engine, platform, capability)
                  for name, (record, arrangement) in zip(POOLS, records))
    return KVContract(model, engine, release, block, pools)
