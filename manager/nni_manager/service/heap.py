"""Keep the manager's long-lived heap out of the cyclic garbage collector's way.

A full (generation 2) collection walks every tracked object while the event loop waits. With
1,000 agents' streams, the imported modules and a trial table that grows to 100,000 entries,
those pauses reached 50-500 ms and were most of the status latency's p99 (scripts/bench_scale.py:
p99 1.1 s without, 3-45 ms with, at 1,000 agents). `gc.freeze()` moves everything alive now to
the permanent generation, which collections skip; it is done once the store is loaded and again
each time the trial table has grown by a tenth (at least 1,000 trials), so new trials join it.
Frozen objects are still freed by reference counting; reference cycles among them (a whole
stopped TrainingService is one) wait for `release`, called at clean-up.

`bulk()` suspends the collector while 100,000 objects are made at once (the trial table at
start, list_trial_jobs' copies): each young-generation pass would otherwise scan the growing
batch again (288 ms vs 49 ms for 100,000 copies).
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


class HeapFreezer:
    def __init__(self, min_growth: int = 1000) -> None:
        self._min_growth = min_growth
        self._next = 0
        self._frozen = False

    def grown_to(self, size: int) -> bool:
        """Freeze the heap if the long-lived state (`size` trials) grew enough since last time;
        whether it did."""
        if size < self._next:
            return False
        gc.freeze()
        self._frozen = True
        self._next = size + max(self._min_growth, size // 10)
        return True

    def release(self) -> None:
        """Hand the frozen objects back to the collector (the service is done with them)."""
        if self._frozen:
            gc.unfreeze()
            self._frozen = False


@contextlib.contextmanager
def bulk() -> Iterator[None]:
    """No cyclic collection while the block allocates many objects that all stay alive."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
