"""Timing helpers shared by the kernel benchmarks (no dsv4sel imports)."""

from __future__ import annotations

import json
import platform
import statistics
import time
from typing import Any, Callable

import torch


def measure(fn: Callable[[], Any], device: str, warmup: int, reps: int) -> float:
    """Median seconds per call of ``fn`` after ``warmup`` calls.

    On CUDA each call is bracketed by CUDA events, so the figure is GPU time
    including any host syncs ``fn`` itself performs; on CPU, wall time.
    """
    for _ in range(warmup):
        fn()
    times = []
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine(device: str) -> str:
    """One line naming the hardware and torch build the figures come from."""
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(device)
        return f"{props.name} (SM{props.major}{props.minor}, {props.multi_processor_count} SMs), torch {torch.__version__}"
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, torch {torch.__version__}"


def markdown(rows: list[dict[str, Any]], columns: list[tuple[str, str]]) -> str:
    """A markdown table of ``rows`` with (key, header) ``columns``."""
    lines = ["| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row[key]
            cells.append(f"{value:,.3g}" if isinstance(value, float) else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dump(path: str | None, payload: dict[str, Any]) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=2)
