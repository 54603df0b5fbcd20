"""NNI_OUTPUT_DIR on the experiment's `storage` (nfs, pvc): checkpoints a trial writes are on the
storage, under NNI's layout <mount>/nni/<exp>/<trial>/output/<role>_output, after its pod is gone.
The emulator stands for an NFS export (and a claim) with one host directory every pod mounts,
kept after the pods, as the storage is."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

from nni_manager.loader import load_config
from nni_manager.service import create_training_service
from nni_manager.types import TrialJobStatus
from tests.support.kube.fixtures import namespace_of
from tests.support.manager.helpers import form, until, wait_status
from tests.support.bounded import run_bounded

PY = "nni-test/python:3.11"
NFS_SERVER = "nfs.example.org"  # not dialed: the emulator's kubelet backs the export with a directory
NFS_PATH = "/exports/nni"

CHECKPOINT_TRIAL = r'''
import os
from pathlib import Path
from nni_agent import get_next_parameter, report_final_result
get_next_parameter()
out = Path(os.environ["NNI_OUTPUT_DIR"])
(out / "checkpoint.pt").write_text(os.environ["NNI_TRIAL_JOB_ID"] + " " + os.environ.get("NNI_TRIAL_ROLE", ""))
report_final_result(1)
'''


def run_async(test: Any) -> Any:
    @functools.wraps(test)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return run_bounded(test(*args, **kwargs), 150)

    return wrapper


def experiment(kube: Any, tmp_path: Path, ts: dict[str, Any], concurrency: int = 1):
    code = tmp_path / "code"
    code.mkdir(exist_ok=True)
    (code / "trial.py").write_text(CHECKPOINT_TRIAL)
    return load_config({
        "nniManagerIp": "127.0.0.1", "trialCommand": "python3 trial.py",
        "trialCodeDirectory": str(code), "trialConcurrency": concurrency,
        "experimentWorkingDirectory": str(tmp_path / "exps"), "trialGracePeriod": 2,
        "trainingService": {"kubeConfig": str(kube.kubeconfig), **ts,
                            **({"namespace": kube.namespace} if getattr(kube, "namespace", None) else {})},
    })


def role(**extra: Any) -> dict[str, Any]:
    return {"replicas": 1, "command": "python3 trial.py", "cpuNumber": 0.5, "memorySize": "256mb",
            "dockerImage": PY, **extra}


NFS = {"storageType": "nfs", "server": NFS_SERVER, "path": NFS_PATH}


async def pods_gone(kube: Any, experiment_id: str) -> None:
    core = kube.core()
    await until(lambda: not core.list_namespaced_pod(namespace_of(kube), label_selector=f"expId={experiment_id}").items, 60,
                "the experiment's pods to be deleted")


async def run_trials(kube: Any, cfg: Any, count: int) -> tuple[str, list[str]]:
    async with create_training_service(cfg) as ts:
        jobs = [await ts.submit_trial_job(form(i)) for i in range(count)]
        for job in jobs:
            done = await wait_status(ts, job.id, "SUCCEEDED", "FAILED", "SYS_CANCELED", timeout=90)
            assert done.status == TrialJobStatus.SUCCEEDED, done.message
        exp = ts.experiment_id
    await pods_gone(kube, exp)
    return exp, [j.id for j in jobs]


@pytest.mark.parametrize("reuse", [False, True], ids=["per-trial", "reuse"])
@run_async
async def test_kubeflow_checkpoints_outlive_the_pods_on_nfs(kube_crd_ns, tmp_path, reuse):
    kube = kube_crd_ns
    cfg = experiment(kube, tmp_path, {"platform": "kubeflow", "operator": "tf-operator", "apiVersion": "v1",
                                      "reuseMode": reuse, "worker": role(), "storage": NFS})
    exp, trials = await run_trials(kube, cfg, 2)
    export = kube.state_dir / "nfs" / NFS_SERVER / NFS_PATH.lstrip("/")
    for trial in trials:
        ckpt = export / "nni" / exp / trial / "output" / "worker_output" / "checkpoint.pt"
        assert ckpt.read_text() == f"{trial} worker"


@run_async
async def test_frameworkcontroller_checkpoints_outlive_the_pods_on_a_claim(kube_crd_ns, tmp_path):
    kube = kube_crd_ns
    task = {"name": "worker", "taskNumber": 2, "command": "python3 trial.py", "cpuNumber": 0.5,
            "memorySize": "256mb", "gpuNumber": 0, "dockerImage": PY,
            "frameworkAttemptCompletionPolicy": {"minFailedTaskCount": 1, "minSucceedTaskCount": 2}}
    cfg = experiment(kube, tmp_path, {"platform": "frameworkcontroller", "reuseMode": False,
                                      "taskRoles": [task],
                                      "storage": {"storageType": "pvc", "claimName": "nni-outputs"}})
    exp, (trial,) = await run_trials(kube, cfg, 1)
    claim = kube.state_dir / "pvc" / namespace_of(kube) / "nni-outputs"
    for index in (0, 1):  # two replicas of one role: a folder each, no file written twice
        ckpt = claim / "nni" / exp / trial / "output" / f"worker_{index}_output" / "checkpoint.pt"
        assert ckpt.read_text() == f"{trial} worker"


@run_async
async def test_plain_pods_checkpoints_outlive_the_pod_on_nfs(kube, tmp_path):
    cfg = experiment(kube, tmp_path, {"platform": "kubernetes", "dockerImage": PY, "cpuNumber": 0.5,
                                      "memorySize": "256mb", "reuseMode": False, "storage": NFS})
    exp, (trial,) = await run_trials(kube, cfg, 1)
    ckpt = kube.state_dir / "nfs" / NFS_SERVER / NFS_PATH.lstrip("/") / "nni" / exp / trial / "output"
    assert (ckpt / "trial_output" / "checkpoint.pt").read_text() == f"{trial} "


@run_async
async def test_without_storage_outputs_stay_in_the_pod(kube, tmp_path):
    """No storage: nothing is written outside the pod's scratch (the emulator keeps no export)."""
    cfg = experiment(kube, tmp_path, {"platform": "kubernetes", "dockerImage": PY, "cpuNumber": 0.5,
                                      "memorySize": "256mb", "reuseMode": False})
    await run_trials(kube, cfg, 1)
    assert not (kube.state_dir / "nfs").exists() and not (kube.state_dir / "pvc").exists()
