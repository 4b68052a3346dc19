"""How much KV memory N tokens of one sequence need: a decision's contract times the model's layers.

A DeepSeek-V4 layer keeps up to three caches (:mod:`dsv4sel.dsv4.contract` names the first two):

- ``main``: the sliding window, the last ``window`` tokens, in every layer;
- ``compressed``: one entry per ``ratio`` tokens, in the layers that hold a compressed cache
  (DeepSeek-V4: C4A layers, ratio 4, and C128A layers, ratio 128; DeepSeek-V4.1: the kv-source
  layers of ratio 1 and 2, ``vllm/models/deepseek_v41/attention.py:313-331``);
- ``indexer``: DeepSeek-V4's C4A layers also keep the indexer's keys, one 132-byte row (128 fp8
  values and one fp32 scale, shared/domain.md §1) per compressed entry. dsv4sel does not decide
  this cache; its size is vLLM's fp8 indexer's.

For N tokens a layer of ratio r holds ``min(N, window) * main + ceil(N / r) * compressed``
(+ ``ceil(N / 4) * 132`` for a C4A layer's indexer) bytes; the model holds the sum over its
layers. These are the records' content bytes: page padding, partly filled last pages and the
engines' allocator slack come on top. docs/deployments.md states the formula.

The layer counts are the checkpoint's (its ``config.json``), not the rules'. :data:`GEOMETRIES`
holds the one dsv4sel knows, DeepSeek-V4-Flash's; :func:`parse_layers` reads any other
(``swa=2,c4=21,c128=20,window=128``).
"""

from __future__ import annotations

from ..record import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .contract import KVContract

INDEXER_ROW_BYTES = 132
#: The compressed-cache ratios of each model family's layers (``swa`` layers keep the window only).
RATIOS = {"deepseek_v4": (4, 128), "deepseek_v4_1": (1, 2)}


class LayerKind(Frozen):
    """``count`` layers that keep the window and, unless ``ratio`` is 0, a compressed cache of one
    entry per ``ratio`` tokens (``indexer``: and the indexer's keys)."""

    __slots__ = ("name", "ratio", "count", "indexer")
    name: str
    ratio: int
    count: int
    indexer: bool


class Geometry(Frozen):
    """A checkpoint's layers, its sliding window in tokens, and where the figures come from."""

    __slots__ = ("kinds", "window", "source")
    kinds: tuple[LayerKind, ...]
    window: int
    source: str

    @property
    def layers(self) -> int:
        return sum(kind.count for kind in self.kinds)


#: DeepSeek-V4-Flash: 43 layers; layers 0 and 1 keep the 128-token window only, then C4A and
#: C128A layers alternate (the checkpoint's model card; 43 layers: NVIDIA NeMo AutoModel's
#: DeepSeek V4 Flash page; a 128-token causal window: shared/domain.md §8).
GEOMETRIES = {
    "deepseek_v4": Geometry((LayerKind("swa", 0, 2, False), LayerKind("c4", 4, 21, True),
                             LayerKind("c128", 128, 20, False)), 128,
                            "DeepSeek-V4-Flash: 43 layers, 2 window-only, 21 C4A, 20 C128A, window 128"),
}


def _counts(spec: str, model: str, valid: list[str]) -> dict[str, int]:
    """``key -> count`` of a ``--layers`` spec; ValueError naming a bad part and the valid keys."""
    counts: dict[str, int] = {}
    for part in spec.split(","):
        key, eq, value = (s.strip() for s in part.partition("="))
        if not eq or key not in valid or key in counts:
            why = "is given twice" if key in counts else "is not KEY=COUNT with a known key"
            raise ValueError(f"--layers: {part.strip()!r} {why}; the keys for {model} are {', '.join(valid)} "
                             f"(e.g. swa=2,{valid[1]}=21,window=128)")
        if not value.isdigit() or (key == "window" and int(value) == 0):
            raise ValueError(f"--layers: {key}={value!r} is not a {'positive' if key == 'window' else 'whole'} number")
        counts[key] = int(value)
    return counts


def parse_layers(spec: str, model: str) -> Geometry:
    """A geometry from ``swa=A,cR=B,...,window=W`` (``cR``: B layers with a compressed cache of ratio
    R, one of the model family's). ValueError naming the problem and the valid keys."""
    ratios = RATIOS.get(model, ())
    counts = _counts(spec, model, ["swa", *(f"c{r}" for r in ratios), "window"])
    if "window" not in counts:
        raise ValueError(f"--layers: give the sliding window too, window=TOKENS (e.g. {spec},window=128)")
    kinds = (LayerKind("swa", 0, counts.get("swa", 0), False),
             *(LayerKind(f"c{r}", r, counts.get(f"c{r}", 0), model == "deepseek_v4" and r == 4) for r in ratios))
    if not any(kind.count for kind in kinds):
        raise ValueError("--layers: every count is 0; name the layers, e.g. swa=2,c4=21,c128=20,window=128")
    return Geometry(tuple(k for k in kinds if k.count), counts["window"], f"--layers {spec}")


class PoolUse(Frozen):
    """One cache of one layer for N tokens: the entries it holds and their bytes."""

    __slots__ = ("pool", "record", "entries", "bytes")
    pool: str
    record: str
    entries: int
    bytes: int


class LayerUse(Frozen):
    """What one layer of a kind holds for N tokens (``per_layer``), and ``count`` such layers."""

    __slots__ = ("kind", "pools")
    kind: LayerKind
    pools: tuple[PoolUse, ...]

    @property
    def per_layer(self) -> int:
        return sum(p.bytes for p in self.pools)

    @property
    def total(self) -> int:
        return self.per_layer * self.kind.count


class KVMemory(Frozen):
    """The KV bytes ``tokens`` tokens of one sequence need, per layer kind and for the model."""

    __slots__ = ("tokens", "geometry", "layers")
    tokens: int
    geometry: Geometry
    layers: tuple[LayerUse, ...]

    @property
    def total(self) -> int:
        return sum(layer.total for layer in self.layers)

    def as_dict(self) -> dict:
        return {
            "tokens": self.tokens, "window": self.geometry.window, "geometry": self.geometry.source,
            "layers": [{"kind": use.kind.name, "ratio": use.kind.ratio, "count": use.kind.count,
                        "per_layer": use.per_layer, "total": use.total,
                        "pools": [{"pool": p.pool, "record": p.record, "entries": p.entries, "bytes": p.bytes}
                                  for p in use.pools]} for use in self.layers],
            "total": self.total,
        }


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def kv_memory(contract: KVContract, tokens: int, geometry: Geometry) -> KVMemory:
    """The KV memory ``tokens`` tokens need under ``contract`` for a model of ``geometry`` (module doc)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be a positive whole number, got {tokens!r}")
    main, compressed = contract.pool("main"), contract.pool("compressed")
    uses = []
    for kind in geometry.kinds:
        window = min(tokens, geometry.window)
        pools = [PoolUse("main", main.record, window, window * main.bytes_per_token)]
        if kind.ratio:
            entries = _ceil_div(tokens, kind.ratio)
            pools.append(PoolUse("compressed", compressed.record, entries, entries * compressed.bytes_per_token))
        if kind.indexer:
            entries = _ceil_div(tokens, 4)
            pools.append(PoolUse("indexer", "fp8 indexer keys", entries, entries * INDEXER_ROW_BYTES))
        uses.append(LayerUse(kind, tuple(pools)))
    return KVMemory(tokens, geometry, tuple(uses))
