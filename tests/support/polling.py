"""How the suite's wait helpers poll: soon at first, then less and less often.

On two cores the suite is bound by the CPU it burns, and a wait that polled every 20-50 ms for a
minute (a TTL, a reconnect window, a pod's start) burned seconds of CPU in the test and in the
server it asked (each look at a Kubernetes emulator is several HTTPS calls). A wait that ends
quickly still sees its state within tens of milliseconds; a long one looks a few times a second,
often enough for any state a test waits for, which lasts at least as long as the test holds it."""
from __future__ import annotations

from collections.abc import Iterator

CAP_S = 0.25  # the longest gap between two looks


def intervals(first: float = 0.02, cap: float = CAP_S, factor: float = 1.5) -> Iterator[float]:
    """The sleeps between looks: `first`, growing by `factor` up to `cap` (or `first`, if larger)."""
    gap, cap = first, max(cap, first)
    while True:
        yield gap
        gap = min(gap * factor, cap)
