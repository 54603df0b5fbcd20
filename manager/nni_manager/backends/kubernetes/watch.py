"""Following the experiment's pods: what the cluster says about each, in its own words."""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubernetes.aio.client import ApiClient

log = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 60
# Waiting reasons that mean the pod cannot start as things are (shown, and counted as failure
# after the backend's `start_timeout`).
STUCK_REASONS = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CreateContainerConfigError",
                 "CreateContainerError", "CrashLoopBackOff", "RunContainerError"}


def describe_pod(pod: dict[str, Any]) -> tuple[str, str]:
    """(state, words) of a pod: state is waiting | running | failed | oom | succeeded | gone;
    the words are the cluster's own (scheduler, kubelet, container termination message)."""
    name = pod.get("metadata", {}).get("name", "?")
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    containers = (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or [])
    if phase in ("Failed", "Succeeded") or pod.get("metadata", {}).get("deletionTimestamp"):
        if status.get("reason"):  # Evicted, NodeLost, Preempting ...: the system's doing, not the trial's
            return "gone", f"pod {name} {status['reason']}: {status.get('message', '')}".rstrip(": ")
        for cond in status.get("conditions") or []:  # node lost (PodGC), preempted, taint eviction
            if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
                return "gone", f"pod {name} {cond.get('reason', 'disrupted')}: {cond.get('message', '')}".rstrip(": ")
        for c in containers:
            term = (c.get("state") or {}).get("terminated")
            if term and term.get("exitCode", 0) != 0:
                reason = term.get("reason", "Error")
                words = f"pod {name} container {c.get('name')} {reason} (exit {term.get('exitCode')})"
                msg = (term.get("message") or "").strip()
                if reason == "OOMKilled":  # the message would be the agent's log tail: noise here
                    return "oom", words + ": the container used more memory than its limit (raise memorySize)"
                if msg:
                    words += ": " + msg.splitlines()[-1][-500:]
                return "failed", words
        if pod.get("metadata", {}).get("deletionTimestamp"):
            return "gone", f"pod {name} is being deleted"
        return ("succeeded" if phase == "Succeeded" else "failed"), f"pod {name} ended ({phase})"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return "waiting", f"pod {name}: {cond.get('reason') == 'Unschedulable' and 'FailedScheduling' or cond.get('reason')}: {cond.get('message', '')}"
    for c in containers:
        waiting = (c.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason") not in (None, "ContainerCreating", "PodInitializing"):
            return "waiting", f"pod {name}: {waiting['reason']}: {waiting.get('message', '')}".rstrip(": ")
    if phase == "Running":
        return "running", f"waiting for the agent in pod {name} to connect"
    return "waiting", f"pod {name} is starting ({phase})"


async def watch_pods(api: ApiClient, namespace: str, label_selector: str,
                     on_event: Callable[[str, dict[str, Any]], None]) -> None:
    """List, then watch from that resourceVersion, forever: `on_event(type, pod dict)` for every
    pod (listed ones as MODIFIED). After any gap (410 Gone, a broken stream, an API server
    restart) it lists again, and a pod known before that the list no longer has was deleted while
    nobody watched: it is reported DELETED then, not after the agents' reconnect window."""
    from kubernetes.aio import client, watch

    core = client.CoreV1Api(api)
    version, delay = "", 0.5
    known: dict[str, dict[str, Any]] = {}

    def seen(kind: str, raw: dict[str, Any]) -> None:
        name = raw.get("metadata", {}).get("name", "")
        if kind == "DELETED":
            known.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            known[name] = raw
        else:  # BOOKMARK
            return
        on_event(kind, raw)

    while True:
        try:
            if not version:
                listed = await core.list_namespaced_pod(namespace, label_selector=label_selector)
                present = set()
                for pod in listed.items:
                    raw = api.sanitize_for_serialization(pod)
                    present.add(raw.get("metadata", {}).get("name", ""))
                    seen("MODIFIED", raw)
                for name in [n for n in known if n not in present]:
                    log.info("pod %s vanished while the watch was down", name)
                    seen("DELETED", known[name])
                version = (listed.metadata.resource_version if listed.metadata else None) or ""
            async with watch.Watch().stream(core.list_namespaced_pod, namespace, label_selector=label_selector,
                                            resource_version=version, timeout_seconds=WATCH_TIMEOUT_S) as stream:
                async for event in stream:
                    raw = event.get("raw_object") or api.sanitize_for_serialization(event["object"])
                    if event["type"] == "ERROR":  # 410 Expired inside the stream
                        raise _Expired(raw.get("message", "watch expired"))
                    version = raw.get("metadata", {}).get("resourceVersion", version)
                    seen(event["type"], raw)
            delay = 0.5
        except asyncio.CancelledError:
            raise
        except Exception as e:
            if getattr(e, "status", None) != 410 and not isinstance(e, _Expired):
                log.warning("watching pods: %s", e)
            version = ""  # a gap: list again and reconcile
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10)


class _Expired(Exception):
    """The watch's resourceVersion is older than the server keeps (410 Gone as an ERROR event)."""
