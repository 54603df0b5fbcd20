"""NNI metric messages as every reader needs them: a JSON object whose `type` is text and whose
`sequence` is an integer.

A metric comes from trial code through an agent, so nothing about it can be assumed. One
message with `"sequence": "x"` once made every WebUI endpoint and `nni-manager view` answer 500
for good. So the core refuses such a message at ingest, and readers of stored rows (which may
predate the check, or come from a copied store) skip a bad row with a warning instead of failing.
"""
from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)

_INT_RANGE = 1 << 63  # SQLite's INTEGER
_MAX_WARNED = 1024  # distinct bad rows warned about per process; readers re-read rows every poll
_warned: set[tuple[str, str]] = set()


def _checked(data: str) -> tuple[dict[str, Any] | None, str]:
    try:
        message = json.loads(data)
    except (ValueError, TypeError, RecursionError):
        return None, "not JSON"
    if not isinstance(message, dict):
        return None, f"a JSON {type(message).__name__}, not an object"
    kind = message.get("type")
    if kind is not None and not isinstance(kind, str):
        return None, f"its type is {kind!r}, not text"
    sequence = message.get("sequence")
    if sequence is not None and (isinstance(sequence, bool) or not isinstance(sequence, int)
                                 or not -_INT_RANGE <= sequence < _INT_RANGE):
        return None, f"its sequence is {str(sequence)[:40]!r}, not an integer"
    return message, ""


def metric_problem(data: str) -> str:
    """Why `data` is no metric message the readers can show, or "" when it is one."""
    return _checked(data)[1]


def metric_message(data: str, where: str, trial_id: str = "") -> dict[str, Any] | None:
    """The stored message `data` as a dict, or None (a warning, once per row and reader) when
    it is malformed: the row is skipped, the rest is served."""
    message, problem = _checked(data)
    if message is None:
        key = (where, f"{trial_id}:{data[:200]}")
        if key not in _warned and len(_warned) < _MAX_WARNED:
            _warned.add(key)
            log.warning("%s: skipping a malformed stored metric of trial %s (%s)", where, trial_id or "?", problem)
    return message
