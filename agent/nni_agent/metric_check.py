"""What a metric may be, checked where it enters: the agent (near the trial) and the manager (the
trust boundary) both use these, so a value NNI's tuner or a reader cannot take never gets stored.

A metric comes from trial code, so nothing about it can be assumed: a FINAL value nested 100,000
deep killed NNI's tuner (RecursionError in its JSON decoder), a lone UTF-16 surrogate made every
`nni-manager trials` crash when printing it, a 12 MiB metric and 480,000 metrics in 5 s were taken.

`metric_problem` is on the hot path (tens of thousands of metrics a second): for what metrics are
(ASCII, a few brackets, no escapes) it is three C-speed scans; only an unusual text takes the
exact check, which is still O(size). Stdlib only, Python 3.8 (the agent's floor).
"""

from __future__ import annotations

import json
import re
import time

MAX_BYTES = 1_000_000  # one metric's UTF-8 bytes: NNI's own limit for a metric record
MAX_DEPTH = 64  # nesting of the metric message or of its JSON-encoded value
# A trial's budget, a token bucket each: a burst (what a trial reports back to back) and a refill
# rate (sustained). bench_agent.py's 100,000 records as fast as they go fit in the burst.
BURST_METRICS = 100_000
METRICS_PER_S = 10_000.0
BURST_BYTES = 64 << 20
BYTES_PER_S = float(1 << 20)

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_BRACKETS = re.compile(r"[\[\]{}]")


def _depth(text: str) -> int:
    """The deepest nesting of JSON text's arrays and objects, brackets inside strings aside."""
    depth = deepest = 0
    for ch in _BRACKETS.findall(_STRING.sub("", text)):
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def _unencodable(obj: object) -> bool:
    """Whether decoded JSON holds a lone surrogate (no UTF-8 text can carry one)."""
    try:
        json.dumps(obj, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _json_problem(text: str, what: str) -> str:
    """Why JSON `text` cannot be taken (too deep, a lone surrogate), or ""; not JSON is no problem here."""
    depth = _depth(text)
    if depth > MAX_DEPTH:
        return f"{what} is nested {depth} levels deep (the limit is {MAX_DEPTH})"
    try:
        obj = json.loads(text)
    except ValueError:
        return ""
    if "\\u" in text and _unencodable(obj):
        return f"{what} holds a lone UTF-16 surrogate (not valid Unicode text)"
    if isinstance(obj, dict) and isinstance(obj.get("value"), str) and what == "the metric":
        return _json_problem(obj["value"], "its value")
    return ""


def metric_problem(data: str) -> str:
    """Why metric JSON `data` must be refused (one phrase), or "" when it may be taken."""
    size = len(data)
    if size > MAX_BYTES:
        return f"the metric is {size:,} bytes (the limit is {MAX_BYTES:,})"
    if not data.isascii():
        try:
            size = len(data.encode("utf-8"))
        except UnicodeEncodeError:
            return "the metric is not valid UTF-8 text"
        if size > MAX_BYTES:
            return f"the metric is {size:,} bytes (the limit is {MAX_BYTES:,})"
    if "\\u" not in data and data.count("[") + data.count("{") <= MAX_DEPTH:
        return ""  # no escape can hide a bracket or a surrogate, and there are too few brackets to nest deeper
    return _json_problem(data, "the metric")


class MetricBudget:
    """A trial's metric rate and volume: two token buckets (metrics, bytes)."""

    __slots__ = ("metrics", "bytes", "burst_metrics", "burst_bytes", "per_s", "bytes_per_s", "at")

    def __init__(self, scale: float = 1.0) -> None:
        self.burst_metrics = BURST_METRICS * scale
        self.burst_bytes = BURST_BYTES * scale
        self.per_s = METRICS_PER_S * scale
        self.bytes_per_s = BYTES_PER_S * scale
        self.metrics = self.burst_metrics
        self.bytes = self.burst_bytes
        self.at = time.monotonic()

    def take(self, size: int) -> str:
        """Take one metric of `size` bytes; "" when the budget allows it, else why not."""
        if self.metrics >= 1 and self.bytes >= size:
            self.metrics -= 1
            self.bytes -= size
            return ""
        now = time.monotonic()
        elapsed, self.at = now - self.at, now
        self.metrics = min(self.burst_metrics, self.metrics + elapsed * self.per_s)
        self.bytes = min(self.burst_bytes, self.bytes + elapsed * self.bytes_per_s)
        if self.metrics < 1:
            return (f"the trial reports more than {self.per_s:,.0f} metrics a second "
                    f"(after a burst of {self.burst_metrics:,.0f})")
        if self.bytes < size:
            return (f"the trial reports more than {self.bytes_per_s / (1 << 20):,.0f} MiB of metrics a second "
                    f"(after a burst of {self.burst_bytes / (1 << 20):,.0f} MiB)")
        self.metrics -= 1
        self.bytes -= size
        return ""
