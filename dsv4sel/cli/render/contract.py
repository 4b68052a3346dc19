"""A KV wire contract and a KV-memory estimate for people: ``explain``'s and ``fleet``'s sections.

:func:`contract_lines` shows a :class:`dsv4sel.dsv4.contract.KVContract`: its fingerprint, model,
engine, block size and one row per cache pool (record, bytes per token *per layer*, arrangement,
fp8 flavour) with the record's encoding under it. :func:`memory_lines` shows a
:class:`dsv4sel.dsv4.kvmemory.KVMemory`: each kind of layer, what one such layer holds, and the
model's total.
"""

from __future__ import annotations

from .text import Style, align

TYPE_CHECKING = False
if TYPE_CHECKING:
    from .text import Cell


def size(count: int) -> str:
    """Bytes as people read them: ``149,760 B`` below 1 MiB, else with the MiB or GiB figure."""
    if count < 1 << 20:
        return f"{count:,} B"
    unit, scale = ("GiB", 1 << 30) if count >= 1 << 30 else ("MiB", 1 << 20)
    return f"{count:,} B ({count / scale:.2f} {unit})"


def engine_words(contract) -> str:
    """``vllm 0.33.0``, or what a contract without an engine is."""
    if contract.engine is None:
        return "no engine named (the decision's own records)"
    return f"{contract.engine} {contract.release}" if contract.release else contract.engine


def contract_lines(contract, style: Style, title: str = "kv contract") -> list[str]:
    """The contract's section: a head line, then one row per pool and its encoding."""
    head = (f"{style.bold(title)}  {style.cyan(contract.fingerprint)}  model {contract.model}, "
            f"block {contract.block_size} tokens, {engine_words(contract)}")
    rows = []
    for pool in contract.pools:
        rows.append([pool.name, pool.record, f"{pool.bytes_per_token} B/token per layer", pool.arrangement,
                     f"fp8 {pool.fp8}"])
    lines = [head]
    for pool, line in zip(contract.pools, align(rows, style)):
        lines += [line, "      " + pool.encoding]
    return lines


def memory_lines(memory, style: Style) -> list[str]:
    """The KV memory ``explain --tokens N`` asked for: per kind of layer, then the model's total."""
    lines = [style.bold(f"kv memory for {memory.tokens:,} tokens") + f"  ({memory.geometry.source})"]
    rows: list[list[Cell]] = []
    for use in memory.layers:
        parts = " + ".join(f"{p.pool} {p.entries:,} x {p.bytes // p.entries if p.entries else 0} B"
                           for p in use.pools)
        rows.append([f"{use.kind.count} x {use.kind.name}", parts, f"{use.per_layer:,} B per layer",
                     size(use.total)])
    rows.append(["total", "", "", (size(memory.total), "bold")])
    return lines + align(rows, style, right={2})
