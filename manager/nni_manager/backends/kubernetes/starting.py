"""Why an environment has no running pod yet, in the cluster's words.

An operator that is down, a ResourceQuota, an admission webhook or Pod Security refusing the
operator's pods, a volume that cannot mount: none of them fails a call we make; the cluster says
so only in the object's status and in Warning events. These words become the WAITING message of
the environment's trials, and the environment fails after `environmentStartTimeout`.

On an autoscaled cluster (node groups at minimum 0, Karpenter, GKE Autopilot) a pod no existing node
holds is the normal way a GPU node gets made: it waits, with the scheduler's reason and the cluster
autoscaler's `TriggeredScaleUp`, and fails early only on the autoscaler's definite "cannot"
(`NotTriggerScaleUp` for a pod no node group's node would hold).
"""
from __future__ import annotations

from typing import Any

MAX_WARNINGS = 2  # the newest distinct Warning events shown per object
# the cluster autoscaler's words on a pending pod (Normal events, source cluster-autoscaler)
AUTOSCALER = "cluster-autoscaler"
SCALE_UP, NO_SCALE_UP = "TriggeredScaleUp", "NotTriggerScaleUp"
# a NotTriggerScaleUp reason that may pass (a group at its maximum, a failed scale-up's backoff, a
# cluster-wide limit, a group not ready): not a definite "cannot"
PASSING = ("max node group size reached", "max cluster", "backoff", "not ready", "limit reached")


def _stamp(ev: dict[str, Any]) -> str:
    return str(ev.get("lastTimestamp") or ev.get("eventTime") or ev.get("firstTimestamp") or "")


def _shown(ev: dict[str, Any]) -> bool:
    return ev.get("type") == "Warning" or ((ev.get("source") or {}).get("component") == AUTOSCALER
                                           and ev.get("reason") in (SCALE_UP, NO_SCALE_UP))


def autoscaler_refusals(events: list[dict[str, Any]]) -> dict[str, str]:
    """involvedObject.name -> the cluster autoscaler's message where its newest word on the object
    is a NotTriggerScaleUp that no waiting changes: no node group's node would ever hold the pod
    (too small for its requests, not matching its nodeSelector)."""
    newest: dict[str, tuple[str, dict[str, Any]]] = {}
    for ev in events:
        if (ev.get("source") or {}).get("component") != AUTOSCALER or ev.get("reason") not in (SCALE_UP, NO_SCALE_UP):
            continue
        name = (ev.get("involvedObject") or {}).get("name", "")
        if name not in newest or _stamp(ev) >= newest[name][0]:
            newest[name] = (_stamp(ev), ev)
    out = {}
    for name, (_, ev) in newest.items():
        message = (ev.get("message") or "").strip()
        if ev.get("reason") == NO_SCALE_UP and not any(p in message for p in PASSING):
            out[name] = message
    return out


def warnings_by_object(events: list[dict[str, Any]]) -> dict[str, list[str]]:
    """involvedObject.name -> "Reason: message" of its Warning events and the cluster autoscaler's
    scale-up words, newest last, distinct."""
    out: dict[str, list[tuple[str, str]]] = {}
    for ev in events:
        if not _shown(ev):
            continue
        name = (ev.get("involvedObject") or {}).get("name", "")
        out.setdefault(name, []).append((_stamp(ev), f"{ev.get('reason', 'Warning')}: {(ev.get('message') or '').strip()}"))
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


class Events:
    """The namespace's events that explain a wait (Warning events, the cluster autoscaler's words),
    by uid, as the event watch (watch.watch_events) delivers them: the start checks read them
    here and make no call for them. A re-listed event replaces itself: nothing is said twice."""

    def __init__(self) -> None:
        self.by_uid: dict[str, dict[str, Any]] = {}

    def seen(self, kind: str, event: dict[str, Any]) -> None:
        uid = str((event.get("metadata") or {}).get("uid") or (event.get("metadata") or {}).get("name", ""))
        if kind == "DELETED" or not _shown(event):  # an event may only expire (TTL): forget it then
            self.by_uid.pop(uid, None)
        else:
            self.by_uid[uid] = event

    def warnings(self) -> dict[str, list[str]]:
        return warnings_by_object(list(self.by_uid.values()))

    def refusals(self) -> dict[str, str]:
        return autoscaler_refusals(list(self.by_uid.values()))
