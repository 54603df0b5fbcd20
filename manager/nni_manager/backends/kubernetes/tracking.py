"""What the cluster says about an experiment's pods, as trial messages: each pod event from the
watch (watch.py) becomes its agent's status or end, and environments not all of whose pods run
are looked at every few seconds (object conditions, and the Warning events and the cluster
autoscaler's words the event watch delivered: starting.py), failing at once when no node group
can hold them (jobs.py's start deadline, `environmentStartTimeout`, fails the others in these words).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from nni_manager.backends.base import BackendContext
from nni_manager.backends.kubernetes import starting
from nni_manager.backends.kubernetes.config import KubeConfig
from nni_manager.backends.kubernetes.starting import Events
from nni_manager.backends.kubernetes.watch import STUCK_REASONS, describe_pod

log = logging.getLogger(__name__)

Client = Callable[[], Awaitable[tuple[Any, Any, Any]]]  # () -> (ApiClient, CoreV1Api, CustomObjectsApi)


@dataclass
class Platform:
    """What tracking needs to know of the platform."""

    kube: KubeConfig  # read when used: the namespace may come from the kubeconfig, found at start
    stuck_timeout: float  # an image pull or crash loop stuck this long fails the pod's agent
    custom: tuple[str, str, str, str] | None  # the main object (group, version, plural, kind); None: a pod
    operator_name: str
    object_name: Callable[[str], str]  # env id -> its main object's name
    member_names: Callable[[str], list[tuple[str, str, int]]]  # env id -> (pod name, role, index)
    agent_of_pod: Callable[[dict[str, Any]], str]

    @property
    def namespace(self) -> str:
        return self.kube.namespace


@dataclass
class PodTracker:
    platform: Platform
    ctx: BackendContext | None = None
    fit_note: str = ""  # a request no present node holds (nodes.too_big): said while its pods wait
    starting: set[str] = field(default_factory=set)  # env ids provisioned, until all their pods run
    pod_states: dict[str, str] = field(default_factory=dict)  # pod name -> describe_pod state (or "gone")
    events: Events = field(default_factory=Events)  # fed by the event watch (watch.watch_events)
    warnings: dict[str, list[str]] = field(default_factory=dict)  # object or pod name -> its newest Warning events
    last_words: dict[str, str] = field(default_factory=dict)  # pod name -> what its last event said
    stuck_since: dict[str, float] = field(default_factory=dict)

    async def check_starts(self, client: Client, interval: float) -> None:
        """Every `interval`: for environments not all of whose pods run, say why in the cluster's
        words (jobs.py fails them after environmentStartTimeout, in these words)."""
        while True:
            await asyncio.sleep(interval)
            try:
                await self.check_starts_once((await client())[2])
            except asyncio.CancelledError:
                raise
            except Exception as e:  # the API is retried below us; anything else must not stop the checks
                log.warning("checking environments that have not started: %s", e)

    async def check_starts_once(self, custom: Any) -> None:
        ctx, p = self.ctx, self.platform
        if ctx is None or not self.starting:
            return
        self.warnings, refusals = self.events.warnings(), self.events.refusals()  # what the event watch saw
        for env_id in list(self.starting):
            pods = [n for n, _, _ in p.member_names(env_id)]
            states = {n: self.pod_states.get(n) for n in pods}
            if all(s in ("running", "succeeded", "failed", "oom", "gone") for s in states.values()):
                self.starting.discard(env_id)  # started (or over: the pod events said so)
                continue
            words: dict[str, str] = {}
            if not any(states.values()) and p.custom is not None:  # the operator has made no pod
                group, version, plural, kind = p.custom
                name = p.object_name(env_id)
                try:
                    obj = await custom.get_namespaced_custom_object(group, version, p.namespace, plural, name)
                except Exception as e:
                    obj = None if getattr(e, "status", None) == 404 else {}
                said = starting.object_words(kind, name, obj, self.warnings.get(name, []), p.operator_name)
                words = {n: said for n in pods}
            else:
                for n, state in states.items():
                    if state in (None, "waiting"):
                        base = self.last_words.get(n) or f"pod {n} has not started"
                        extra = [w for w in self.warnings.get(n, []) if w not in base]
                        if self.fit_note and "FailedScheduling" in base:
                            extra.append(self.fit_note)
                        words[n] = "; ".join([base, *extra])
            refused = [n for n in words if n in refusals]
            if refused:  # no node group's node would ever hold it: waiting cannot help
                self.starting.discard(env_id)
                why = self.last_words.get(refused[0]) or f"pod {refused[0]} has not started"
                for n in pods:
                    ctx.agent_failed(n, f"{why}; the cluster autoscaler cannot add a node that holds it "
                                        f"(NotTriggerScaleUp: {refusals[refused[0]]}): lower cpuNumber / memorySize / "
                                        "gpuNumber, fix podSpec.nodeSelector, or add a node group that fits", failed=True)
                continue
            for n, said in words.items():
                ctx.agent_status(n, said)

    def pod_event(self, kind: str, pod: dict[str, Any]) -> None:
        """One event of the pod watch: its agent's status, or its end."""
        ctx = self.ctx
        if ctx is None:
            return
        pod_name = pod.get("metadata", {}).get("name", "")
        name = self.platform.agent_of_pod(pod)
        if kind == "DELETED":
            state, words = "gone", f"pod {pod_name} was deleted"
        else:
            state, words = describe_pod(pod)
        self.pod_states[name] = state
        self.last_words[name] = words
        if state == "waiting" and self.warnings.get(name):  # FailedMount, ... (from the start checks)
            extra = "; ".join(w for w in self.warnings[name] if w not in words)
            words += f"; {extra}" if extra else ""
        if state == "waiting":
            since = self.stuck_since.setdefault(name, time.monotonic()) if any(
                r in words for r in STUCK_REASONS) else None
            stuck = self.platform.stuck_timeout
            if since is not None and time.monotonic() - since > stuck:
                ctx.agent_failed(name, f"{words} (for more than {stuck:g} s)", failed=True)
                return
            ctx.agent_status(name, words)
        elif state == "running":
            self.stuck_since.pop(name, None)
            ctx.agent_status(name, words)
        else:  # the pod is over: expected when its environment was released or its one trial ended
            self.stuck_since.pop(name, None)
            if state != "succeeded" or kind == "DELETED":
                ctx.agent_failed(name, words, failed=state in ("oom", "failed") and kind != "DELETED")
            else:
                ctx.agent_failed(name, words)
