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
    """The experiment's pods, forever (`follow`): a pod deleted while nobody watched is reported
    DELETED at the re-list, not after the agents' reconnect window."""
    from kubernetes.aio import client

    await follow(api, client.CoreV1Api(api).list_namespaced_pod, namespace, on_event, what="pods",
                 label_selector=label_selector)


async def watch_events(api: ApiClient, namespace: str, on_event: Callable[[str, dict[str, Any]], None]) -> None:
    """The namespace's events, forever (`follow`), by uid: why environments wait. A courtesy: a Role
    without list or watch on events runs, without the cluster's words on waiting trials."""
    from kubernetes.aio import client

    await follow(api, client.CoreV1Api(api).list_namespaced_event, namespace, on_event, what="events",
                 key=lambda raw: str(raw.get("metadata", {}).get("uid") or _name(raw)), courtesy=True)


def _name(raw: dict[str, Any]) -> str:
    return str(raw.get("metadata", {}).get("name", ""))


async def follow(api: ApiClient, list_fn: Callable[..., Any], namespace: str,
                 on_event: Callable[[str, dict[str, Any]], None], *, what: str,
                 key: Callable[[dict[str, Any]], str] = _name, courtesy: bool = False, **selectors: str) -> None:
    """List once, then watch from that resourceVersion with bookmarks, forever: `on_event(type,
    object dict)` for every object (listed ones as MODIFIED). A stream that ends or breaks is
    watched again from the last version seen (an object's or a bookmark's), so nothing is listed
    or reported twice; only when that version is gone (410 Gone) is it listed again, and an object
    known before that the list no longer has (by `key`) is reported DELETED. `courtesy`: a 403
    ends it with one line (a Role may leave out what is only a courtesy, like events)."""
    from kubernetes.aio import watch

    version, delay = "", 0.5
    known: dict[str, dict[str, Any]] = {}

    def seen(kind: str, raw: dict[str, Any]) -> None:
        if kind == "DELETED":
            known.pop(key(raw), None)
        elif kind in ("ADDED", "MODIFIED"):
            known[key(raw)] = raw
        else:  # BOOKMARK: only its resourceVersion counts
            return
        on_event(kind, raw)

    while True:
        try:
            if not version:
                listed = await list_fn(namespace, **selectors)
                present = set()
                for item in listed.items:
                    raw = api.sanitize_for_serialization(item)
                    present.add(key(raw))
                    seen("MODIFIED", raw)
                for k in [k for k in known if k not in present]:
                    log.info("%s %s vanished while the watch was down", what, _name(known[k]))
                    seen("DELETED", known[k])
                version = (listed.metadata.resource_version if listed.metadata else None) or ""
            async with watch.Watch().stream(list_fn, namespace, resource_version=version, allow_watch_bookmarks=True,
                                            timeout_seconds=WATCH_TIMEOUT_S, **selectors) as stream:
                async for event in stream:
                    raw = event.get("raw_object") or api.sanitize_for_serialization(event["object"])
                    version = raw.get("metadata", {}).get("resourceVersion") or version
                    seen(event["type"], raw)
            delay = 0.5
        except asyncio.CancelledError:
            raise
        except Exception as e:
            status = getattr(e, "status", None)
            if status == 403 and courtesy:
                log.info("not watching %s in namespace %s (%s): the Role does not grant list and watch on them",
                         what, namespace, getattr(e, "reason", None) or e)
                return
            if status == 410 or delay >= 4:  # the version is gone (or refused thrice): list again, reconcile
                version = ""
            if status != 410:  # a broken stream, an API server restart: watch again from the last version seen
                log.warning("watching %s: %s", what, e)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10)
