"""Resource bounds that hold whatever else the machine runs.

The hostile-input tests promise an answer "within 2 s and 200 MB". Wall-clock time
depends on the machine's load (two pytest workers and a differential suite share two
cores in CI), so the bounds are taken in CPU seconds: the work this process, or the
child it waited for, did itself.
"""

from __future__ import annotations

import resource
import time


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CpuTimer:
    """CPU seconds spent in this process and in the children it waited for, between
    entering and leaving the ``with`` block; ``seconds`` holds the figure after it."""

    seconds: float = 0.0

    def __enter__(self) -> CpuTimer:
        self._start = time.process_time() + _children_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seconds = time.process_time() + _children_cpu() - self._start
