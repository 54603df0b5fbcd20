"""Nothing transient fails a trial: API-server restarts are waited out, a pod deleted while the
watch was down is noticed at the re-list, and an environment whose object makes no pods (operator
down, quota) says why and fails after environmentStartTimeout. (429 / 5xx storms while trials run
and on a job's creation, every job platform alike: tests/platforms/test_job_rest_faults.py.)"""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from nni_manager.service import create_training_service
from tests.support.kube.harness import IMAGE, config, pods_service
from tests.support.manager.helpers import form, until, wait_status

NS = "default"


def pytorch_service(**extra: Any) -> dict[str, Any]:
    return {"platform": "kubeflow", "operator": "pytorch-operator", "apiVersion": "v1", "reuseMode": False,
            "master": {"replicas": 1, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
                       "dockerImage": IMAGE}, **extra}


async def pod_of(kube: Any, trial_id: str) -> str:
    def find() -> str | None:
        pods = kube.core().list_namespaced_pod(NS, label_selector=f"trialId={trial_id}").items
        return pods[0].metadata.name if pods else None
    return await until(find, 30, f"the pod of {trial_id}")


async def message_with(ts: Any, trial_id: str, text: str, timeout: float = 30) -> str:
    async def check() -> str | None:
        m = (await ts.get_trial_job(trial_id)).message
        return m if text in m else None
    return await until(check, timeout, f"a message with {text!r}")


def test_api_server_restart_mid_trial(kube, tmp_path: Path) -> None:
    cfg = config(kube, tmp_path, pods_service(reuseMode=True))
    release = tmp_path / "release"

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1, action="sleep", release=str(release)))
            await wait_status(ts, job.id, "RUNNING", timeout=60)
            kube.restart(down=2)
            await asyncio.sleep(3)
            release.write_text("go")
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message
            job = await ts.submit_trial_job(form(1, x=2))  # provisioning and the watch work after it
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status.value == "SUCCEEDED", done.message

    asyncio.run(body())


def test_pod_deleted_while_the_watch_was_down_ends_its_trial_at_the_relist(kube, tmp_path: Path) -> None:
    cfg = config(kube, tmp_path, pods_service(reuseMode=False))
    release = tmp_path / "release"

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1, action="sleep", release=str(release)))
            await wait_status(ts, job.id, "RUNNING", timeout=60)
            pod = await pod_of(kube, job.id)
            kube.restart(down=2, delete_pods=[(NS, pod)])
            # the agents' reconnect window is 300 s: only the re-list can end it this soon
            done = await wait_status(ts, job.id, "FAILED", "SYS_CANCELED", "USER_CANCELED", timeout=60)
            assert f"pod {pod} was deleted" in done.message, done.message

    asyncio.run(body())


def test_operator_down_says_why_and_fails_after_environment_start_timeout(kube_factory, tmp_path: Path) -> None:
    kube = kube_factory(crd_groups=["kubeflow.org"])
    kube.set_operator("pytorchjob", running=False)
    cfg = config(kube, tmp_path, pytorch_service(environmentStartTimeout="6s"))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1))
            said = await message_with(ts, job.id, "has no pods yet")
            assert "no status from the Kubeflow training operator yet (is it running?)" in said, said
            assert (await ts.get_trial_job(job.id)).status.value == "WAITING"
            done = await wait_status(ts, job.id, "FAILED", "SYS_CANCELED", timeout=60)
            assert "environmentStartTimeout, 6 s" in done.message and "Kubeflow training operator" in done.message, \
                done.message

    asyncio.run(body())


def test_quota_refusal_is_the_waiting_message(kube_crd_ns, tmp_path: Path) -> None:
    kube = kube_crd_ns  # the quota is its namespace's own
    kube.core().create_namespaced_resource_quota(kube.namespace, {"metadata": {"name": "compute"}, "spec": {"hard": {"pods": "0"}}})
    cfg = config(kube, tmp_path, pytorch_service(environmentStartTimeout="8s"))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1))
            said = await message_with(ts, job.id, "exceeded quota")
            assert "FailedCreatePod: Error creating: pods" in said and "compute, requested: pods=1" in said, said
            done = await wait_status(ts, job.id, "FAILED", "SYS_CANCELED", timeout=60)
            assert "exceeded quota" in done.message and "environmentStartTimeout" in done.message, done.message

    asyncio.run(body())


def test_failed_mount_is_the_waiting_message(kube, tmp_path: Path) -> None:
    spec = {"volumes": [{"name": "creds", "secret": {"secretName": "not-created-yet"}}],
            "containers": [{"name": "trial", "volumeMounts": [{"name": "creds", "mountPath": "/creds"}]}]}
    cfg = config(kube, tmp_path, pods_service(reuseMode=False, podSpec=spec, environmentStartTimeout="6s"))

    async def body() -> None:
        async with create_training_service(cfg) as ts:
            job = await ts.submit_trial_job(form(0, x=1))
            said = await message_with(ts, job.id, "FailedMount")
            assert 'MountVolume.SetUp failed for volume "creds" : secret "not-created-yet" not found' in said, said
            done = await wait_status(ts, job.id, "FAILED", "SYS_CANCELED", timeout=60)
            assert "FailedMount" in done.message and "environmentStartTimeout, 6 s" in done.message, done.message

    asyncio.run(body())
