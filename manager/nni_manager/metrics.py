"""NNI metric messages, decoded once for every reader: the ingest check, the experiment's
listener, the built-in dispatcher, `nni-manager trials`, the WebUI and the NNI export.

A metric message is a JSON object whose `type` is text and whose `sequence` is an integer;
its `value` is itself JSON-encoded (NNI >= 1.4). A metric comes from trial code through an
agent, so nothing about it can be assumed. One message with `"sequence": "x"` once made every
WebUI endpoint and `nni-manager view` answer 500 for good. So the core refuses such a message
at ingest, and readers of stored rows (which may predate the check, or come from a copied
store) skip a bad row with a warning instead of failing.

PERIODICAL results are numbered 0..n-1 per trial in arrival order, as NNI's manager numbers
them, whatever the trial reported: NNI's WebUI indexes intermediate results by sequence.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Iterator, Mapping

from nni_agent.metric_check import MAX_BYTES, MAX_DEPTH, metric_problem as content_problem

log = logging.getLogger(__name__)

_INT_RANGE = 1 << 63  # SQLite's INTEGER
_MAX_WARNED = 1024  # distinct bad rows warned about per process; readers re-read rows every poll
_warned: set[tuple[str, str]] = set()
_loads = json.loads
# The C scanner json.loads ends in, without its three Python frames (set in JSONDecoder.__init__; typeshed omits it)
_scan = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _parse(data: str) -> object:
    """json.loads(data), 2x faster for what metrics are (an object, no surrounding blanks): the
    WebUI's full dump parses a million of them. Anything else takes json.loads itself."""
    if type(data) is str and data[:1] == "{" and data[-1:] == "}":
        try:
            obj, end = _scan(data, 0)
        except (StopIteration, ValueError, RecursionError):
            pass
        else:
            if end == len(data):
                return obj
    return _loads(data)


def checked(data: str) -> tuple[dict[str, object] | None, str]:
    """`data` parsed, or None and why it is no metric message the readers can show (or NNI's tuner
    take: too big, too deep, not valid Unicode; metric_check.metric_problem)."""
    if type(data) is str:
        problem = content_problem(data)
        if problem:
            return None, problem
    try:
        message = _parse(data)
    except (ValueError, TypeError, RecursionError):
        return None, "not JSON"
    if type(message) is not dict:
        return None, f"a JSON {type(message).__name__}, not an object"
    kind = message.get("type")
    if kind is not None and type(kind) is not str:
        return None, f"its type is {kind!r}, not text"
    sequence = message.get("sequence")
    if sequence is not None and (type(sequence) is not int or not -_INT_RANGE <= sequence < _INT_RANGE):
        return None, f"its sequence is {str(sequence)[:40]!r}, not an integer"
    return message, ""


def metric_problem(data: str) -> str:
    """Why `data` is no metric message the readers can show, or "" when it is one."""
    return checked(data)[1]


def metric_message(data: str, where: str, trial_id: str = "") -> dict[str, object] | None:
    """The stored message `data` as a dict, or None (a warning, once per row and reader) when
    it is malformed: the row is skipped, the rest is served."""
    message, problem = checked(data)
    if message is None:
        key = (where, f"{trial_id}:{data[:200]}")
        if key not in _warned and len(_warned) < _MAX_WARNED:
            _warned.add(key)
            log.warning("%s: skipping a malformed stored metric of trial %s (%s)", where, trial_id or "?", problem)
    return message


def decode_metric_value(value: object) -> object:
    """Metric values travel JSON-encoded inside the metric JSON (NNI >= 1.4)."""
    if isinstance(value, str):
        try:
            return _loads(value)
        except (ValueError, RecursionError):
            return value
    return value


def metric_value(data: str, where: str, trial_id: str = "") -> object:
    """The decoded value of a stored metric message; None for a malformed row (skipped with a
    warning, never raised: one bad row must not take down a listing)."""
    message = metric_message(data, where, trial_id)
    return None if message is None else decode_metric_value(message.get("value"))


def metric_number(value: object) -> float | None:
    """NNI's metric rule: a number, or a dict whose "default" is a number."""
    if isinstance(value, dict):
        value = value.get("default")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class Sequences:
    """Numbers metrics as NNI's manager does, fed rows in arrival order: PERIODICAL ones
    0..n-1 per trial, every other kind keeps the `sequence` it reported (0 when none)."""

    __slots__ = ("periodical",)

    def __init__(self) -> None:
        self.periodical: dict[str, int] = {}  # trial -> PERIODICAL results numbered so far

    def number(self, trial_id: str, kind: str, message: Mapping[str, object]) -> int:
        if kind == "PERIODICAL":
            n = self.periodical.get(trial_id, 0)
            self.periodical[trial_id] = n + 1
            return n
        sequence = message.get("sequence")  # checked() lets only an integer (or none) through
        return sequence if isinstance(sequence, int) else 0


def numbered(rows: Iterable[tuple[str, str, str, int]], where: str) -> Iterator[tuple[str, str, dict[str, object], int, int]]:
    """Stored rows (trial, type, data, timestamp) in arrival order -> (trial, type, message,
    timestamp, sequence), NNI's MetricData: REQUEST_PARAMETER rows and malformed ones (with a
    warning) left out, PERIODICAL ones numbered. `checked` and `Sequences` inlined: a full dump
    is a million rows, and this loop is most of its time."""
    periodical: dict[str, int] = {}
    scan, low, high = _scan, -_INT_RANGE, _INT_RANGE
    for trial_id, kind, data, timestamp in rows:
        if kind == "REQUEST_PARAMETER":
            continue
        try:
            if len(data) > MAX_BYTES or "\\u" in data or data.count("[") + data.count("{") > MAX_DEPTH:
                raise ValueError  # metric_problem's quick test failed: the whole check decides
            message, end = scan(data, 0)
        except (StopIteration, ValueError, RecursionError, TypeError):
            message = None
        else:
            if end != len(data) or type(message) is not dict:
                message = None
            else:
                t, s = message.get("type"), message.get("sequence")
                if not ((t is None or type(t) is str) and (s is None or (type(s) is int and low <= s < high))):
                    message = None
        if message is None:  # anything unusual takes the whole check (and its warning)
            message = metric_message(data, where, trial_id)
            if message is None:
                continue
        if kind == "PERIODICAL":
            sequence = periodical.get(trial_id, 0)
            periodical[trial_id] = sequence + 1
        else:
            sequence = int(message.get("sequence") or 0)
        yield trial_id, kind, message, timestamp, sequence
