"""Why an environment has no running pod yet, in the cluster's words.

An operator that is down, a ResourceQuota, an admission webhook or Pod Security refusing the
operator's pods, a volume that cannot mount: none of them fails a call we make; the cluster says
so only in the object's status and in Warning events. These words become the WAITING message of
the environment's trials, and the environment fails after `environmentStartTimeout`.
"""
from __future__ import annotations

from typing import Any

MAX_WARNINGS = 2  # the newest distinct Warning events shown per object


def warnings_by_object(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """involvedObject.name -> "Reason: message" of its Warning events, newest last, distinct."""
    out: dict[str, list[tuple[str, str]]] = {}
    for ev in events:
        if ev.get("type") != "Warning":
            continue
        name = (ev.get("involvedObject") or {}).get("name", "")
        stamp = ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp") or ""
        out.setdefault(name, []).append((str(stamp), f"{ev.get('reason', 'Warning')}: {(ev.get('message') or '').strip()}"))
    result: dict[str, list[str]] = {}
    for name, items in out.items():
        words: list[str] = []
        for _, text in sorted(items, key=lambda i: i[0]):
            if text in words:
                words.remove(text)
            words.append(text)
        result[name] = words[-MAX_WARNINGS:]
    return result


def object_words(kind: str, name: str, obj: dict[str, Any] | None, warnings: list[str], operator: str) -> str:
    """An object whose operator has made none of its pods: its conditions and Warning events."""
    if obj is None:
        return f"{kind} {name} is gone"
    status = obj.get("status") or {}
    parts: list[str] = []
    conditions = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
    if conditions:
        last = conditions[-1]
        parts.append(f"{last.get('type')}: {last.get('message') or last.get('reason') or ''}".rstrip(": "))
    elif status.get("state"):  # FrameworkController
        parts.append(f"state {status['state']}")
    elif not warnings:
        parts.append(f"no status from the {operator} yet (is it running?)")
    parts += warnings
    return f"{kind} {name} has no pods yet: " + "; ".join(parts)
