"""Operator-platform (Kubeflow, FrameworkController) experiment configs and a trial that reports per replica."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import psutil

from nni_manager.loader import load_config
from tests.support.kube.fixtures import namespace_of
from tests.support.manager.helpers import until
from tests.support.bounded import run_bounded


PY = "nni-test/python:3.11"


# Every replica prints what the operator gave it, reports one metric naming itself, then does what
# the parameters say for its replica ("worker-1") or role ("ps"): run forever, fail (exit 3), linger.
ROLE_TRIAL = r'''
import json, os, sys, time
from nni_agent import get_next_parameter, report_intermediate_result
p = get_next_parameter()
role, index = os.environ["NNI_TRIAL_ROLE"], os.environ["NNI_TRIAL_ROLE_INDEX"]
me = f"{role}-{index}"
keys = ("TF_CONFIG", "NNI_TRIAL_ROLE", "NNI_TRIAL_ROLE_INDEX", "MASTER_ADDR", "RANK", "WORLD_SIZE",
        "FB_WORKER_IPS", "FB_PS_IPS", "NNI_TRIAL_JOB_ID")
print("SEEN " + json.dumps({**{k: os.environ.get(k) for k in keys}, "pid": os.getpid()}), flush=True)
report_intermediate_result({"default": 1, "replica": me})
if me in p.get("forever", []) or role in p.get("forever", []):
    while True:
        time.sleep(0.1)
time.sleep(p.get("linger", {}).get(me, 0))
if me in p.get("fail", []):
    print("replica failing on purpose", file=sys.stderr, flush=True)
    sys.exit(3)
'''


def role(replicas: int, **extra: Any) -> dict[str, Any]:
    return {"replicas": replicas, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
            "dockerImage": PY, **extra}


def task_role(name: str, number: int, min_failed: int, min_succeed: int) -> dict[str, Any]:
    return {"name": name, "taskNumber": number, "command": "python3 trial.py", "cpuNumber": 0.5,
            "memorySize": "256mb", "gpuNumber": 0, "dockerImage": PY,
            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": min_failed, "minSucceedTaskCount": min_succeed}}


def experiment(kube: Any, tmp_path: Path, platform: str, *, concurrency: int = 1,
               manager_ip: str | None = "127.0.0.1", **ts: Any):
    """manager_ip: pods on the emulator's host network dial the hub there; None: the hub tunnel."""
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(ROLE_TRIAL)
    return load_config({
        **({"nniManagerIp": manager_ip} if manager_ip else {}),
        "trialCodeDirectory": str(code), "trialConcurrency": concurrency,
        "experimentWorkingDirectory": str(tmp_path / "exps"), "trialGracePeriod": 2,
        "trainingService": {"platform": platform, "kubeConfig": str(kube.kubeconfig),
                            **({"namespace": kube.namespace} if getattr(kube, "namespace", None) else {}), **ts},
    })


async def replica_views(ts: Any, trial_id: str, replicas: list[str]) -> dict[str, dict[str, Any]]:
    """What each replica printed (its SEEN line), from the manager's per-replica log."""
    base = ts.experiment_dir / "trials" / trial_id / "replicas"
    views: dict[str, dict[str, Any]] = {}

    def read_all() -> bool:
        for r in replicas:
            f = base / r / "trial.stdout"
            if r not in views and f.is_file():
                for line in f.read_text().splitlines():
                    if line.startswith("SEEN "):
                        views[r] = json.loads(line[5:])
        return len(views) == len(replicas)

    await until(read_all, 30, f"the SEEN line of every replica of {trial_id} in {base}")
    assert sorted(p.name for p in base.iterdir()) == sorted(replicas)
    return views


# ----------------------------------------------------------------------------- checks the operator tests share

def run_async(test: Any) -> Any:
    """Run an async test body on its own loop (with an overall limit)."""
    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run_bounded(test(*args, **kwargs), 150)

    return wrapper


def custom_api(kube: Any):
    from kubernetes import client

    return client.CustomObjectsApi(kube.api_client())


async def object_of(kube: Any, plural: str, group_version: tuple[str, str], trial_id: str) -> str:
    """The name of the one object made for this trial (non-reuse: labelled with its trialId)."""
    api = custom_api(kube)

    def find() -> str | None:
        items = api.list_namespaced_custom_object(*group_version, namespace_of(kube), plural, label_selector=f"trialId={trial_id}")["items"]
        assert len(items) <= 1, [o["metadata"]["name"] for o in items]
        return items[0]["metadata"]["name"] if items else None

    return await until(find, 30, f"the {plural} object of trial {trial_id}")


async def gone(kube: Any, plural: str, group_version: tuple[str, str], name: str) -> None:
    from kubernetes.client.exceptions import ApiException

    api = custom_api(kube)

    def absent() -> bool:
        try:
            api.get_namespaced_custom_object(*group_version, namespace_of(kube), plural, name)
        except ApiException as e:
            return e.status == 404
        return False

    await until(absent, 30, f"{plural} {name} to be deleted")


def last_condition(kube: Any, plural: str, name: str) -> dict[str, Any]:
    """The newest condition of the object's last status (the operator's verdict)."""
    statuses = [s for s in kube.history(plural, namespace_of(kube), name) if (s or {}).get("conditions")]
    assert statuses, f"{plural} {name} never had conditions"
    return statuses[-1]["conditions"][-1]


def metric_replicas(metrics: list[Any], trial_id: str) -> list[str]:
    out = []
    for m in metrics:
        if m.id == trial_id:
            record = json.loads(m.data)
            out.append(json.loads(record["value"])["replica"])
    return out


async def all_metrics(metrics: list[Any], trial_id: str, replicas: list[str]) -> None:
    await until(lambda: sorted(set(metric_replicas(metrics, trial_id))) == sorted(replicas), 30,
                f"a metric from every replica of {trial_id}")
    assert sorted(metric_replicas(metrics, trial_id)) == sorted(replicas)  # once each


async def stopped(pid: int) -> None:
    def dead() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    await until(dead, 30, f"replica process {pid} to be stopped")


async def cancel_stops_every_replica(ts: Any, kube: Any, plural: str, group_version: tuple[str, str], job_id: str,
                                     replicas: list[str]) -> None:
    """A running trial cancelled: USER_CANCELED, every replica's process stopped, its object deleted."""
    from nni_manager.types import TrialJobStatus
    from tests.support.manager.helpers import wait_status

    await wait_status(ts, job_id, "RUNNING", timeout=60)
    name = await object_of(kube, plural, group_version, job_id)
    views = await replica_views(ts, job_id, replicas)
    await ts.cancel_trial_job(job_id)
    done = await wait_status(ts, job_id, "USER_CANCELED", "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=60)
    assert done.status == TrialJobStatus.USER_CANCELED, done.message
    for seen in views.values():
        await stopped(seen["pid"])
    await gone(kube, plural, group_version, name)


def nni_manager_cli(*args: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "nni_manager", *args], capture_output=True, text=True, timeout=60)


# ----------------------------------------------------------------------------- Kubeflow Trainer v2

TRAINER = ("trainer.kubeflow.org", "v1alpha1")
# Kubeflow Trainer v2.3.0's manifests/base/runtimes/torch_distributed.yaml, in the test image
TORCH_DISTRIBUTED = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [{
        "name": "node", "template": {
            "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "nni-test/python:3.11"}]}}}}}]}}},
}
