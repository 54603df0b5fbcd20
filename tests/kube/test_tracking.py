"""tracking.py without a cluster: the watch's pod events and the start checks as trial messages,
fed the objects the API server sends (the emulator tests run the same code against the cluster:
test_pods_platform.py, test_autoscaled.py, test_image_pull.py)."""
from __future__ import annotations

import asyncio
from typing import Any

from nni_manager.backends.kubernetes.config import KubeConfig
from nni_manager.backends.kubernetes.tracking import Platform, PodTracker
from tests.support.kube.backend_ctx import Ctx


def _tracker(ctx: Ctx, stuck: float = 300.0) -> PodTracker:
    platform = Platform(KubeConfig(namespace="ns1"), stuck, None,
                        "operator", lambda env: f"obj-{env}", lambda env: [(f"obj-{env}", "", 0)],
                        lambda pod: pod["metadata"]["name"])
    return PodTracker(platform, ctx)  # type: ignore[arg-type]


def _pod(name: str, phase: str, waiting: str = "", exit_code: int | None = None, reason: str = "") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase}
    if waiting:
        status["containerStatuses"] = [{"name": "trial", "state": {"waiting": {"reason": waiting, "message": "m"}}}]
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "trial", "state": {"terminated": {"exitCode": exit_code,
                                                                                  "reason": reason}}}]
    return {"metadata": {"name": name}, "status": status}


def test_pod_events_become_status_and_ends() -> None:
    ctx = Ctx()
    t = _tracker(ctx)
    t.pod_event("ADDED", _pod("p1", "Running"))
    assert ctx.status["p1"] == "waiting for the agent in pod p1 to connect" and not ctx.failed
    t.pod_event("MODIFIED", _pod("p1", "Failed", exit_code=137, reason="OOMKilled"))
    [(agent, words, failed)] = ctx.failed
    assert agent == "p1" and failed and "OOMKilled (exit 137)" in words and "raise memorySize" in words
    t.pod_event("MODIFIED", _pod("p2", "Succeeded"))
    assert ctx.failed[-1] == ("p2", "pod p2 ended (Succeeded)", False)  # its one trial is over: not a failure
    t.pod_event("DELETED", _pod("p3", "Running"))
    assert ctx.failed[-1] == ("p3", "pod p3 was deleted", False)
    assert t.pod_states == {"p1": "oom", "p2": "succeeded", "p3": "gone"}


def test_a_pod_stuck_pulling_fails_after_the_stuck_timeout_only() -> None:
    ctx = Ctx()
    t = _tracker(ctx, stuck=-1.0)  # any stuck time is too long
    t.pod_event("ADDED", _pod("p1", "Pending", waiting="ContainerCreating"))  # not stuck: starting
    assert not ctx.failed and ctx.status["p1"] == "pod p1 is starting (Pending)"
    t.pod_event("MODIFIED", _pod("p1", "Pending", waiting="ImagePullBackOff"))
    [(agent, words, failed)] = ctx.failed
    assert agent == "p1" and failed and words == "pod p1: ImagePullBackOff: m (for more than -1 s)"
    t = _tracker(ctx := Ctx(), stuck=300.0)
    t.pod_event("MODIFIED", _pod("p1", "Pending", waiting="ImagePullBackOff"))
    assert not ctx.failed and ctx.status["p1"] == "pod p1: ImagePullBackOff: m"


def _event(reason: str, message: str, kind: str = "Warning", component: str = "default-scheduler") -> dict[str, Any]:
    return {"metadata": {"uid": f"uid-{reason}"}, "type": kind, "reason": reason, "message": message, "source": {"component": component},
            "involvedObject": {"name": "obj-env1"}, "lastTimestamp": "2026-01-01T00:00:00Z"}


def test_start_checks_say_why_and_fail_on_a_definite_no_from_the_autoscaler() -> None:
    ctx = Ctx()
    t = _tracker(ctx)
    t.starting.add("env1")
    pending = _pod("obj-env1", "Pending")
    pending["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                        "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]
    t.pod_event("ADDED", pending)
    t.fit_note = "no node has 8 GPUs"
    t.events.seen("ADDED", _event("FailedScheduling", "0/1 nodes are available"))  # as the event watch delivers it
    asyncio.run(t.check_starts_once(None))
    said = ctx.status["obj-env1"]
    assert said.startswith("pod obj-env1: FailedScheduling: 0/1 nodes") and said.endswith("no node has 8 GPUs")
    assert not ctx.failed and "env1" in t.starting
    t.events.seen("ADDED", _event("NotTriggerScaleUp", "pod didn't trigger scale-up: 1 Insufficient nvidia.com/gpu",
                                  "Normal", "cluster-autoscaler"))
    asyncio.run(t.check_starts_once(None))
    [(agent, words, failed)] = ctx.failed
    assert agent == "obj-env1" and failed and "NotTriggerScaleUp: pod didn't trigger scale-up" in words
    assert "env1" not in t.starting


def test_the_event_watch_keeps_each_event_once_by_uid() -> None:
    """A re-listed event (after 410 Gone) replaces itself; a Normal event that explains nothing is
    not kept; an expired (DELETED) one is forgotten."""
    t = _tracker(Ctx())
    first = _event("FailedMount", "secret obj-env1-nni not found")
    t.events.seen("ADDED", first)
    t.events.seen("MODIFIED", {**first, "count": 2})  # the same event again, at the re-list
    t.events.seen("ADDED", {**_event("Pulled", "image pulled", "Normal", "kubelet"), "metadata": {"uid": "u2"}})
    assert t.events.warnings() == {"obj-env1": ["FailedMount: secret obj-env1-nni not found"]}
    assert list(t.events.by_uid) == ["uid-FailedMount"]
    t.events.seen("DELETED", first)
    assert t.events.warnings() == {}
