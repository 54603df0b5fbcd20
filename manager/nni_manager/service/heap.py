"""Keep the manager's long-lived heap out of the cyclic garbage collector's full collections.

A full (generation 2) collection walks every tracked object while the event loop waits. With
1,000 agents' streams, the imported modules and a trial table that grows to 100,000 entries,
those pauses reached 50-500 ms and were most of the status latency's p99 (scripts/bench_scale.py:
p99 1.1 s without, 45 ms with, at 1,000 agents). `gc.freeze()` moves everything alive now to
the permanent generation, which collections skip; it is done once the store is loaded and again
each time the trial table has grown by a tenth (at least 1,000 trials), so new trials join
it. Frozen objects are still freed by reference counting; only reference cycles among them,
rare in long-lived state, stay until the process ends.
"""
from __future__ import annotations

import gc


class HeapFreezer:
    def __init__(self, min_growth: int = 1000) -> None:
        self._min_growth = min_growth
        self._next = 0

    def grown_to(self, size: int) -> None:
        """Freeze the heap if the long-lived state (`size` trials) grew enough since last time."""
        if size >= self._next:
            gc.freeze()
            self._next = size + max(self._min_growth, size // 10)
