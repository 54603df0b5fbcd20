"""Why an environment waits comes from a watch of the namespace's events (kubernetes/watch.py
`watch_events`), not from listing them every 2 s: the API server serves one list, then a watch
with bookmarks that resumes from the last resourceVersion when its stream ends, and lists again
only after 410 Gone. Every Warning reaches the waiting trial's message, once."""
from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from nni_manager.service import create_training_service
from tests.support.kube.harness import config, pods_service
from tests.support.kube.rbac_user import USER_TOKEN, bind_alice, doc_role
from tests.support.manager.helpers import form, message_with, wait_status

NS = "default"
# no node has this label: the pod stays Pending (FailedScheduling) until the test ends
PENDING = pods_service(reuseMode=False, environmentStartTimeout="120s", podSpec={"nodeSelector": {"pool": "absent"}})


def warn(kube: Any, pod: str, reason: str, message: str) -> None:
    """A Warning event on the pod, as a kubelet or controller records it."""
    core = kube.core()
    uid = core.read_namespaced_pod(pod, NS).metadata.uid
    core.create_namespaced_event(NS, {
        "metadata": {"generateName": f"{pod}."}, "type": "Warning", "reason": reason, "message": message,
        "involvedObject": {"kind": "Pod", "apiVersion": "v1", "namespace": NS, "name": pod, "uid": uid},
        "source": {"component": "kubelet"}, "count": 1,
        "firstTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "lastTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})


async def pending_pod(kube: Any, ts: Any) -> tuple[str, str]:
    """A trial whose pod waits for a node: (trial id, pod name)."""
    t = await ts.submit_trial_job(form(0))
    await message_with(ts, t.id, "FailedScheduling")
    (pod,) = [p.metadata.name for p in kube.core().list_namespaced_pod(NS, label_selector="envId").items]
    return t.id, pod


def test_a_waiting_pod_shows_each_warning_from_one_list_and_a_watch(kube, tmp_path: Path) -> None:
    cfg = config(kube, tmp_path, PENDING)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            trial, pod = await pending_pod(kube, ts)
            lists, began = kube.requests("list", "events", NS), time.monotonic()
            warn(kube, pod, "FailedMount", 'MountVolume.SetUp failed for volume "data" : configmap "settings" not found')
            said = await message_with(ts, trial, "FailedScheduling", 'configmap "settings" not found')
            assert said.count('configmap "settings" not found') == 1, said
            while time.monotonic() - began < 10:  # five of the old 2 s polls (ten event lists)
                await asyncio.sleep(1)
            assert (await ts.get_trial_job(trial)).status.value == "WAITING"
            assert kube.requests("list", "events", NS) - lists == 0  # the watch delivered it
            assert kube.requests("watch", "events", NS) >= 1

    asyncio.run(main())


def test_a_broken_or_expired_event_watch_resumes_and_each_warning_arrives_once(kube, tmp_path: Path) -> None:
    cfg = config(kube, tmp_path, PENDING)

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            trial, pod = await pending_pod(kube, ts)
            lists, watches = kube.requests("list", "events", NS), kube.requests("watch", "events", NS)
            # the stream ends (an API server going away): watched again from the last version, not listed
            assert kube.end_watches("events") >= 1
            warn(kube, pod, "FailedMount", 'configmap "first" not found')
            said = await message_with(ts, trial, 'configmap "first" not found')
            assert said.count('configmap "first" not found') == 1, said
            assert kube.requests("list", "events", NS) == lists
            # compacted away (410 Gone in the stream and on resume): listed once more, nothing said twice
            assert kube.end_watches("events", expire=True) >= 1
            warn(kube, pod, "FailedAttachVolume", 'volume "second" is not attached')
            said = await message_with(ts, trial, 'configmap "first" not found', 'volume "second" is not attached')
            assert said.count('configmap "first" not found') == 1 and said.count('"second"') == 1, said
            assert kube.requests("list", "events", NS) == lists + 1
            assert kube.requests("watch", "events", NS) >= watches + 2

    asyncio.run(main())


def test_a_role_without_watch_on_events_still_runs_an_experiment(kube_factory, tmp_path: Path) -> None:
    """Events are a courtesy: without `watch` on them the trial runs, its waits unexplained."""
    kube = kube_factory(tokens=[f"{USER_TOKEN}=alice:rbac"])
    role = doc_role()
    for rule in role["rules"]:
        if rule["resources"] == ["events"]:
            rule["verbs"] = [v for v in rule["verbs"] if v != "watch"]
    cfg = config(kube, tmp_path, {**pods_service(reuseMode=False), "kubeConfig": str(bind_alice(kube, role))})

    async def main() -> None:
        async with create_training_service(cfg) as ts:
            t = await ts.submit_trial_job(form(0, x=7))
            done = await wait_status(ts, t.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=120)
            assert done.status.value == "SUCCEEDED", done.message

    asyncio.run(main())
    assert kube.requests("watch", "events", NS) == 0  # refused by RBAC: never served
