"""Operator-platform (Kubeflow, FrameworkController) experiment configs and a trial that reports per replica."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from nni_manager.loader import load_config
from tests.support.manager.helpers import until


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
